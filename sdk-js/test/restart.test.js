// A subscription survives its broker being killed and restarted on the same port and Redis,
// while writers keep writing: every change arrives once, in order, none lost, none doubled.

import assert from 'node:assert/strict'
import { test } from 'node:test'

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

test('a subscription survives broker restarts with no lost or doubled event', async () => {
  const ns = namespace()
  // The subscriber's broker is the one that gets killed; `stable` keeps serving one writer.
  const volatile = await Broker.start(services.redis.url)
  const stable = services.broker
  try {
    const reader = admin(volatile.url, ns)
    // Writer A goes through the stable broker, so changes keep coming while the subscriber's
    // broker is down; writer B goes through the restarting one and retries across the gap
    // (same Idempotency-Key, so a write cut off mid-flight is applied once).
    const writerA = admin(stable.url, ns)
    const writerB = admin(volatile.url, ns, { maxRetries: 30 })

    /** @type {import('memp-sdk').ConnectionState[]} */
    const states = []
    const events = await reader.subscribe(['a/*', 'b/*'], { onState: (state) => states.push(state) }).open()
    /** @type {import('memp-sdk').MempEvent[]} */
    const received = []
    const reading = (async () => {
      for await (const event of events) received.push(event)
    })()

    let writing = true
    let sentA = 0
    let sentB = 0
    const loopA = (async () => {
      while (writing) {
        await writerA.memory.put(`a/${sentA}`, sentA)
        sentA += 1
        await delay(10)
      }
    })()
    const loopB = (async () => {
      while (writing) {
        await writerB.memory.put(`b/${sentB}`, sentB)
        sentB += 1
        await delay(10)
      }
    })()

    await until(() => received.length >= 20, '20 events before the first restart')
    await volatile.stop('SIGKILL') // a crash: the stream breaks mid-flight
    await delay(300)
    await volatile.restart()
    const afterCrash = received.length
    await until(() => received.length >= afterCrash + 20, 'events after the crash')

    await volatile.stop('SIGTERM') // a graceful shutdown: the broker says `shutdown`
    await delay(300)
    await volatile.restart()
    const afterStop = received.length
    await until(() => received.length >= afterStop + 20, 'events after the shutdown')

    writing = false
    await Promise.all([loopA, loopB])
    await writerA.memory.put('a/end', 'end')
    await until(() => received.at(-1)?.key === 'a/end', 'the last event')
    events.close()
    await reading

    const values = (/** @type {string} */ prefix) =>
      received.filter((e) => e.key?.startsWith(`${prefix}/`) && e.key !== 'a/end').map((e) => e.value)
    assert.deepEqual(values('a'), Array.from({ length: sentA }, (_, n) => n))
    assert.deepEqual(values('b'), Array.from({ length: sentB }, (_, n) => n))
    assert.equal(received.length, sentA + sentB + 1)
    assert.ok(received.every((e) => e.type === 'put' && e.version === 1))
    assert.equal(new Set(received.map((e) => e.id)).size, received.length, 'no event twice')
    assert.ok(events.attempts >= 3, `reconnected (${events.attempts} connections)`)
    // After a stream that worked, the tries count from 1 again.
    const tries = states.filter((s) => s.status === 'reconnecting').map((s) => s.attempt)
    assert.ok(tries.length >= 2 && tries.every((n) => n >= 1), `attempts ${tries}`)
    assert.equal(tries[0], 1)

    // Writer B's retries were applied once each: every key holds version 1.
    const stored = await writerA.memory.query('b/*')
    assert.equal(stored.length, sentB)
    assert.ok(stored.every((e) => e.version === 1))
  } finally {
    await volatile.stop()
  }
})
