// Every memory call against a real broker on a real Redis: register, put (TTL, compare-and-set,
// timestamps, merge base, schema warnings), get, getEntry, query, page, delete, history.

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'

import {
  ConflictError,
  InvalidRequestError,
  MEMP,
  NotFoundError,
  PreconditionFailedError,
  QueryResult,
  SchemaViolationError,
} from 'memp-sdk'

import { admin, delay, namespace, rest, useServices } from './helpers.js'

const services = useServices()

describe('register', () => {
  test('returns the agent and switches to its own key', async () => {
    const ns = namespace()
    const broker = admin(services.url, ns)
    const agent = await broker.register({ name: 'my-agent', framework: 'langchain' })
    assert.match(agent.id, /^[0-9a-f-]{36}$/)
    assert.equal(agent.name, 'my-agent')
    assert.equal(agent.framework, 'langchain')
    assert.equal(agent.namespace, ns)
    assert.equal(typeof agent.createdAt, 'number')
    assert.equal(typeof agent.lastSeen, 'number')
    assert.deepEqual(broker.agent, agent)
    assert.ok(broker.credentials)
    assert.equal(broker.credentials.agentId, agent.id)
    assert.match(broker.apiKey ?? '', /^memp_sk_/)
    assert.equal(broker.apiKey, broker.credentials.apiKey)

    const entry = await broker.memory.put('fact', { ok: true })
    assert.equal(entry.agentId, agent.id, 'writes are attributed to the registered agent')
  })

  test('a name registered again with the same token is the same agent; new: true makes another', async () => {
    const ns = namespace()
    const first = await admin(services.url, ns).register({ name: 'again' })
    const again = admin(services.url, ns)
    assert.equal((await again.register({ name: 'again' })).id, first.id)
    assert.notEqual(again.apiKey, null)
    const other = await admin(services.url, ns).register({ name: 'again', new: true })
    assert.notEqual(other.id, first.id)
    const listed = await admin(services.url, ns).agents.list()
    assert.deepEqual(listed.agents.map((a) => a.id), [first.id, other.id])
    const entry = await again.memory.put('fact', 1)
    assert.equal(entry.agentId, first.id, 'the new key is bound to the first agent')
  })

  test('framework defaults to custom', async () => {
    const broker = admin(services.url, namespace())
    const agent = await broker.register({ name: 'plain' })
    assert.equal(agent.framework, 'custom')
  })
})

