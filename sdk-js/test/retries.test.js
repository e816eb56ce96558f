// Retries are safe: writes carry an Idempotency-Key made once per call and are resent with the
// same key after a lost reply or a 503 (even one whose write landed), and the broker applies
// them once; calls without a key are not resent once they may have arrived.

import assert from 'node:assert/strict'
import { request as httpRequest, createServer as createHttpServer } from 'node:http'
import { connect, createServer } from 'node:net'
import { after, before, describe, test } from 'node:test'

import { ConnectionFailedError, UnavailableError } from 'memp-sdk'

import { admin, delay, namespace, rest, startServices, take, useServices } from './helpers.js'

const services = useServices()

/**
 * A TCP proxy to the broker that lets the first request through but drops its reply: the
 * write is applied, and the client sees the connection break.
 * @param {number} port the broker's
 */
async function replyDroppingProxy(port) {
  let connections = 0
  /** @type {Set<import('node:net').Socket>} */
  const sockets = new Set()
  const server = createServer((client) => {
    connections += 1
    sockets.add(client)
    const upstream = connect(port, '127.0.0.1')
    client.pipe(upstream)
    client.on('error', () => upstream.destroy())
    upstream.on('error', () => client.destroy())
    sockets.add(upstream)
    if (connections === 1) {
      upstream.once('data', () => {
        client.destroy()
        upstream.destroy()
      })
    } else {
      upstream.pipe(client)
    }
  })
  await new Promise((done) => server.listen(0, '127.0.0.1', () => done(null)))
  const address = server.address()
  return {
    url: `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`,
    connections: () => connections,
    close: () => new Promise((done) => {
      server.close(() => done(null))
      for (const socket of sockets) socket.destroy()
    }),
  }
}

/**
 * A fetch that records each request's method and headers, and each reply's status.
 * @param {{ method: string, url: string, key: string | null, status: number | null }[]} log
 * @returns {typeof fetch}
 */
function loggingFetch(log) {
  return async (input, init) => {
    const headers = new Headers(init?.headers)
    /** @type {{ method: string, url: string, key: string | null, status: number | null }} */
    const record = {
      method: init?.method ?? 'GET',
      url: String(input),
      key: headers.get('idempotency-key'),
      status: null,
    }
    log.push(record)
    const response = await fetch(input, init)
    record.status = response.status
    return response
  }
}

describe('a lost reply', () => {
  test('put is resent with the same Idempotency-Key and applied once', async () => {
    const proxy = await replyDroppingProxy(services.broker.port)
    try {
      /** @type {{ method: string, url: string, key: string | null, status: number | null }[]} */
      const log = []
      const broker = admin(proxy.url, namespace(), { fetch: loggingFetch(log) })
      const entry = await broker.memory.put('once', { n: 1 })
      assert.equal(entry.version, 1, 'the replayed reply is the first write')
      assert.equal(log.length, 2)
      assert.ok(log[0]?.key)
      assert.equal(log[0]?.key, log[1]?.key)
      assert.equal(proxy.connections(), 2)
      const history = await admin(services.url, broker.namespace ?? '').memory.history('once')
      assert.equal(history.length, 1, 'written once')
    } finally {
      await proxy.close()
    }
  })

  test('register is resent and creates one agent', async () => {
    const proxy = await replyDroppingProxy(services.broker.port)
    try {
      const ns = namespace()
      const broker = admin(proxy.url, ns)
      const agent = await broker.register({ name: 'retried', framework: 'test' })
      const listed = await rest(services.url, 'GET', `/v1/namespaces/${ns}/agents`)
      assert.deepEqual(listed.agents.map((/** @type {{id: string}} */ a) => a.id), [agent.id])
      assert.equal(await broker.memory.put('k', 1).then((e) => e.agentId), agent.id)
    } finally {
      await proxy.close()
    }
  })

  test('each call has its own Idempotency-Key', async () => {
    /** @type {{ method: string, url: string, key: string | null, status: number | null }[]} */
    const log = []
    const broker = admin(services.url, namespace(), { fetch: loggingFetch(log) })
    await broker.memory.put('a', 1)
    await broker.memory.put('a', 1)
    await broker.memory.delete('a')
    const keys = log.map((r) => r.key)
    assert.equal(new Set(keys).size, 3)
    const uuid4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/
    assert.ok(keys.every((k) => k && uuid4.test(k)))
    assert.equal((await broker.memory.history('a')).length, 3)
  })

  test('a call without a key (API key creation) is not resent once it may have arrived', async () => {
    const proxy = await replyDroppingProxy(services.broker.port)
    try {
      const broker = admin(proxy.url, namespace())
      await assert.rejects(
        broker.keys.create({ grants: [{ namespace: 'x', permissions: ['read'] }] }),
        ConnectionFailedError,
      )
      assert.equal(proxy.connections(), 1)
    } finally {
      await proxy.close()
    }
  })
})

