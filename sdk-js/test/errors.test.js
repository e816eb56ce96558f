// Broker errors become typed errors: the class for the code, with code, status, message and
// details as the broker sent them; failures to reach the broker become ConnectionFailedError.

import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import { describe, test } from 'node:test'

import {
  ConnectionFailedError,
  ForbiddenError,
  InvalidRequestError,
  MEMP,
  MempError,
  NotFoundError,
  PayloadTooLargeError,
  UnauthorizedError,
} from 'memp-sdk'

import { admin, freePort, namespace, useServices } from './helpers.js'

const services = useServices()

/**
 * Asserts a rejection with this class, code and status; returns the error.
 * @template {MempError} E
 * @param {PromiseLike<unknown>} promise
 * @param {new (...args: any[]) => E} kind
 * @param {string} code
 * @param {number | null} status
 * @returns {Promise<E>}
 */
async function rejectsWith(promise, kind, code, status) {
  try {
    await promise
  } catch (error) {
    assert.ok(error instanceof kind, `expected ${kind.name}, got ${String(error)}`)
    assert.ok(error instanceof MempError)
    assert.ok(error instanceof Error)
    assert.equal(error.name, kind.name)
    assert.equal(error.code, code)
    assert.equal(error.status, status)
    assert.ok(error.message.length > 0)
    return error
  }
  assert.fail(`expected ${kind.name} (${code})`)
}

/**
 * Drains a subscription, expecting it to fail.
 * @param {AsyncIterable<unknown>} events
 */
async function drain(events) {
  for await (const _ of events) assert.fail('no event expected')
}

