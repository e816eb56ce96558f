// Subscriptions against a real broker: live events, snapshot start, resume from a cursor,
// reset, overflow, several patterns, warnings, and ending by break, close() or an AbortSignal.

import assert from 'node:assert/strict'
import { createServer, request } from 'node:http'
import { describe, test } from 'node:test'

import { Subscription } from 'memp-sdk'

import { admin, Broker, delay, namespace, rest, take, useServices, WAIT } from './helpers.js'

const services = useServices()

/**
 * A fetch that remembers the signal of every stream request, to check they get closed.
 * @param {AbortSignal[]} signals
 * @returns {typeof fetch}
 */
function recordingFetch(signals) {
  return (input, init) => {
    if (String(input).includes('/v1/subscribe') && init?.signal) signals.push(init.signal)
    return fetch(input, init)
  }
}

/**
 * Wait until `check()` holds.
 * @param {() => boolean} check
 */
async function until(check, what = 'the condition') {
  const deadline = Date.now() + WAIT
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await delay(10)
  }
}

describe('live events', () => {
  test('put, delete and expire events carry the entry, its value and a cursor', async () => {
    const broker = admin(services.url, namespace())
    const events = broker.subscribe('customer/*')
    assert.ok(events instanceof Subscription)
    await events.open()
    await broker.memory.put('customer/1', { plan: 'pro' })
    await broker.memory.put('other/x', 'not followed')
    await broker.memory.put('customer/2', { plan: 'free' })
    await broker.memory.delete('customer/1')
    await broker.memory.put('customer/3', 'brief', { ttlSeconds: 1 })
    const [first, second, deleted, brief, expired] = await take(events, 5)
    assert.ok(first && second && deleted && brief && expired)
    assert.equal(first.type, 'put')
    assert.equal(first.key, 'customer/1')
    assert.deepEqual(first.value, { plan: 'pro' })
    assert.equal(first.version, 1)
    assert.equal(first.namespace, broker.namespace)
    assert.equal(first.entry?.agentId, 'admin')
    assert.deepEqual(first.warnings, [])
    assert.ok(first.id)
    assert.deepEqual(second.value, { plan: 'free' })
    assert.equal(deleted.type, 'delete')
    assert.equal(deleted.key, 'customer/1')
    assert.equal(deleted.value, null)
    assert.equal(deleted.version, 2)
    assert.equal(brief.key, 'customer/3')
    assert.equal(expired.type, 'expire')
    assert.equal(expired.key, 'customer/3')
    assert.equal(expired.value, null)
    assert.equal(events.lastEventId, expired.id)
    events.close()
  })

  test('several patterns on one stream', async () => {
    const broker = admin(services.url, namespace())
    const events = await broker.subscribe(['a/*', 'b/x']).open()
    await broker.memory.put('b/y', 0)
    await broker.memory.put('a/1', 1)
    await broker.memory.put('c/1', 0)
    await broker.memory.put('b/x', 2)
    const got = await take(events, 2)
    assert.deepEqual(got.map((e) => [e.key, e.value]), [['a/1', 1], ['b/x', 2]])
    events.close()
  })

  test('schema warnings and merge conflicts reach subscribers', async () => {
    const ns = namespace()
    await rest(services.url, 'PUT', `/v1/namespaces/${ns}/schemas/num`, {
      pattern: 'n/*', schema: { type: 'number' },
    })
    const broker = admin(services.url, ns)
    const events = await broker.subscribe('n/*').open()
    await broker.memory.put('n/1', 'text')
    const [event] = await take(events, 1)
    assert.equal(event?.entry?.schemaViolation, true)
    assert.deepEqual(event?.warnings, ['schema_violation'])
    assert.equal(event?.entry?.schemaErrors?.[0]?.schemaId, 'num')
    events.close()
  })

  test('the subscription follows another namespace when asked', async () => {
    const broker = admin(services.url, namespace())
    const other = namespace('other')
    const events = await broker.subscribe('*', { namespace: other }).open()
    await broker.memory.put('k', 'mine')
    await broker.memory.put('k', 'theirs', { namespace: other })
    const [event] = await take(events, 1)
    assert.equal(event?.namespace, other)
    assert.equal(event?.value, 'theirs')
    events.close()
  })
})

