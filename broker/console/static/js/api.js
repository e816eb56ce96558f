// Calls the SDK has no method for yet (the governance routes: proposals and the audit log),
// made the way the SDK makes them: the same Bearer token, JSON, and the broker's error shape.

import { MempError } from '../vendor/memp-sdk.js'

/** One request to the broker; resolves to the JSON reply, rejects with a MempError. */
export async function request(client, method, path, { query, body, signal } = {}) {
  const url = new URL(path, location.origin)
  for (const [name, value] of Object.entries(query ?? {})) {
    if (value !== undefined && value !== null && value !== '') url.searchParams.set(name, String(value))
  }
  const headers = { Accept: 'application/json', Authorization: `Bearer ${client.apiKey}` }
  if (body !== undefined) headers['Content-Type'] = 'application/json'
  let response
  try {
    response = await fetch(url, {
      method, headers, signal, cache: 'no-store',
      body: body === undefined ? undefined : JSON.stringify(body),
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

/** The broker has no such route at all (an older broker, or governance not deployed). */
export function noRoute(error) {
  return error?.status === 404 && error?.message === 'no such endpoint'
}

export const path = (namespace, ...parts) =>
  `/v1/namespaces/${encodeURIComponent(namespace)}/${parts.map(encodeURIComponent).join('/')}`