describe('broker errors', () => {
  test('an unknown token: UnauthorizedError, for calls and subscriptions', async () => {
    const broker = new MEMP({ apiKey: 'memp_sk_live_nonsense', namespace: namespace(), baseUrl: services.url })
    await rejectsWith(broker.memory.put('k', 1), UnauthorizedError, 'unauthorized', 401)
    await rejectsWith(broker.memory.get('k'), UnauthorizedError, 'unauthorized', 401)
    await rejectsWith(drain(broker.subscribe('*')), UnauthorizedError, 'unauthorized', 401)
    if (!process.env.MEMP_API_KEY) {
      // Without a key the client fails at once, naming what to set, instead of a 401 later.
      assert.throws(() => new MEMP({ namespace: namespace(), baseUrl: services.url }),
        (error) => error instanceof TypeError && /MEMP_API_KEY/.test(error.message))
    }
    const refused = await broker.memory.get('k').catch((error) => error)
    assert.match(refused.requestId, /^[0-9a-f]{16}$/) // the broker's id, to quote in a report
  })

  test('a base URL without http:// or https:// is refused at once', () => {
    for (const baseUrl of ['127.0.0.1:8080', 'localhost', 'ftp://host']) {
      assert.throws(() => new MEMP({ apiKey: 'k', namespace: 'n', baseUrl }), TypeError)
    }
  })

  test('a key without the permission: ForbiddenError; keys can be created and revoked', async () => {
    const ns = namespace()
    const root = admin(services.url, ns)
    const created = await root.keys.create({
      grants: [{ namespace: ns, permissions: ['read'] }],
      name: 'reader',
    })
    assert.match(created.apiKey, /^memp_sk_/)
    assert.equal(created.key.name, 'reader')
    assert.deepEqual(created.key.grants, [{ namespace: ns, permissions: ['read'] }])
    assert.ok((await root.keys.list()).some((k) => k.id === created.key.id))

    const reader = new MEMP({ apiKey: created.apiKey, namespace: ns, baseUrl: services.url })
    await root.memory.put('k', 1)
    assert.equal(await reader.memory.get('k'), 1)
    await rejectsWith(reader.memory.put('k', 2), ForbiddenError, 'forbidden', 403)
    await rejectsWith(reader.memory.get('k', { namespace: namespace() }), ForbiddenError,
      'forbidden', 403)
    await rejectsWith(drain(reader.subscribe('*')), ForbiddenError, 'forbidden', 403)

    await root.keys.revoke(created.key.id)
    await rejectsWith(reader.memory.get('k'), UnauthorizedError, 'unauthorized', 401)
    await rejectsWith(root.keys.revoke(created.key.id), NotFoundError, 'not_found', 404)
  })

  test('NotFoundError keeps the details', async () => {
    const broker = admin(services.url, namespace())
    const error = await rejectsWith(broker.memory.delete('missing'), NotFoundError, 'not_found', 404)
    assert.equal(error.details['key'], 'missing')
  })

  test('bad input: InvalidRequestError with the specific code', async () => {
    const broker = admin(services.url, namespace())
    await rejectsWith(broker.memory.put('k', 1, { ttlSeconds: 0 }), InvalidRequestError,
      'invalid_ttl', 400)
    await rejectsWith(broker.memory.put('k', 1, { timestamp: Date.now() + 3_600_000 }),
      InvalidRequestError, 'invalid_timestamp', 400)
    await rejectsWith(broker.memory.query('a*b'), InvalidRequestError, 'invalid_pattern', 400)
    await rejectsWith(broker.memory.get('k', { namespace: 'Not_A_Namespace' }),
      InvalidRequestError, 'invalid_namespace', 400)
    await rejectsWith(broker.memory.put('a*', 1), InvalidRequestError, 'invalid_key', 400)
    await rejectsWith(drain(broker.subscribe('a*b')), InvalidRequestError, 'invalid_pattern', 400)
    await rejectsWith(drain(broker.subscribe('*', { lastEventId: 'not-a-cursor' })),
      InvalidRequestError, 'invalid_request', 400)
  })

  test('a namespace URL normalisation would turn into another path is refused before sending', async () => {
    const broker = admin(services.url, namespace())
    for (const bad of ['..', '.', 'a/b']) {
      for (const call of [
        () => broker.memory.get('k', { namespace: bad }),
        () => broker.namespaces.config({ namespace: bad }),
        () => broker.schemas.list({ namespace: bad }),
        () => broker.agents.list({ namespace: bad }),
        () => broker.proposals.list({ namespace: bad }),
        () => broker.audit.list({ namespace: bad }),
      ]) {
        const error = await rejectsWith(call(), InvalidRequestError, 'invalid_namespace', 400)
        assert.equal(error.details['namespace'], bad)
      }
    }
  })

  test('a value over the limit: PayloadTooLargeError', async () => {
    const broker = admin(services.url, namespace())
    await rejectsWith(broker.memory.put('big', 'x'.repeat(1_100_000)), PayloadTooLargeError,
      'payload_too_large', 413)
  })
})

describe('reaching the broker', () => {
  test('nothing listening: ConnectionFailedError with the cause, after the retries', async () => {
    const broker = new MEMP({
      apiKey: 'k', namespace: 'n', baseUrl: `http://127.0.0.1:${await freePort()}`, maxRetries: 1,
    })
    const error = await rejectsWith(broker.memory.get('k'), ConnectionFailedError,
      'connection_error', null)
    assert.ok(error.cause instanceof Error)
    assert.match(error.message, /could not reach the broker/)
  })

  test('a server that is not a MEMP broker', async () => {
    const server = createServer((request, response) => {
      if (request.url?.startsWith('/v1/subscribe')) {
        response.writeHead(200, { 'content-type': 'text/html' })
        response.end('<html></html>')
      } else {
        response.writeHead(500, { 'content-type': 'text/plain' })
        response.end('oops')
      }
    })
    await new Promise((done) => server.listen(0, '127.0.0.1', () => done(null)))
    try {
      const address = server.address()
      const port = typeof address === 'object' && address ? address.port : 0
      const broker = new MEMP({ apiKey: 'k', namespace: 'n', baseUrl: `http://127.0.0.1:${port}` })
      const error = await rejectsWith(broker.memory.get('k'), MempError, 'internal', 500)
      assert.equal(error.constructor, MempError)
      await rejectsWith(drain(broker.subscribe('*')), ConnectionFailedError, 'connection_error',
        200)
    } finally {
      server.close()
      server.closeAllConnections()
    }
  })
})