describe('put and get', () => {
  test('put returns the typed entry; get returns the value; getEntry the entry', async () => {
    const broker = admin(services.url, namespace())
    const entry = await broker.memory.put('customer/123', { plan: 'pro', acv: 12000 })
    assert.equal(entry.key, 'customer/123')
    assert.equal(entry.namespace, broker.namespace)
    assert.deepEqual(entry.value, { plan: 'pro', acv: 12000 })
    assert.equal(entry.version, 1)
    assert.equal(entry.agentId, 'admin')
    assert.equal(entry.ttlSeconds, null)
    assert.equal(entry.expiresAt, null)
    assert.equal(entry.deleted, false)
    assert.equal(entry.schemaViolation, false)
    assert.equal(entry.schemaErrors, null)
    assert.equal(entry.conflicts, null)
    assert.deepEqual(entry.warnings, [])
    assert.equal(typeof entry.createdAt, 'number')
    assert.equal(entry.createdAt, entry.updatedAt)

    assert.deepEqual(await broker.memory.get('customer/123'), { plan: 'pro', acv: 12000 })
    const read = await broker.memory.getEntry('customer/123')
    assert.deepEqual(read, entry)

    const second = await broker.memory.put('customer/123', { plan: 'free' })
    assert.equal(second.version, 2)
    assert.equal(second.id, entry.id, 'the entry id is kept across updates')
  })

  test('any JSON value round-trips', async () => {
    const broker = admin(services.url, namespace())
    for (const [key, value] of /** @type {[string, unknown][]} */ ([
      ['n', 42], ['s', 'text ✓'], ['b', false], ['z', null], ['a', [1, { x: [] }]],
    ])) {
      await broker.memory.put(key, value)
      assert.deepEqual(await broker.memory.get(key), value)
    }
  })

  test('keys with characters that need escaping in a URL', async () => {
    const broker = admin(services.url, namespace())
    const key = 'odd keys/a b?c#d%e/ünï'
    await broker.memory.put(key, 1)
    assert.equal((await broker.memory.getEntry(key)).key, key)
    assert.equal((await broker.memory.history(key)).length, 1)
    assert.equal((await broker.memory.delete(key)).key, key)
  })

  test('keys with dot segments are refused before anything is sent', async () => {
    /** @type {string[]} */
    const sent = []
    const broker = admin(services.url, namespace(), {
      fetch: (input, init) => {
        sent.push(String(input))
        return fetch(input, init)
      },
    })
    for (const key of ['a/../b', '..', 'a/./b', '', 'a//b']) {
      await assert.rejects(broker.memory.put(key, 1), (error) => {
        assert.ok(error instanceof InvalidRequestError)
        assert.equal(error.code, 'invalid_key')
        return true
      })
    }
    assert.deepEqual(sent, [])
  })

  test('get of a missing key rejects with NotFoundError', async () => {
    const broker = admin(services.url, namespace())
    await assert.rejects(broker.memory.get('nope'), NotFoundError)
    await assert.rejects(broker.memory.getEntry('nope'), NotFoundError)
  })

  test('ttlSeconds sets the expiry; the entry is gone after it', async () => {
    const broker = admin(services.url, namespace())
    const entry = await broker.memory.put('session/1', 'x', { ttlSeconds: 1 })
    assert.equal(entry.ttlSeconds, 1)
    assert.ok(entry.expiresAt !== null && entry.expiresAt - entry.updatedAt === 1000)
    assert.equal(await broker.memory.get('session/1'), 'x')
    await delay(1300)
    await assert.rejects(broker.memory.get('session/1'), NotFoundError)
  })

  test('ifVersion writes only while the version matches', async () => {
    const broker = admin(services.url, namespace())
    const first = await broker.memory.put('k', 1)
    const second = await broker.memory.put('k', 2, { ifVersion: first.version })
    assert.equal(second.version, 2)
    await assert.rejects(broker.memory.put('k', 3, { ifVersion: 1 }), (error) => {
      assert.ok(error instanceof PreconditionFailedError)
      assert.equal(error.status, 412)
      assert.equal(error.code, 'precondition_failed')
      assert.equal(error.currentVersion, 2)
      assert.equal(error.current?.value, 2)
      return true
    })
    assert.equal(await broker.memory.get('k'), 2)
  })

  test('ifAbsent writes only while the key is free', async () => {
    const broker = admin(services.url, namespace())
    const created = await broker.memory.put('lock', 'me', { ifAbsent: true })
    assert.equal(created.version, 1)
    await assert.rejects(broker.memory.put('lock', 'you', { ifAbsent: true }), (error) => {
      assert.ok(error instanceof PreconditionFailedError)
      assert.equal(error.currentVersion, 1)
      return true
    })
  })

  test('an older timestamp loses with ConflictError carrying the winner', async () => {
    const broker = admin(services.url, namespace())
    const now = Date.now()
    const stored = await broker.memory.put('doc', 'new', { timestamp: new Date(now) })
    assert.equal(stored.timestamp, now)
    await assert.rejects(broker.memory.put('doc', 'old', { timestamp: now - 5000 }), (error) => {
      assert.ok(error instanceof ConflictError)
      assert.equal(error.status, 409)
      assert.equal(error.code, 'write_conflict')
      assert.ok(error.winner)
      assert.equal(error.winner.value, 'new')
      assert.equal(error.winner.version, 1)
      assert.equal(error.winner.timestamp, now)
      return true
    })
    assert.equal(await broker.memory.get('doc'), 'new')
  })

  test('baseVersion on a merge namespace flags conflicts and warns', async () => {
    const ns = namespace()
    await rest(services.url, 'PUT', `/v1/namespaces/${ns}/config`, { strategy: 'merge' })
    const broker = admin(services.url, ns)
    const base = await broker.memory.put('profile/42', { plan: 'free', seats: 1 })
    await broker.memory.put('profile/42', { plan: 'pro' })
    const merged = await broker.memory.put('profile/42', { plan: 'enterprise', seats: 12 },
      { baseVersion: base.version })
    assert.deepEqual(merged.value, { plan: 'enterprise', seats: 12 })
    assert.deepEqual(merged.warnings, ['conflicts'])
    assert.ok(merged.conflicts)
    const conflict = merged.conflicts.find((c) => c.path === '/plan')
    assert.ok(conflict)
    assert.equal(conflict.base, 'free')
    assert.equal(conflict.stored, 'pro')
    assert.equal(conflict.incoming, 'enterprise')
    assert.equal(conflict.storedAgent, 'admin')
    assert.equal(conflict.baseMissing, false)
  })

  test('a value breaking a schema is stored with schemaViolation and a warning', async () => {
    const ns = namespace()
    await rest(services.url, 'PUT', `/v1/namespaces/${ns}/schemas/customer`, {
      pattern: 'customer/*',
      schema: { type: 'object', required: ['plan'], properties: { plan: { enum: ['free', 'pro'] } } },
    })
    const broker = admin(services.url, ns)
    const entry = await broker.memory.put('customer/7', { plan: 'gold' })
    assert.equal(entry.schemaViolation, true)
    assert.deepEqual(entry.warnings, ['schema_violation'])
    assert.ok(entry.schemaErrors && entry.schemaErrors.length === 1)
    assert.equal(entry.schemaErrors[0]?.schemaId, 'customer')
    assert.equal(entry.schemaErrors[0]?.path, '/plan')
    const read = await broker.memory.getEntry('customer/7')
    assert.equal(read.schemaViolation, true)
    assert.deepEqual(read.warnings, ['schema_violation'])
    const good = await broker.memory.put('customer/8', { plan: 'pro' })
    assert.deepEqual(good.warnings, [])
  })

  test('an enforcing schema rejects with SchemaViolationError and writes nothing', async () => {
    const ns = namespace()
    await rest(services.url, 'PUT', `/v1/namespaces/${ns}/schemas/strict`, {
      pattern: 'strict/*', enforce: true, schema: { type: 'number' },
    })
    const broker = admin(services.url, ns)
    await assert.rejects(broker.memory.put('strict/1', 'not a number'), (error) => {
      assert.ok(error instanceof SchemaViolationError)
      assert.equal(error.status, 422)
      assert.equal(error.errors[0]?.schemaId, 'strict')
      return true
    })
    await assert.rejects(broker.memory.get('strict/1'), NotFoundError)
  })
})