describe('snapshot', () => {
  test('starts with the current entries, then snapshot-end, then live changes', async () => {
    const broker = admin(services.url, namespace())
    await broker.memory.put('s/1', 'one')
    await broker.memory.put('s/2', 'two')
    await broker.memory.put('s/2', 'two, again')
    await broker.memory.put('t/1', 'not followed')
    const events = broker.subscribe('s/*', { snapshot: true })
    const [a, b, end] = await take(events, 3)
    assert.deepEqual([a?.type, a?.key, a?.value, a?.id], ['snapshot', 's/1', 'one', null])
    assert.deepEqual([b?.type, b?.key, b?.value, b?.version], ['snapshot', 's/2', 'two, again', 2])
    assert.equal(end?.type, 'snapshot-end')
    assert.ok(end?.id)
    assert.equal(events.lastEventId, end?.id)
    await broker.memory.put('s/3', 'three')
    const [live] = await take(events, 1)
    assert.deepEqual([live?.type, live?.key], ['put', 's/3'])
    events.close()
  })
})

describe('fitted to the consumer', () => {
  test('a filter sends what matches; what it leaves out still moves the cursor', async () => {
    const broker = admin(services.url, namespace())
    const options = { filter: '/status == "done"', conflate: /** @type {const} */ ('latest'),
      maxRate: 100 }
    const events = await broker.subscribe('t/*', options).open()
    await broker.memory.put('t/1', { status: 'open' })
    await broker.memory.put('t/2', { status: 'done' })
    await broker.memory.put('t/3', { status: 'open' })
    const [done] = await take(events, 1)
    assert.deepEqual([done?.type, done?.key], ['put', 't/2'])
    // The iterator reads the stream while it is asked for the next event.
    const pending = events.next()
    await until(() => events.lastEventId !== done?.id, 'the progress event')
    const cursor = events.lastEventId ?? undefined
    events.close()
    assert.equal((await pending).done, true)
    await broker.memory.put('t/4', { status: 'done' })
    const resumed = broker.subscribe('t/*', { filter: '/status == "done"', lastEventId: cursor })
    const [next] = await take(resumed, 1)
    assert.deepEqual([next?.type, next?.key], ['put', 't/4'])
    resumed.close()
    const bad = broker.subscribe('*', { filter: '/status = 1' })
    await assert.rejects(take(bad, 1), /position 8/)
  })
})

/**
 * An HTTP gateway to the broker that cuts the first event stream right after its first
 * `snapshot` frame, as a network failure would.
 * @param {number} port the broker's
 */
async function snapshotCuttingGateway(port) {
  let streams = 0
  const server = createServer((incoming, outgoing) => {
    const first = incoming.url?.startsWith('/v1/subscribe') && ++streams === 1
    const forward = request({
      port, host: '127.0.0.1', method: incoming.method, path: incoming.url, headers: incoming.headers,
    }, (reply) => {
      outgoing.writeHead(reply.statusCode ?? 502, reply.headers)
      if (!first) {
        reply.pipe(outgoing)
        return
      }
      let text = ''
      reply.setEncoding('utf8')
      reply.on('data', (chunk) => {
        text += chunk
        const start = text.indexOf('event: snapshot\n')
        const end = start < 0 ? -1 : text.indexOf('\n\n', start)
        if (end < 0) return
        reply.destroy()
        // Let the frame reach the client, then break the connection.
        outgoing.write(text.slice(0, end + 2), () => {
          setTimeout(() => outgoing.socket?.destroy(), 100)
        })
      })
    })
    incoming.pipe(forward)
    outgoing.on('close', () => forward.destroy())
  })
  await new Promise((done) => server.listen(0, '127.0.0.1', () => done(null)))
  const address = server.address()
  return {
    url: `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`,
    streams: () => streams,
    close: () => {
      server.closeAllConnections()
      server.close()
    },
  }
}

describe('snapshot, cut short', () => {
  test('a snapshot broken before its end is asked for again, without repeats', async () => {
    const gateway = await snapshotCuttingGateway(services.broker.port)
    try {
      const broker = admin(gateway.url, namespace())
      for (const n of [1, 2, 3]) await broker.memory.put(`s/${n}`, n)
      const events = broker.subscribe('s/*', { snapshot: true })
      const got = await take(events, 4)
      assert.deepEqual(got.map((e) => [e.type, e.key]), [
        ['snapshot', 's/1'], ['snapshot', 's/2'], ['snapshot', 's/3'], ['snapshot-end', null],
      ])
      assert.equal(gateway.streams(), 2, 'the stream was cut once and reconnected')
      await broker.memory.put('s/4', 4)
      const [live] = await take(events, 1)
      assert.deepEqual([live?.type, live?.key], ['put', 's/4'])
    } finally {
      gateway.close()
    }
  })
})