describe('Redis unavailable (503)', () => {
  test('writes wait out the outage (same key); a subscription made meanwhile works', async () => {
    const ns = namespace()
    /** @type {{ method: string, url: string, key: string | null, status: number | null }[]} */
    const log = []
    /** @type {string[]} */
    const said = []
    // The defaults: retries for 20 s, and a word on what they wait for.
    const broker = admin(services.url, ns, { fetch: loggingFetch(log), onRetry: (m) => said.push(m) })
    const impatient = admin(services.url, ns, { retryFor: 0 })
    await services.redis.stop()
    try {
      await assert.rejects(impatient.memory.get('k'), (error) => {
        assert.ok(error instanceof UnavailableError)
        assert.equal(error.status, 503)
        assert.equal(error.code, 'unavailable')
        return true
      })
      const events = broker.subscribe('k')
      const firstEvent = take(events, 1, 60_000)
      const writing = broker.memory.put('k', 'through the outage')
      // Longer than the three quick retries the SDK once made (at most 1.4 s in all).
      await delay(2500)
      await services.redis.restart()
      const entry = await writing
      assert.equal(entry.value, 'through the outage')
      const putSaid = said.filter((m) => m.includes('retrying PUT'))
      assert.equal(putSaid.length, 1, said.join('\n'))
      assert.match(putSaid[0] ?? '', /^memp: the broker at \S+ is unavailable \(503\); retrying PUT \/v1\/namespaces\/[^ ]+\/memory\/k for up to \d+ s more$/)
      const puts = log.filter((r) => r.method === 'PUT')
      assert.ok(puts.length >= 2, 'the put was resent')
      assert.ok(puts.slice(0, -1).every((r) => r.status === 503))
      assert.equal(new Set(puts.map((r) => r.key)).size, 1, 'with the same Idempotency-Key')

      // The subscription made during the outage is live now.
      const writer = admin(services.url, ns)
      const deadline = Date.now() + 30_000
      let got = null
      while (got === null && Date.now() < deadline) {
        await writer.memory.put('k', 'after')
        got = await Promise.race([firstEvent, delay(500).then(() => null)])
      }
      assert.ok(got, 'the subscription delivered an event after the outage')
      assert.equal(got[0]?.key, 'k')
      events.close()
    } finally {
      if (!services.redis.proc) await services.redis.restart()
    }
  })

  test('Redis losing its data is surfaced as a reset event, then live events go on', async () => {
    const broker = admin(services.url, namespace(), { maxRetries: 30 })
    const events = await broker.subscribe('*').open()
    await broker.memory.put('k', 'before')
    const [before] = await take(events, 1)
    assert.equal(before?.value, 'before')
    await services.redis.stop()
    await delay(300)
    await services.redis.restart()
    try {
      const [reset] = await take(events, 1, 30_000)
      assert.equal(reset?.type, 'reset')
      assert.equal(reset?.namespace, broker.namespace)
      assert.ok(reset?.reason)
      await broker.memory.put('k', 'after')
      const [live] = await take(events, 1)
      assert.deepEqual([live?.type, live?.value, live?.version], ['put', 'after', 1])
    } finally {
      events.close()
    }
  })

  test('a subscription refused with 503 (a gateway while the broker is away) retries', async () => {
    let refused = 0
    // In front of the real broker: the first two stream requests get 503, then it forwards.
    const gateway = createHttpServer((incoming, outgoing) => {
      if (incoming.url?.startsWith('/v1/subscribe') && refused < 2) {
        refused += 1
        outgoing.writeHead(503, { 'content-type': 'application/json', 'retry-after': '0' })
        outgoing.end(JSON.stringify({ error: { code: 'unavailable', message: 'away', details: {} } }))
        return
      }
      const forward = httpRequest({
        port: services.broker.port, host: '127.0.0.1', method: incoming.method,
        path: incoming.url, headers: incoming.headers,
      }, (reply) => {
        outgoing.writeHead(reply.statusCode ?? 502, reply.headers)
        reply.pipe(outgoing)
      })
      incoming.pipe(forward)
      outgoing.on('close', () => forward.destroy())
    })
    await new Promise((done) => gateway.listen(0, '127.0.0.1', () => done(null)))
    const address = gateway.address()
    const port = typeof address === 'object' && address ? address.port : 0
    try {
      const broker = admin(`http://127.0.0.1:${port}`, namespace())
      const events = broker.subscribe('g/*')
      try {
        await events.open()
        assert.equal(refused, 2)
        assert.ok(events.attempts >= 3)
        await broker.memory.put('g/1', 'through')
        const [event] = await take(events, 1)
        assert.equal(event?.value, 'through')
      } finally {
        events.close()
      }
    } finally {
      gateway.closeAllConnections()
      gateway.close()
    }
  })
})

