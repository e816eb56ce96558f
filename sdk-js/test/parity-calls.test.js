// What the JavaScript SDK caught up on, against a real broker: namespace configuration,
// schemas, agent listing, the typed message batch, and AMP (typed cells and errors, the
// acting agent from the client's registered agent).

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'

import {
  ConflictError,
  ForbiddenError,
  InvalidRequestError,
  MEMP,
  NotFoundError,
  PreconditionFailedError,
} from 'memp-sdk'

import { ADMIN_KEY, admin, namespace, rest, useServices } from './helpers.js'

const services = useServices()

describe('namespace configuration and schemas', () => {
  test('config, setConfig with ifRevision, updateConfig', async () => {
    const broker = admin(services.url, namespace())
    const fresh = await broker.namespaces.config()
    assert.equal(fresh.revision, 0)
    assert.equal(fresh.strategy, 'last-write-wins')
    const set = await broker.namespaces.setConfig({
      strategy: 'merge',
      rules: [{ pattern: 'policy/*', strategy: 'agent-priority' }],
    })
    assert.equal(set.revision, 1)
    await assert.rejects(
      broker.namespaces.setConfig({ strategy: 'last-write-wins' }, { ifRevision: 0 }),
      PreconditionFailedError,
    )
    const updated = await broker.namespaces.updateConfig({ history_limit: 4 })
    assert.equal(updated.revision, 2)
    assert.equal(updated.strategy, 'merge')
    assert.equal(updated.history_limit, 4)
  })

  test('put, get, list and delete a schema', async () => {
    const broker = admin(services.url, namespace())
    const record = await broker.schemas.put(
      'customer',
      'customer/*',
      { type: 'object', required: ['plan'] },
      { enforce: true },
    )
    assert.equal(record.enforce, true)
    assert.equal(record.pattern, 'customer/*')
    assert.equal(record.createdBy, 'admin')
    assert.deepEqual((await broker.schemas.get('customer')).schema, record.schema)
    assert.deepEqual((await broker.schemas.list()).map((s) => s.id), ['customer'])
    await assert.rejects(broker.memory.put('customer/1', { seats: 1 }), /does not conform/)
    await broker.schemas.delete('customer')
    await assert.rejects(broker.schemas.get('customer'), NotFoundError)
  })
})

describe('agents and messages', () => {
  test('list pages through agents; get; remove', async () => {
    const ns = namespace()
    /** @type {string[]} */
    const ids = []
    for (const name of ['a', 'b', 'c']) {
      ids.push((await admin(services.url, ns).register({ name })).id)
    }
    const broker = admin(services.url, ns)
    const first = await broker.agents.list({ limit: 2 })
    assert.deepEqual(first.agents.map((a) => a.id), ids.slice(0, 2))
    const rest = await broker.agents.list({ cursor: first.nextCursor })
    assert.deepEqual(rest.agents.map((a) => a.id), ids.slice(2))
    assert.equal(rest.nextCursor, null)
    const second = ids[1] ?? ''
    assert.equal((await broker.agents.get(second)).name, 'b')
    await broker.agents.remove(second)
    await assert.rejects(broker.agents.get(second), NotFoundError)
  })

  test('a typed batch: one reply per message, errors typed but not thrown', async () => {
    const broker = admin(services.url, namespace())
    const replies = await broker.messages.batch([
      { type: 'memory.put', key: 'customer/1', value: { plan: 'pro' } },
      { type: 'memory.get', key: 'customer/1' },
      { type: 'memory.query', pattern: 'customer/*' },
      { type: 'memory.get', key: 'missing' },
      { type: 'memory.history', key: 'customer/1' },
    ])
    assert.deepEqual(replies.map((r) => r.type), ['ack', 'result', 'result', 'error', 'result'])
    const [put, get, query, missing, history] = replies
    assert.equal(put?.entry?.version, 1)
    assert.deepEqual(get?.entry?.value, { plan: 'pro' })
    assert.deepEqual(query?.entries?.map((e) => e.key), ['customer/1'])
    assert.ok(missing?.error instanceof NotFoundError)
    assert.equal(history?.versions?.length, 1)
    assert.ok(replies.every((r) => r.replyTo), 'every message was given an id')
  })
})

