// HTTPS: a broker serving its own certificate (made by trustme), verified against the `ca`
// option, MEMP_CA_BUNDLE or NODE_EXTRA_CA_CERTS; one that cannot be verified fails at once,
// and a subscription ends with that error instead of reconnecting.

import assert from 'node:assert/strict'
import { execFile, execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, afterEach, before, describe, test } from 'node:test'
import { promisify } from 'node:util'

import { ConnectionFailedError, MEMP } from 'memp-sdk'
import { Agent, fetch as undiciFetch } from 'undici'

import { ADMIN_KEY, Broker, freePort, namespace, python, SDK_DIR, take } from './helpers.js'

const MAKE_CERTIFICATES = `
import sys, trustme
folder = sys.argv[1]
ca = trustme.CA()
ca.cert_pem.write_to_path(folder + "/ca.pem")
leaf = ca.issue_cert("127.0.0.1", "localhost")
leaf.private_key_pem.write_to_path(folder + "/key.pem")
for n, blob in enumerate(leaf.cert_chain_pems):
    blob.write_to_path(folder + "/cert.pem", append=n > 0)
trustme.CA().cert_pem.write_to_path(folder + "/stranger.pem")
`

const folder = mkdtempSync(join(tmpdir(), 'memp-tls-'))
const file = (/** @type {string} */ name) => join(folder, name)
/** @type {Broker} */
let broker
/** @type {string} */
let url
/** @type {MEMP[]} */
const clients = []

/** @param {import('memp-sdk').MempOptions} options */
function client(options = {}) {
  const made = new MEMP({ apiKey: ADMIN_KEY, namespace: namespace('tls'), baseUrl: url, ...options })
  clients.push(made)
  return made
}

before(async () => {
  execFileSync(python(), ['-c', MAKE_CERTIFICATES, folder])
  // The embedded store: `serve` with the certificate files, as an operator would run it.
  broker = new Broker(await freePort(), '', {
    MEMP_REDIS_URL: '',
    MEMP_TLS_CERT: file('cert.pem'),
    MEMP_TLS_KEY: file('key.pem'),
  })
  url = `https://127.0.0.1:${broker.port}`
  broker.url = url
  const dispatcher = new Agent({ connect: { ca: readFileSync(file('ca.pem'), 'utf8') } })
  broker.fetch = /** @type {typeof fetch} */ (
    /** @type {unknown} */ ((/** @type {string} */ input) => undiciFetch(input, { dispatcher })))
  await broker.restart()
})
afterEach(() => {
  for (const made of clients.splice(0)) made.close()
})
after(async () => {
  await broker?.stop()
  rmSync(folder, { recursive: true, force: true })
})

describe('verifying the broker', () => {
  test('the `ca` option trusts the CA that signed the broker', async () => {
    const memp = client({ ca: readFileSync(file('ca.pem')) })
    await memp.memory.put('customer/1', { plan: 'pro' })
    assert.deepEqual(await memp.memory.get('customer/1'), { plan: 'pro' })
  })

  test('MEMP_CA_BUNDLE names the CA file', async () => {
    process.env.MEMP_CA_BUNDLE = file('ca.pem')
    try {
      const memp = client()
      assert.equal((await memp.memory.put('k', 1)).version, 1)
    } finally {
      delete process.env.MEMP_CA_BUNDLE
    }
  })

  test('a certificate it cannot verify fails at once, not after retries', async () => {
    for (const [options, says] of /** @type {const} */ ([
      [{}, 'set MEMP_CA_BUNDLE'],
      [{ ca: readFileSync(file('stranger.pem'), 'utf8') }, 'the `ca` option does not vouch'],
    ])) {
      const memp = client({ ...options, maxRetries: 3 })
      memp.config.backoff = memp.config.maxBackoff = 30_000 // a retry would show
      const started = Date.now()
      await assert.rejects(memp.memory.get('k'), (error) => {
        assert.ok(error instanceof ConnectionFailedError)
        assert.match(error.message, /could not verify the certificate of the broker at https:/)
        assert.ok(error.message.includes(says), error.message)
        return true
      })
      assert.ok(Date.now() - started < 5_000)
    }
  })

  test('an unreadable MEMP_CA_BUNDLE is named, and `ca` with `fetch` is refused', async () => {
    process.env.MEMP_CA_BUNDLE = file('missing.pem')
    try {
      const memp = client()
      await assert.rejects(memp.memory.get('k'), /cannot read the CA bundle .*missing\.pem/)
    } finally {
      delete process.env.MEMP_CA_BUNDLE
    }
    assert.throws(() => new MEMP({ ca: 'x', fetch: globalThis.fetch }), TypeError)
  })

  test('NODE_EXTRA_CA_CERTS works too (Node reads it at start)', async () => {
    const program = `
      import { MEMP } from 'memp-sdk'
      const memp = new MEMP({ apiKey: process.env.KEY, namespace: 'tls-extra', baseUrl: process.env.URL })
      console.log((await memp.memory.put('k', 'v')).version)`
    const { stdout } = await promisify(execFile)(
      process.execPath, ['--input-type=module', '-e', program],
      { cwd: SDK_DIR, env: { ...process.env, NODE_EXTRA_CA_CERTS: file('ca.pem'), KEY: ADMIN_KEY, URL: url } },
    )
    assert.ok(Number(stdout.trim()) >= 1, stdout)
  })
})

describe('subscriptions over TLS', () => {
  test('resume from the last event id', async () => {
    const memp = client({ ca: readFileSync(file('ca.pem')) })
    const first = memp.subscribe('customer/*')
    await first.open()
    await memp.memory.put('customer/1', 1)
    const [event] = await take(first, 1)
    first.close()
    await memp.memory.put('customer/2', 2)
    await memp.memory.put('customer/3', 3)
    const resumed = memp.subscribe('customer/*', { lastEventId: event?.id ?? undefined })
    const keys = (await take(resumed, 2)).map((e) => e.key)
    assert.deepEqual(keys, ['customer/2', 'customer/3'])
  })

  test('a broker it cannot verify ends the subscription with the error', async () => {
    const memp = client()
    await assert.rejects(memp.subscribe('*').open(), (error) => {
      assert.ok(error instanceof ConnectionFailedError)
      assert.match(error.message, /could not verify the certificate/)
      return true
    })
  })
})