describe('delete and history', () => {
  test('delete writes a tombstone; history lists versions newest first', async () => {
    const broker = admin(services.url, namespace())
    await broker.memory.put('h', 'one')
    await broker.memory.put('h', 'two')
    const tombstone = await broker.memory.delete('h')
    assert.equal(tombstone.deleted, true)
    assert.equal(tombstone.value, null)
    assert.equal(tombstone.version, 3)
    await assert.rejects(broker.memory.get('h'), NotFoundError)

    const history = await broker.memory.history('h')
    assert.deepEqual(history.map((e) => [e.version, e.value, e.deleted]),
      [[3, null, true], [2, 'two', false], [1, 'one', false]])
    const limited = await broker.memory.history('h', { limit: 2 })
    assert.deepEqual(limited.map((e) => e.version), [3, 2])

    const again = await broker.memory.put('h', 'three')
    assert.equal(again.version, 4, 'versions continue after a delete')
  })

  test('delete with ifVersion, and of a missing key', async () => {
    const broker = admin(services.url, namespace())
    await broker.memory.put('d', 1)
    await assert.rejects(broker.memory.delete('d', { ifVersion: 5 }), PreconditionFailedError)
    assert.equal((await broker.memory.delete('d', { ifVersion: 1 })).version, 2)
    await assert.rejects(broker.memory.delete('never'), NotFoundError)
  })
})

