// The MEMP draft's JavaScript example ("SDK Reference → JavaScript / TypeScript") runs as
// written against a live broker: examples/draft.js is those lines verbatim, run as a program,
// and the same calls are run here with their results checked.

import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { resolve } from 'node:path'
import { test } from 'node:test'

import { MEMP } from 'memp-sdk'

import {
  admin, ADMIN_KEY, delay, REPO_DIR, rest, SDK_DIR, useServices, WAIT,
} from './helpers.js'

const EXAMPLE = resolve(SDK_DIR, 'examples', 'draft.js')
const SEED = resolve(REPO_DIR, '..', 'shared', 'seeds', 'memp-protocol-draft.txt')

const services = useServices({
  // The example reads its key from MEMP_API_KEY and finds the broker through MEMP_BASE_URL.
  async ready({ broker }) {
    const created = await rest(broker.url, 'POST', '/v1/keys', {
      name: 'draft example',
      grants: [{ namespace: 'my-app', permissions: ['read', 'write', 'subscribe'] }],
    })
    process.env.MEMP_API_KEY = created.api_key
    process.env.MEMP_BASE_URL = broker.url
  },
  cleanup() {
    delete process.env.MEMP_API_KEY
    delete process.env.MEMP_BASE_URL
  },
})

const noSeed = !existsSync(SEED) && 'the draft is not beside the repository'
test('examples/draft.js is the draft example, verbatim', { skip: noSeed }, () => {
  const seed = readFileSync(SEED, 'utf8')
  const example = readFileSync(EXAMPLE, 'utf8')
  assert.ok(example.startsWith("import { MEMP } from 'memp-sdk'"))
  assert.ok(seed.includes(example.trimEnd()), 'examples/draft.js is a verbatim excerpt of the draft')
})

test('the draft example runs as a program', async () => {
  const child = spawn(process.execPath, [EXAMPLE], {
    cwd: SDK_DIR,
    env: { ...process.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (chunk) => { stdout += chunk })
  child.stderr.setEncoding('utf8').on('data', (chunk) => { stderr += chunk })
  const exited = new Promise((done) => child.once('exit', done))
  try {
    const watcher = new MEMP({ apiKey: ADMIN_KEY, namespace: 'my-app', baseUrl: services.url })
    // It registers, publishes, reads and queries, then subscribes; a change made once the
    // stream is open is printed. Keep publishing until one is.
    const deadline = Date.now() + WAIT
    let n = 0
    while (!stdout.includes('New memory:')) {
      if (child.exitCode !== null) assert.fail(`the example exited with ${child.exitCode}: ${stderr}`)
      if (Date.now() > deadline) assert.fail(`nothing printed; stderr: ${stderr}`)
      if (stdout === '') {
        try {
          await watcher.memory.get('customer/123')
          await watcher.memory.put('customer/live', { n: n++ })
        } catch {
          // not published yet
        }
      }
      await delay(100)
    }
    assert.match(stdout, /^New memory: \{ n: \d+ \}$/m)
    assert.equal(stderr, '')

    const entry = await watcher.memory.getEntry('customer/123')
    assert.deepEqual(entry.value, { plan: 'pro', acv: 12000 })
    const agents = (await rest(services.url, 'GET', '/v1/namespaces/my-app/agents')).agents
    const agent = agents.find((/** @type {{ id: string }} */ a) => a.id === entry.agentId)
    assert.ok(agent, 'customer/123 was written by the agent the example registered')
    assert.equal(agent.name, 'my-agent')
    assert.equal(agent.framework, 'langchain')
  } finally {
    child.kill('SIGTERM')
    await exited
  }
})

test('the draft example, line by line, with its results checked', async () => {
  const writer = admin(services.url, 'my-app')

  const broker = new MEMP({
    apiKey: process.env.MEMP_API_KEY,
    namespace: 'my-app'
  })

  // Register
  await broker.register({ name: 'my-agent', framework: 'langchain' })
  assert.equal(broker.agent?.name, 'my-agent')
  assert.equal(broker.config.baseUrl, services.url)

  // Publish
  await broker.memory.put('customer/123', { plan: 'pro', acv: 12000 })

  // Read
  const data = await broker.memory.get('customer/123')
  assert.deepEqual(data, { plan: 'pro', acv: 12000 })

  // Query
  const results = await broker.memory.query('customer/*')
  assert.ok(Array.isArray(results))
  const customer = results.find((entry) => entry.key === 'customer/123')
  assert.deepEqual(customer?.value, { plan: 'pro', acv: 12000 })
  assert.equal(customer?.agentId, broker.agent?.id)

  // Subscribe (Server-Sent Events): another agent publishes until the stream delivers it.
  let publishing = true
  const publisher = (async () => {
    for (let n = 0; publishing; n++) {
      await writer.memory.put('customer/456', { plan: 'free', n })
      await delay(100)
    }
  })()
  /** @type {unknown[]} */
  const printed = []
  try {
    for await (const event of broker.subscribe('customer/*')) {
      printed.push(['New memory:', event.value])
      break
    }
  } finally {
    publishing = false
    await publisher
  }
  assert.equal(printed.length, 1)
  assert.deepEqual(Object.keys(/** @type {any} */ (printed[0])[1]), ['plan', 'n'])
})
