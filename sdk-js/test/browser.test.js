// The browser bundle in a real headless Chromium (Debian's `chromium`, driven by playwright-core
// through its executable): the example page follows a namespace, receives a write made from
// outside, writes a value and sees its own event; a page on an origin the broker does not allow
// gets a CORS refusal instead of retrying forever. Skipped, with the reason, without Chromium.

import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { createServer } from 'node:http'
import { extname, join, normalize } from 'node:path'
import { after, before, describe, test } from 'node:test'

import { admin, freePort, namespace, SDK_DIR, useServices, WAIT } from './helpers.js'

/** The Chromium to drive: MEMP_CHROMIUM, else the first of Debian's names on PATH. */
function chromium() {
  if (process.env.MEMP_CHROMIUM) return process.env.MEMP_CHROMIUM
  for (const name of ['chromium', 'chromium-browser', 'google-chrome']) {
    try {
      return execFileSync('which', [name], { encoding: 'utf8' }).trim() || null
    } catch {
      // not this one
    }
  }
  return null
}

const executable = chromium()
const skip = executable
  ? false
  : 'no Chromium found: install Debian\'s chromium package (apt-get install chromium) or set MEMP_CHROMIUM'

// The page's own port, fixed before the broker starts: its origin is the one the broker allows.
const pagePort = await freePort()

/** @type {Record<string, string>} */
const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.map': 'application/json' }

/** Serves sdk-js/ (the example page and the bundle) on a port of its own: another origin. */
/** @param {number} port */
async function staticServer(port) {
  const server = createServer((request, response) => {
    const path = normalize(decodeURIComponent(new URL(request.url ?? '/', 'http://x').pathname))
    const file = join(SDK_DIR, path)
    if (!file.startsWith(SDK_DIR) || !existsSync(file)) {
      response.writeHead(404).end()
      return
    }
    response.writeHead(200, { 'Content-Type': TYPES[extname(file)] ?? 'application/octet-stream' })
    response.end(readFileSync(file))
  })
  await new Promise((resolve) => server.listen(port, '127.0.0.1', () => resolve(undefined)))
  return { port, close: () => new Promise((resolve) => server.close(() => resolve(undefined))) }
}

describe('the browser bundle in Chromium', { skip }, () => {
  /** @type {Awaited<ReturnType<typeof staticServer>>} */
  let pages
  /** @type {import('playwright-core').Browser} */
  let browser
  const services = useServices({ env: { MEMP_CORS_ORIGINS: `http://127.0.0.1:${pagePort}` } })

  before(async () => {
    pages = await staticServer(pagePort)
    const { chromium: driver } = await import('playwright-core')
    browser = await driver.launch({ executablePath: /** @type {string} */ (executable), headless: true,
      args: ['--no-sandbox'] })
  })

  after(async () => {
    await browser?.close()
    await pages?.close()
  })

  /** @param {string} host @param {string} key @param {string} ns */
  async function openPage(host, key, ns) {
    const page = await browser.newPage()
    const query = new URLSearchParams({ broker: services.url, key, namespace: ns })
    await page.goto(`http://${host}:${pagePort}/examples/browser.html?${query}`)
    return page
  }

  test('the example page follows, receives, writes and sees its own event', async () => {
    const ns = namespace('browser')
    const root = admin(services.url, ns)
    const created = await root.keys.create({
      grants: [{ namespace: ns, permissions: ['read', 'write', 'subscribe'] }], name: 'page',
    })
    const page = await openPage('127.0.0.1', created.apiKey, ns)
    await page.waitForFunction(() => /** @type {any} */ (globalThis).memp?.state === 'connected', null,
      { timeout: WAIT })

    await root.memory.put('from/outside', { n: 1 })
    await page.waitForFunction(
      () => /** @type {any} */ (globalThis).memp.events.some((/** @type {any} */ e) => e.key === 'from/outside'), null, { timeout: WAIT })

    await page.fill('input[name=key]', 'from/page')
    await page.fill('input[name=value]', '{"n": 2}')
    await page.click('button')
    await page.waitForFunction(
      () => /** @type {any} */ (globalThis).memp.events.some((/** @type {any} */ e) => e.key === 'from/page'), null, { timeout: WAIT })
    assert.deepEqual(await root.memory.get('from/page'), { n: 2 })
    const seen = await page.evaluate(() => /** @type {any} */ (globalThis).memp.events.map((/** @type {any} */ e) => [e.type, e.key, e.value]))
    assert.deepEqual(seen, [['put', 'from/outside', { n: 1 }], ['put', 'from/page', { n: 2 }]])
    assert.deepEqual(await page.evaluate(() => /** @type {any} */ (globalThis).memp.errors), [])

    // The broker's CORS headers, as the browser saw them on the page's own request.
    const allowed = await page.evaluate(async (url) => {
      const response = await fetch(`${url}/healthz`)
      return response.ok
    }, services.url)
    assert.equal(allowed, true)
    await page.close()
  })

  test('a page on an origin the broker does not allow is told so, not retried', async () => {
    const ns = namespace('browser')
    // localhost and 127.0.0.1 are different origins; only the latter is allowed.
    const page = await openPage('localhost', 'test-admin-key-0123456789', ns)
    await page.waitForFunction(() => /** @type {any} */ (globalThis).memp?.errors.length > 0, null, { timeout: WAIT })
    const [error] = await page.evaluate(() => /** @type {any} */ (globalThis).memp.errors)
    assert.equal(error.code, 'cors_refused')
    assert.equal(error.name, 'CorsRefusedError')
    assert.match(error.message, /MEMP_CORS_ORIGINS/)
    assert.equal(await page.evaluate(() => /** @type {any} */ (globalThis).memp.state), 'closed')
    await page.close()
  })
})