describe('a 503 whose write landed (Redis froze after running it)', () => {
  /** @type {Awaited<ReturnType<typeof startServices>> | undefined} */
  let frozen
  /** @type {ReturnType<typeof setTimeout>[]} */
  const thaws = []

  /** Stop Redis (SIGSTOP) for `ms`: the broker answers 503 after its 1 s timeout, and what it
   * sent meanwhile runs when Redis wakes up. @param {number} ms */
  function freeze(ms) {
    const child = frozen?.redis.proc?.child
    assert.ok(child)
    child.kill('SIGSTOP')
    thaws.push(setTimeout(() => child.kill('SIGCONT'), ms))
  }

  before(async () => {
    // The configuration stays cached, so a write's script is all it sends Redis.
    frozen = await startServices({ MEMP_REDIS_TIMEOUT_SECONDS: '1', MEMP_READER_BLOCK_MS: '500',
      MEMP_NAMESPACE_CACHE_SECONDS: '3600' })
  })
  after(async () => {
    for (const thaw of thaws) clearTimeout(thaw)
    frozen?.redis.proc?.child.kill('SIGCONT')
    await frozen?.stop()
  })

  test('put and delete are resent with their key and applied once', async () => {
    /** @type {{ method: string, url: string, key: string | null, status: number | null }[]} */
    const log = []
    const broker = admin(frozen?.broker.url ?? '', namespace(), {
      fetch: loggingFetch(log), maxRetries: 5,
    })
    await broker.memory.put('warm-up', 0) // the namespace noted, its configuration cached,
    await broker.memory.delete('warm-up') // and both scripts loaded: Redis is sent just them
    for (const method of ['PUT', 'DELETE']) {
      const frozenAt = Date.now()
      freeze(1500) // the first try gets 503 after 1 s; the retry comes 1 s after that
      const entry = method === 'PUT'
        ? await broker.memory.put('k', { once: true })
        : await broker.memory.delete('k')
      assert.equal(entry.version, method === 'PUT' ? 1 : 2)
      // The first try's write landed (it carries that try's time); the retry, with its key,
      // got that write's reply instead of writing again.
      assert.ok(entry.updatedAt < frozenAt + 1000, `${entry.updatedAt} >= ${frozenAt} + 1000`)
      const tries = log.filter((r) => r.method === method && r.url.endsWith('/k'))
      assert.deepEqual(tries.map((r) => r.status), [503, method === 'PUT' ? 201 : 200])
      assert.ok(tries[0]?.key)
      assert.equal(tries[0]?.key, tries[1]?.key)
      log.length = 0
    }
    const history = await broker.memory.history('k')
    assert.deepEqual(history.map((e) => e.version), [2, 1], 'each applied once')
  })

  test('API key creation is not resent after a 503, which it may have outlived', async () => {
    /** @type {{ method: string, url: string, key: string | null, status: number | null }[]} */
    const log = []
    const ns = namespace()
    const broker = admin(frozen?.broker.url ?? '', ns, { fetch: loggingFetch(log), maxRetries: 5 })
    // A key made first, so that Redis already holds the write's script: a first call of a
    // script Redis lacks is answered NOSCRIPT, unrun, once Redis wakes.
    await broker.keys.create({ grants: [{ namespace: ns, permissions: ['read'] }], name: `warm ${ns}` })
    log.length = 0
    freeze(1500)
    await assert.rejects(
      broker.keys.create({ grants: [{ namespace: ns, permissions: ['read'] }], name: `frozen ${ns}` }),
      UnavailableError,
    )
    assert.equal(log.filter((r) => r.method === 'POST').length, 1)
    // The 503 was no proof that nothing happened: the key was created once, by that try.
    const deadline = Date.now() + 20_000
    let named = []
    while (named.length === 0 && Date.now() < deadline) {
      named = (await broker.keys.list()).filter((k) => k.name === `frozen ${ns}`)
      if (named.length === 0) await delay(50)
    }
    assert.equal(named.length, 1)
  })
})