describe('resume', () => {
  test('lastEventId resumes after the cursor: every missed change, once', async () => {
    const broker = admin(services.url, namespace())
    const first = await broker.subscribe('r/*').open()
    await broker.memory.put('r/1', 1)
    await broker.memory.put('r/2', 2)
    await take(first, 2)
    const cursor = first.lastEventId
    assert.ok(cursor)
    first.close()
    for (const n of [3, 4, 5]) await broker.memory.put(`r/${n}`, n)
    const resumed = broker.subscribe('r/*', { lastEventId: cursor })
    const got = await take(resumed, 3)
    assert.deepEqual(got.map((e) => e.value), [3, 4, 5])
    await broker.memory.put('r/6', 6)
    const [next] = await take(resumed, 1)
    assert.equal(next?.value, 6, 'no duplicate between the replay and live events')
    resumed.close()
  })

  test('a cursor older than the retained change log gets a reset event', async () => {
    const small = await Broker.start(services.redis.url, { env: { MEMP_CHANGELOG_MAXLEN: '5' } })
    try {
      const broker = admin(small.url, namespace())
      const first = await broker.subscribe('*').open()
      await broker.memory.put('k/0', 0)
      await take(first, 1)
      const cursor = first.lastEventId
      first.close()
      for (let n = 1; n <= 12; n++) await broker.memory.put(`k/${n}`, n)
      assert.ok(cursor)
      const resumed = broker.subscribe('*', { lastEventId: cursor })
      const [reset] = await take(resumed, 1)
      assert.equal(reset?.type, 'reset')
      assert.equal(reset?.namespace, broker.namespace)
      assert.match(reset?.reason ?? '', /older than the retained change log/)
      assert.ok(reset?.id)
      await broker.memory.put('k/after', 'live')
      const [live] = await take(resumed, 1)
      assert.deepEqual([live?.type, live?.key], ['put', 'k/after'])
      resumed.close()
    } finally {
      await small.stop()
    }
  })

  test('an overflow is resumed transparently: every change arrives once', async () => {
    const tiny = await Broker.start(services.redis.url, { env: { MEMP_SUBSCRIBER_QUEUE_SIZE: '1' } })
    try {
      const broker = admin(tiny.url, namespace())
      const events = await broker.subscribe('o/*').open()
      // Bursts of concurrent writes reach the subscriber's queue (one slot) in batches; the
      // broker cuts it off with `overflow`, and the SDK resumes from the cursor.
      for (let burst = 0; burst < 3 && events.attempts === 1; burst++) {
        const writes = []
        for (let n = 0; n < 60; n++) writes.push(broker.memory.put(`o/${burst}/${n}`, n))
        const written = await Promise.all(writes)
        const got = await take(events, 60)
        assert.deepEqual(new Set(got.map((e) => e.key)), new Set(written.map((e) => e.key)))
        assert.equal(new Set(got.map((e) => e.id)).size, 60, 'no event twice')
      }
      assert.ok(events.attempts > 1, 'the broker cut the slow subscriber off at least once')
      await broker.memory.put('o/last', 'x')
      const [last] = await take(events, 1)
      assert.equal(last?.key, 'o/last')
      events.close()
    } finally {
      await tiny.stop()
    }
  })
})

