// Fair share from the SDK: limits in the configuration, usage, and the typed 429s
// (RateLimitedError with retryAfter, resent when the wait is short; QuotaExceededError, never
// resent), against a real broker on real Redis.

import assert from 'node:assert/strict'
import { test } from 'node:test'

import {
  ApprovalPendingError,
  MEMP,
  NotFoundError,
  QuotaExceededError,
  RateLimitedError,
} from 'memp-sdk'

import { admin, namespace, useServices } from './helpers.js'

const services = useServices()

/** A client acting as a newly registered agent (the broker's admin key is exempt from rates).
 * @param {string} ns */
async function agent(ns) {
  const registrar = admin(services.url, ns)
  await registrar.register({ name: 'limited' })
  return new MEMP({ apiKey: registrar.apiKey ?? '', namespace: ns, baseUrl: services.url })
}

test('limits, usage and quota_exceeded', async () => {
  const ns = namespace('limits')
  const client = admin(services.url, ns)
  const stored = await client.namespaces.updateConfig({ limits: { max_keys: 1, max_bytes: 100 } })
  assert.deepEqual(stored.limits, { max_keys: 1, max_bytes: 100 })
  const writer = await agent(ns)
  await writer.memory.put('a', { n: 1 })
  await assert.rejects(writer.memory.put('b', { n: 2 }), (error) => {
    assert.ok(error instanceof QuotaExceededError)
    assert.equal(error.status, 429)
    assert.deepEqual([error.limit, error.used, error.maximum], ['max_keys', 1, 1])
    return true
  })
  const report = await client.namespaces.usage()
  assert.deepEqual(report.usage, {
    keys: 1,
    bytes: 7,
    streams: 0,
    proposals: 0,
    proposal_bytes: 0,
  })
  assert.equal(report.limits.max_keys, 1)
})

test('rate_limited is resent when the wait is short, and carries retryAfter when long', async () => {
  const ns = namespace('rates')
  const client = admin(services.url, ns)
  await client.namespaces.updateConfig({ limits: { writes_per_second: 2, write_burst: 1 } })
  const writer = await agent(ns)
  await writer.memory.put('a', 1)
  await writer.memory.put('b', 2) // 429 with Retry-After: 1, then applied when resent
  assert.equal(await client.memory.get('b'), 2)
  await client.namespaces.updateConfig({ limits: { writes_per_second: 0.001, write_burst: 1 } })
  const slow = await agent(ns)
  await slow.memory.put('c', 3)
  await assert.rejects(slow.memory.put('d', 4), (error) => {
    assert.ok(error instanceof RateLimitedError)
    assert.ok((error.retryAfter ?? 0) > 900)
    assert.equal(error.scope, 'namespace')
    return true
  })
  await assert.rejects(client.memory.getEntry('d'), NotFoundError)
})

test('a proposal takes a write token; an approval over a quota is quota_exceeded', async () => {
  const ns = namespace('proposals')
  const client = admin(services.url, ns)
  await client.namespaces.setConfig({
    rules: [{ pattern: 'facts/*', approval: 'required' }],
    limits: { writes_per_second: 0.001, write_burst: 1, max_keys: 0 },
  })
  const writer = await agent(ns)
  const pending = await writer.memory.put('facts/a', 1).catch((error) => error)
  assert.ok(pending instanceof ApprovalPendingError)
  await assert.rejects(writer.memory.put('facts/b', 2), (error) => {
    assert.ok(error instanceof RateLimitedError)
    assert.ok((error.retryAfter ?? 0) > 900)
    return true
  })
  await assert.rejects(client.proposals.approve(pending.proposal.id), (error) => {
    assert.ok(error instanceof QuotaExceededError)
    assert.deepEqual([error.limit, error.used, error.maximum], ['max_keys', 0, 0])
    return true
  })
  const listed = await client.proposals.list({ status: 'pending' })
  assert.deepEqual(
    listed.proposals.map((p) => p.id),
    [pending.proposal.id],
  )
})
