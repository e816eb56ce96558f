// Proposals and the audit log through the JavaScript SDK, against a real broker.

import assert from 'node:assert/strict'
import { test } from 'node:test'

import { ApprovalPendingError, ConflictError, InvalidRequestError } from 'memp-sdk'

import { admin, namespace, useServices } from './helpers.js'

const services = useServices()

test('a gated put is a proposal; approving writes it; the audit log records it all', async () => {
  const broker = admin(services.url, namespace())
  await broker.namespaces.setConfig({
    rules: [{ pattern: 'facts/*', approval: 'required' }],
    allow_self_approval: true,
  })
  const pending = await broker.memory.put('facts/sky', { colour: 'blue' }).catch((error) => error)
  assert.ok(pending instanceof ApprovalPendingError)
  const proposal = pending.proposal
  assert.equal(proposal.status, 'pending')
  assert.deepEqual(proposal.diff, [{ op: 'add', path: '', value: { colour: 'blue' } }])
  const listed = await broker.proposals.list({ status: 'pending' })
  assert.deepEqual(
    listed.proposals.map((p) => p.id),
    [proposal.id],
  )
  assert.equal((await broker.proposals.get(proposal.id)).key, 'facts/sky')
  const approval = await broker.proposals.approve(proposal.id)
  assert.equal(approval.proposal.status, 'approved')
  assert.equal(approval.entry.version, 1)
  const entry = await broker.memory.getEntry('facts/sky')
  assert.equal(entry.proposalId, proposal.id)
  assert.equal(entry.approvedBy, 'admin')
  await assert.rejects(broker.proposals.approve(proposal.id), ConflictError)

  const rejected = await broker.memory.put('k', 1, { approvalRequired: true }).catch((e) => e)
  assert.equal((await broker.proposals.reject(rejected.proposal.id, 'no')).status, 'rejected')

  const page = await broker.audit.list({ key: 'facts/sky' })
  assert.deepEqual(
    page.records.map((r) => r.action),
    ['approve', 'put', 'propose'],
  )
  const all = await broker.audit.export()
  assert.ok(all.length >= 5)
  const verdict = await broker.audit.verify()
  assert.equal(verdict.ok, true)
  assert.equal(verdict.records, all.length)
})

test('an export after a record id has only what was appended since', async () => {
  const broker = admin(services.url, namespace())
  await broker.memory.put('notes/1', 1)
  const [newest] = await broker.audit.export()
  assert.ok(newest)
  await broker.memory.put('notes/2', 2)
  await broker.memory.delete('notes/1')
  const newer = await broker.audit.export({ after: newest.id })
  assert.deepEqual(
    newer.map((r) => [r.action, r.key]),
    [
      ['delete', 'notes/1'],
      ['put', 'notes/2'],
    ],
  )
  const [latest, earlier] = newer
  assert.ok(latest && earlier)
  assert.deepEqual(await broker.audit.export({ after: latest.id }), [])
  const page = await broker.audit.list({ after: newest.id, action: 'put' })
  assert.deepEqual(
    page.records.map((r) => r.id),
    [earlier.id],
  )
  for (const hostile of ['*'.repeat(128), '1-0\u0000', '99999999999999999999999-0', '1-2-3']) {
    const refused = await broker.audit.export({ after: hostile }).catch((error) => error)
    assert.ok(refused instanceof InvalidRequestError, String(refused))
    assert.deepEqual(refused.details, { parameter: 'after' })
  }
})
