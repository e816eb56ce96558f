// Type-level tests of the published declarations (dist/*.d.ts, imported as 'memp-sdk'); checked
// by `tsc --noEmit` in `npm test`, never run.

import {
  ConflictError,
  MEMP,
  MempError,
  QueryResult,
  Subscription,
  type Agent,
  type Entry,
  type MempEvent,
  type Page,
} from 'memp-sdk'

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false
function expectType<T extends true>(): T | void {}

interface Customer {
  plan: string
  acv: number
}

export async function check(): Promise<void> {
  const broker = new MEMP({ apiKey: process.env['MEMP_API_KEY'], namespace: 'my-app' })

  const agent = await broker.register({ name: 'my-agent', framework: 'langchain' })
  expectType<Equal<typeof agent, Agent>>()

  const written = await broker.memory.put<Customer>('customer/1', { plan: 'pro', acv: 1 }, {
    ttlSeconds: 60, ifVersion: 1, ifAbsent: false, baseVersion: 1, timestamp: new Date(),
  })
  expectType<Equal<typeof written, Entry<Customer>>>()
  expectType<Equal<typeof written.warnings, Entry['warnings']>>()

  const value = await broker.memory.get<Customer>('customer/1')
  expectType<Equal<typeof value, Customer>>()
  const untyped = await broker.memory.get('customer/1')
  expectType<Equal<typeof untyped, any>>()

  const query = broker.memory.query<Customer>('customer/*')
  expectType<Equal<typeof query, QueryResult<Customer>>>()
  const all = await query
  expectType<Equal<typeof all, Entry<Customer>[]>>()
  for await (const entry of query) expectType<Equal<typeof entry, Entry<Customer>>>()
  for await (const page of query.pages()) expectType<Equal<typeof page, Page<Customer>>>()

  const events = broker.subscribe<Customer>('customer/*', { snapshot: true })
  expectType<Equal<typeof events, Subscription<Customer>>>()
  for await (const event of events) {
    expectType<Equal<typeof event, MempEvent<Customer>>>()
    expectType<Equal<typeof event.value, Customer | null>>()
  }

  try {
    await broker.memory.delete('customer/1', { ifVersion: 2 })
  } catch (error) {
    if (error instanceof ConflictError) expectType<Equal<typeof error.winner, Entry | null>>()
    if (error instanceof MempError) expectType<Equal<typeof error.status, number | null>>()
  }

  // @ts-expect-error: unknown put options are refused
  await broker.memory.put('k', 1, { ttl: 5 })
  // @ts-expect-error: an API key is a string
  new MEMP({ apiKey: 1 })
  // @ts-expect-error: subscribe options are checked
  broker.subscribe('x', { snapshots: true })
}