describe('query', () => {
  /** @param {MEMP} broker */
  async function fill(broker) {
    for (const id of ['1', '2', '3', '4', '5']) await broker.memory.put(`customer/${id}`, { id })
    await broker.memory.put('other/x', 'x')
  }

  test('await gives every matching entry, across pages, in key order', async () => {
    const broker = admin(services.url, namespace())
    await fill(broker)
    const results = await broker.memory.query('customer/*', { pageSize: 2 })
    assert.ok(Array.isArray(results))
    assert.deepEqual(results.map((e) => e.key),
      ['customer/1', 'customer/2', 'customer/3', 'customer/4', 'customer/5'])
    assert.deepEqual(results[0]?.value, { id: '1' })
    assert.equal((await broker.memory.query()).length, 6, "the default pattern is '*'")
    assert.deepEqual(await broker.memory.query('nothing/*'), [])
  })

  test('for await iterates every page, fetching only as far as it goes', async () => {
    /** @type {string[]} */
    const requests = []
    const broker = admin(services.url, namespace(), {
      fetch: (input, init) => {
        requests.push(String(input))
        return fetch(input, init)
      },
    })
    await fill(broker)
    requests.length = 0
    const result = broker.memory.query('customer/*', { pageSize: 2 })
    assert.ok(result instanceof QueryResult)
    assert.equal(requests.length, 0, 'nothing is sent before it is awaited or iterated')
    /** @type {string[]} */
    const keys = []
    for await (const entry of result) keys.push(entry.key)
    assert.deepEqual(keys, ['customer/1', 'customer/2', 'customer/3', 'customer/4', 'customer/5'])
    assert.equal(requests.length, 3)

    requests.length = 0
    for await (const entry of broker.memory.query('customer/*', { pageSize: 2 })) {
      assert.equal(entry.key, 'customer/1')
      break
    }
    assert.equal(requests.length, 1, 'breaking early fetches no further page')
  })

  test('pages(), page() with a cursor, and values()', async () => {
    const broker = admin(services.url, namespace())
    await fill(broker)
    /** @type {number[]} */
    const sizes = []
    for await (const page of broker.memory.query('customer/*', { pageSize: 2 }).pages()) {
      sizes.push(page.entries.length)
    }
    assert.deepEqual(sizes, [2, 2, 1])

    const first = await broker.memory.page('customer/*', { limit: 3 })
    assert.equal(first.entries.length, 3)
    assert.ok(first.nextCursor)
    const rest = await broker.memory.page('customer/*', { limit: 3, cursor: first.nextCursor })
    assert.deepEqual(rest.entries.map((e) => e.key), ['customer/4', 'customer/5'])
    assert.equal(rest.nextCursor, null)

    assert.deepEqual(await broker.memory.query('customer/*').values(), {
      'customer/1': { id: '1' }, 'customer/2': { id: '2' }, 'customer/3': { id: '3' },
      'customer/4': { id: '4' }, 'customer/5': { id: '5' },
    })
  })

  test('a result awaited twice asks the broker once', async () => {
    let requests = 0
    const broker = admin(services.url, namespace(), {
      fetch: (input, init) => {
        requests += 1
        return fetch(input, init)
      },
    })
    await broker.memory.put('a', 1)
    requests = 0
    const result = broker.memory.query('*')
    assert.equal((await result).length, 1)
    assert.equal((await result).length, 1)
    assert.equal(requests, 1)
  })
})

describe('configuration', () => {
  test('every call takes a namespace of its own', async () => {
    const broker = admin(services.url, namespace())
    const other = namespace('other')
    await broker.memory.put('k', 'here')
    await broker.memory.put('k', 'there', { namespace: other })
    assert.equal(await broker.memory.get('k'), 'here')
    assert.equal(await broker.memory.get('k', { namespace: other }), 'there')
    assert.equal((await broker.memory.query('*', { namespace: other }))[0]?.namespace, other)
    assert.equal((await broker.memory.history('k', { namespace: other })).length, 1)
    assert.equal((await broker.memory.delete('k', { namespace: other })).namespace, other)
  })

  test('apiKey, namespace and baseUrl come from the environment when not given', async () => {
    const saved = { ...process.env }
    try {
      process.env.MEMP_BASE_URL = services.url + '/'
      process.env.MEMP_API_KEY = 'test-admin-key-0123456789'
      process.env.MEMP_NAMESPACE = namespace('env')
      const broker = new MEMP()
      assert.equal(broker.config.baseUrl, services.url)
      assert.equal(broker.namespace, process.env.MEMP_NAMESPACE)
      await broker.memory.put('k', 'v')
      assert.equal(await broker.memory.get('k'), 'v')
      const explicit = new MEMP({ namespace: 'given', baseUrl: 'http://example.invalid:1' })
      assert.equal(explicit.namespace, 'given')
      assert.equal(explicit.config.baseUrl, 'http://example.invalid:1')
      delete process.env.MEMP_BASE_URL
      delete process.env.MEMP_NAMESPACE
      assert.equal(new MEMP().config.baseUrl, 'http://127.0.0.1:8080')
      assert.throws(() => new MEMP().memory.query('*'), TypeError)
    } finally {
      process.env = saved
    }
  })

  test('a call with an aborted signal rejects with its reason', async () => {
    const broker = admin(services.url, namespace())
    const controller = new AbortController()
    controller.abort(new Error('changed my mind'))
    await assert.rejects(broker.memory.put('k', 1, { signal: controller.signal }),
      /changed my mind/)
    await assert.rejects(broker.memory.get('k'), NotFoundError)
  })
})