describe('AMP', () => {
  test('create, get, patch, search, delete, with typed cells and errors', async () => {
    const ns = namespace()
    const writer = admin(services.url, ns)
    const agent = await writer.register({ name: 'writer' })
    const other = admin(services.url, ns)
    await other.register({ name: 'other' })

    const cell = await writer.amp.create('The user prefers TypeScript', {
      ownerId: 'u-1',
      metadata: { topic: 'languages' },
      importance: 0.8,
    })
    assert.equal(cell.identity.created_by, agent.id)
    assert.equal(cell.lifecycle.status, 'active')
    assert.equal((await writer.amp.get(cell.id)).scoring.access_count, 1)
    const patched = await writer.amp.patch(cell.id, { text: 'The user prefers TS and Go' })
    assert.equal(patched.content.text, 'The user prefers TS and Go')
    const found = await writer.amp.search({
      query: 'typescript go',
      ownerId: 'u-1',
      ownerType: 'user',
      mode: 'keyword',
      minScore: 0.5,
    })
    assert.deepEqual(found.results.map((hit) => hit.cell.id), [cell.id])
    assert.ok((found.results[0]?.decayScore ?? 0) > 0)
    assert.equal(found.degraded, undefined)
    await assert.rejects(writer.amp.search({ query: 'typescript', minScore: 2 }), (error) => {
      assert.ok(error instanceof InvalidRequestError)
      assert.equal(error.field, 'min_score')
      return true
    })
    assert.equal((await writer.amp.search({ metadata: { topic: 'languages' } })).results.length, 1)
    assert.deepEqual((await other.amp.search({ query: 'typescript' })).results, [])
    await assert.rejects(other.amp.get(cell.id), ForbiddenError)
    await assert.rejects(writer.amp.delete(cell.id), (error) => {
      assert.ok(error instanceof ConflictError)
      assert.equal(error.cellStatus, 'active')
      return true
    })
    await assert.rejects(writer.amp.patch(cell.id, { importance: 2 }), (error) => {
      assert.ok(error instanceof InvalidRequestError)
      assert.equal(error.field, 'scoring.importance')
      return true
    })
  })

  test("the acting agent is the client's; import reports refused cells", async () => {
    const gateway = new MEMP({ apiKey: ADMIN_KEY, namespace: namespace(), baseUrl: services.url })
    await assert.rejects(gateway.amp.create('x', { ownerId: 'u-1' }), InvalidRequestError)
    gateway.agent = { id: 'agent-alpha', name: 'alpha', framework: 'custom', namespace: 'n', createdAt: 0, lastSeen: 0 }
    const made = await gateway.amp.create('x', { ownerId: 'u-1' })
    assert.equal(made.identity.created_by, 'agent-alpha')
    const named = await gateway.amp.create('y', { ownerId: 'u-1', agent: 'agent-beta' })
    assert.equal(named.identity.created_by, 'agent-beta')
    const copy = { ...made, id: '01ARZ3NDEKTSV4RRFFQ69G5FAW' }
    const result = await gateway.amp.importCells([copy, made])
    assert.equal(result.imported, 1)
    assert.deepEqual(result.errors.map((e) => [e.index, e.error.code]), [[1, 'precondition_failed']])
    // Archived after two lifecycle passes (an admin pass, not in the SDK), then deletable.
    const low = await gateway.amp.create('fading', { ownerId: 'u-1', importance: 0.1 })
    for (const days of [1, 32]) {
      await rest(services.url, 'POST', '/amp/lifecycle/run', {
        as_of: new Date(Date.now() + days * 86_400_000).toISOString(),
      })
    }
    assert.equal((await gateway.amp.delete(low.id)).lifecycle.status, 'deleted')
  })

  test('merge makes one cell of the sources and archives them', async () => {
    const writer = admin(services.url, namespace())
    await writer.register({ name: 'merger' })
    const first = await writer.amp.create('Ana likes green tea', { ownerId: 'u-4' })
    const second = await writer.amp.create('Ana drinks tea every morning', { ownerId: 'u-4' })
    assert.ok(second.near_duplicates === null || Array.isArray(second.near_duplicates))
    const merged = await writer.amp.merge([first.id, second.id], 'Ana likes tea, every morning', {
      metadata: { topic: 'tea' },
      importance: 0.8,
    })
    assert.equal(merged.identity.owner_id, 'u-4')
    assert.deepEqual(merged.content.metadata, { topic: 'tea' })
    assert.equal(merged.scoring.importance, 0.8)
    assert.equal(merged.provenance.source_ref, `${first.id},${second.id}`)
    assert.equal((await writer.amp.get(first.id)).lifecycle.status, 'archived')
    await assert.rejects(writer.amp.merge([second.id, merged.id], 'again'), (error) => {
      assert.ok(error instanceof ConflictError)
      assert.equal(error.cellStatus, 'archived')
      return true
    })
    await assert.rejects(writer.amp.merge([merged.id], 'alone'), (error) => {
      assert.ok(error instanceof InvalidRequestError)
      assert.equal(error.field, 'ids')
      return true
    })
  })
})
