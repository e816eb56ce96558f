// The signed-in key: kept in this tab's sessionStorage only (gone when the tab closes), sent
// as a Bearer token by the SDK, never put in a URL.

import { MEMP } from '../vendor/memp-sdk.js'

const STORE = 'memp-console'

export function load() {
  try {
    const saved = JSON.parse(sessionStorage.getItem(STORE) ?? 'null')
    return saved && typeof saved.key === 'string' && typeof saved.namespace === 'string' ? saved : null
  } catch {
    return null
  }
}

export function save(session) {
  sessionStorage.setItem(STORE, JSON.stringify({ key: session.key, namespace: session.namespace }))
}

export function clear() {
  sessionStorage.removeItem(STORE)
}

/** An SDK client for the broker that served this page. */
export function client(session) {
  return new MEMP({
    apiKey: session.key,
    namespace: session.namespace,
    baseUrl: location.origin,
    maxRetries: 2,
    timeout: 15_000,
  })
}

/** What to show of a key: its kind and first characters, never the whole secret. */
export function describeKey(key) {
  const match = /^(memp_sk_[a-z0-9]+_)/i.exec(key)
  if (match) return `API key ${match[1]}${key.slice(match[1].length, match[1].length + 4)}…`
  if (key.split('.').length === 3) return 'JWT'
  return 'admin key'
}
