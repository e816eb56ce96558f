// A subscription reports its connection's state (`connection`, `onConnection`): connecting,
// open, waiting while its broker is away, open again after a restart, closed at the end.

import assert from 'node:assert/strict'
import { test } from 'node:test'

import { MEMP } from 'memp-sdk'

import { admin, Broker, delay, namespace, useServices, WAIT } from './helpers.js'

const services = useServices()

/**
 * @param {() => boolean} check
 * @param {string} what
 */
async function until(check, what) {
  const deadline = Date.now() + 2 * WAIT
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await delay(20)
  }
}

test('the state follows the connection through a broker restart', async () => {
  const volatile = await Broker.start(services.redis.url)
  try {
    /** @type {string[]} */
    const states = []
    const client = admin(volatile.url, namespace())
    const events = client.subscribe('*', { onConnection: (state) => states.push(state) })
    assert.equal(events.connection, 'connecting')
    await events.open()
    assert.equal(events.connection, 'open')
    assert.deepEqual(states, ['open'])
    await volatile.stop('SIGKILL')
    const reading = (async () => {
      for await (const event of events) void event
    })()
    await until(() => states.includes('waiting'), 'waiting')
    await volatile.restart()
    await until(() => states.filter((s) => s === 'open').length === 2, 'open again')
    events.close()
    await reading
    assert.equal(events.connection, 'closed')
    assert.equal(states.at(-1), 'closed')
    assert.deepEqual([...new Set(states)].sort(), ['closed', 'connecting', 'open', 'waiting'])
  } finally {
    await volatile.stop()
  }
})

test('a refusal closes the subscription with its error', async () => {
  /** @type {string[]} */
  const states = []
  const client = new MEMP({ baseUrl: services.url, apiKey: 'memp_sk_live_forged', namespace: 'x' })
  const events = client.subscribe('*', { onConnection: (state) => states.push(state) })
  await assert.rejects(events.open(), { status: 401 })
  assert.equal(events.connection, 'closed')
  assert.equal(states.at(-1), 'closed')
})