describe('ending a subscription', () => {
  test('break ends the loop and closes the connection', async () => {
    /** @type {AbortSignal[]} */
    const signals = []
    const broker = admin(services.url, namespace(), { fetch: recordingFetch(signals) })
    const events = await broker.subscribe('b/*').open()
    await broker.memory.put('b/1', 1)
    for await (const event of events) {
      assert.equal(event.value, 1)
      break
    }
    assert.equal(events.closed, true)
    assert.equal(signals.length, 1)
    assert.ok(signals[0]?.aborted, 'the stream request was aborted')
    assert.deepEqual(await events.next(), { done: true, value: undefined })
  })

  test('an AbortSignal ends a loop that is waiting for events', async () => {
    const broker = admin(services.url, namespace())
    const controller = new AbortController()
    const events = await broker.subscribe('w/*', { signal: controller.signal }).open()
    /** @type {unknown[]} */
    const seen = []
    const loop = (async () => {
      for await (const event of events) seen.push(event.value)
      return 'finished'
    })()
    await broker.memory.put('w/1', 1)
    await until(() => seen.length === 1, 'the first event')
    controller.abort()
    assert.equal(await loop, 'finished', 'the loop ends without an error')
    assert.deepEqual(seen, [1])
    assert.equal(events.closed, true)
  })

  test('an AbortSignal ends a subscription that is still trying to connect', async () => {
    const controller = new AbortController()
    const broker = admin('http://127.0.0.1:9', namespace())
    const events = broker.subscribe('*', { signal: controller.signal })
    const loop = (async () => {
      for await (const _ of events) throw new Error('no event expected')
      return 'finished'
    })()
    await delay(300)
    assert.ok(events.attempts >= 1)
    controller.abort()
    assert.equal(await loop, 'finished')
  })

  test('an already aborted signal sends nothing', async () => {
    let requests = 0
    const broker = admin(services.url, namespace(), {
      fetch: (input, init) => {
        requests += 1
        return fetch(input, init)
      },
    })
    const events = broker.subscribe('*', { signal: AbortSignal.abort() })
    for await (const _ of events) throw new Error('no event expected')
    assert.equal(requests, 0)
  })

  test('close() ends a pending next(); MEMP.close() ends every subscription', async () => {
    const broker = admin(services.url, namespace())
    const one = await broker.subscribe('x/*').open()
    const pending = one.next()
    one.close()
    assert.deepEqual(await pending, { done: true, value: undefined })

    const a = await broker.subscribe('a/*').open()
    const b = await broker.subscribe('b/*').open()
    const pendingA = a.next()
    broker.close()
    assert.deepEqual(await pendingA, { done: true, value: undefined })
    assert.equal(b.closed, true)
  })
})

describe('connection state', () => {
  test('onState tells connecting, connected and closed', async () => {
    const broker = admin(services.url, namespace())
    /** @type {string[]} */
    const seen = []
    const subscription = broker.subscribe('*', { onState: (state) => seen.push(state.status) })
    await subscription.open({ timeout: WAIT })
    subscription.close()
    await until(() => seen.at(-1) === 'closed', 'closed')
    assert.deepEqual(seen, ['connecting', 'connected', 'closed'])
  })

  test('open({ timeout }) rejects against an unreachable broker, after reconnecting states', async () => {
    const { freePort } = await import('./helpers.js')
    const { MEMP, OpenTimeoutError } = await import('memp-sdk')
    const broker = new MEMP({ apiKey: 'k', namespace: 'n', baseUrl: `http://127.0.0.1:${await freePort()}` })
    /** @type {import('memp-sdk').ConnectionState[]} */
    const states = []
    const subscription = broker.subscribe('*', { onState: (state) => states.push(state) })
    await assert.rejects(subscription.open({ timeout: 1000 }), (error) =>
      error instanceof OpenTimeoutError && error.code === 'connection_error' &&
      /did not open within 1000 ms/.test(error.message))
    assert.equal(states[0]?.status, 'connecting')
    const reconnecting = states.filter((s) => s.status === 'reconnecting')
    assert.ok(reconnecting.length >= 1)
    assert.deepEqual(reconnecting.map((s) => s.attempt), reconnecting.map((_, i) => i + 1))
    assert.ok(reconnecting[0]?.error instanceof Error)
    assert.equal(states.at(-1)?.status, 'closed')
    assert.ok(subscription.closed)
  })

  test('a 4xx on the stream closes it with the error, without retrying', async () => {
    const { MEMP, UnauthorizedError } = await import('memp-sdk')
    const broker = new MEMP({ apiKey: 'memp_sk_nonsense', namespace: namespace(), baseUrl: services.url })
    /** @type {import('memp-sdk').ConnectionState[]} */
    const states = []
    const subscription = broker.subscribe('*', { onState: (state) => states.push(state) })
    await assert.rejects(subscription.open({ timeout: WAIT }), UnauthorizedError)
    assert.deepEqual(states.map((s) => s.status), ['connecting', 'closed'])
    assert.ok(states[1]?.error instanceof UnauthorizedError)
    assert.equal(subscription.attempts, 1)
  })
})
