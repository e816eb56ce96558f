// The governance routes (proposals and the audit log), through the SDK's `proposals` and
// `audit` when the bundled SDK has them, else with the same Bearer token and error shape by
// hand (an SDK bundle from before governance).

import { MempError } from '../vendor/memp-sdk.js'

/** The broker has no such route at all (an older broker, or governance not deployed). */
export function noRoute(error) {
  return error?.status === 404 && error?.message === 'no such endpoint'
}

const blank = (value) => (value === '' || value === null ? undefined : value)

export function listProposals(client, { status, key, cursor, limit }) {
  const query = { status: blank(status), key: blank(key), cursor: blank(cursor), limit }
  if (client.proposals) return client.proposals.list(query)
  return request(client, 'GET', path(client.namespace, 'proposals'), { query })
}

export function getProposal(client, id) {
  if (client.proposals) return client.proposals.get(id)
  return request(client, 'GET', path(client.namespace, 'proposals', id))
}

/** Resolves to `{ proposal, entry }`. */
export function approveProposal(client, id, baseVersion = null) {
  if (client.proposals) return client.proposals.approve(id, { baseVersion: baseVersion ?? undefined })
  return request(client, 'POST', path(client.namespace, 'proposals', id, 'approve'),
    { body: baseVersion === null ? {} : { base_version: baseVersion } })
}

export function rejectProposal(client, id, reason) {
  if (client.proposals) return client.proposals.reject(id, reason)
  return request(client, 'POST', path(client.namespace, 'proposals', id, 'reject'), { body: { reason } })
}

export function listAudit(client, { since, until, actor, key, action, cursor, limit }) {
  const query = { since: blank(since), until: blank(until), actor: blank(actor), key: blank(key),
    action: blank(action), cursor: blank(cursor), limit }
  if (client.audit) return client.audit.list(query)
  return request(client, 'GET', path(client.namespace, 'audit'), { query })
}

export function verifyAudit(client) {
  if (client.audit) return client.audit.verify()
  return request(client, 'GET', path(client.namespace, 'audit', 'verify'))
}

const path = (namespace, ...parts) =>
  `/v1/namespaces/${encodeURIComponent(namespace)}/${parts.map(encodeURIComponent).join('/')}`

async function request(client, method, target, { query, body } = {}) {
  const url = new URL(target, location.origin)
  for (const [name, value] of Object.entries(query ?? {})) {
    if (value !== undefined) url.searchParams.set(name, String(value))
  }
  const headers = { Accept: 'application/json', Authorization: `Bearer ${client.apiKey}` }
  if (body !== undefined) headers['Content-Type'] = 'application/json'
  let response
  try {
    response = await fetch(url, {
      method, headers, cache: 'no-store', body: body === undefined ? undefined : JSON.stringify(body),
    })
  } catch (error) {
    throw new MempError(`could not reach the broker: ${error.message}`, { code: 'connection_error', cause: error })
  }
  const text = await response.text()
  let json = null
  try {
    json = text ? JSON.parse(text) : null
  } catch {
    json = null
  }
  if (response.ok) return json
  const error = json?.error ?? {}
  throw new MempError(error.message || response.statusText || `HTTP ${response.status}`, {
    code: error.code || 'internal', status: response.status, details: error.details ?? {},
  })
}
