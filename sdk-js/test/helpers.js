// Test fixtures: a real redis-server and real broker processes on free ports, started by the
// tests themselves, and helpers to read subscriptions with deadlines.

import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { createServer, connect } from 'node:net'
import { tmpdir } from 'node:os'
import { dirname, resolve } from 'node:path'
import { after, afterEach, before } from 'node:test'
import { fileURLToPath } from 'node:url'

import { MEMP } from 'memp-sdk'

export const ADMIN_KEY = 'test-admin-key-0123456789'
export const SDK_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '..')
export const REPO_DIR = resolve(SDK_DIR, '..')
/** Milliseconds any single expectation may take before a test fails. */
export const WAIT = 20_000

/** The repository's Python: MEMP_PYTHON, else ../.venv/bin/python, else python3. */
export function python() {
  if (process.env.MEMP_PYTHON) return process.env.MEMP_PYTHON
  const venv = resolve(REPO_DIR, '.venv', 'bin', 'python')
  return existsSync(venv) ? venv : 'python3'
}

/** @type {Set<import('node:child_process').ChildProcess>} */
const children = new Set()
process.on('exit', () => {
  for (const child of children) child.kill('SIGKILL')
})

/** @returns {Promise<number>} */
export function freePort() {
  return new Promise((resolvePort, reject) => {
    const server = createServer()
    server.unref()
    server.on('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const address = server.address()
      const port = typeof address === 'object' && address ? address.port : 0
      server.close(() => resolvePort(port))
    })
  })
}

/** @param {number} ms */
export function delay(ms) {
  return new Promise((done) => setTimeout(done, ms))
}

/** @param {number} port */
function canConnect(port) {
  return new Promise((done) => {
    const socket = connect(port, '127.0.0.1')
    socket.once('connect', () => {
      socket.destroy()
      done(true)
    })
    socket.once('error', () => done(false))
  })
}

/**
 * @param {string} command
 * @param {string[]} args
 * @param {Record<string, string>} env
 */
function start(command, args, env = {}) {
  const child = spawn(command, args, {
    cwd: REPO_DIR,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  })
  children.add(child)
  let stderr = ''
  child.stderr?.setEncoding('utf8')
  child.stderr?.on('data', (chunk) => {
    stderr = (stderr + chunk).slice(-4000)
  })
  const exited = new Promise((done) => child.once('exit', (code, signal) => {
    children.delete(child)
    done(signal ?? code)
  }))
  return { child, exited, stderr: () => stderr }
}

/**
 * @param {{ child: import('node:child_process').ChildProcess, exited: Promise<unknown> }} proc
 * @param {NodeJS.Signals} signal
 */
async function stop(proc, signal = 'SIGTERM') {
  if (proc.child.exitCode !== null || proc.child.signalCode !== null) return
  proc.child.kill(signal)
  const timer = setTimeout(() => proc.child.kill('SIGKILL'), 10_000)
  await proc.exited
  clearTimeout(timer)
}

/** A redis-server that keeps nothing on disk; `restart()` brings it back on the same port. */
export class RedisServer {
  /** @param {number} port */
  constructor(port) {
    this.port = port
    this.url = `redis://127.0.0.1:${port}/0`
    /** @type {ReturnType<typeof start> | null} */
    this.proc = null
  }

  static async start() {
    const server = new RedisServer(await freePort())
    await server.restart()
    return server
  }

  async restart() {
    this.proc = start('redis-server', [
      '--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
      '--dir', tmpdir(),
    ])
    const deadline = Date.now() + WAIT
    while (!(await canConnect(this.port))) {
      if (this.proc.child.exitCode !== null) {
        throw new Error(`redis-server failed: ${this.proc.stderr()}`)
      }
      if (Date.now() > deadline) throw new Error('redis-server did not start')
      await delay(20)
    }
  }

  async stop() {
    if (this.proc) await stop(this.proc)
    this.proc = null
  }
}

/** `python -m broker.cli serve` on a port, against a Redis. */
export class Broker {
  /**
   * @param {number} port
   * @param {string} redisUrl
   * @param {Record<string, string>} env
   */
  constructor(port, redisUrl, env) {
    this.port = port
    this.redisUrl = redisUrl
    this.env = env
    this.url = `http://127.0.0.1:${port}`
    /** @type {ReturnType<typeof start> | null} */
    this.proc = null
    /** What `ready()` asks with (one trusting the broker's CA, for HTTPS). */
    this.fetch = globalThis.fetch
  }

  /**
   * @param {string} redisUrl
   * @param {{ port?: number, env?: Record<string, string> }} options
   */
  static async start(redisUrl, options = {}) {
    const broker = new Broker(options.port ?? (await freePort()), redisUrl, options.env ?? {})
    await broker.restart()
    return broker
  }

  /** Start (again) on the same port and Redis; resolves once it answers /readyz. */
  async restart() {
    this.proc = start(python(), ['-m', 'broker.cli', 'serve', '--port', String(this.port),
      '--log-level', 'warning'], {
      MEMP_REDIS_URL: this.redisUrl,
      MEMP_ADMIN_KEY: ADMIN_KEY,
      ...this.env,
    })
    await this.ready(this.proc)
  }

  /** @param {ReturnType<typeof start>} proc */
  async ready(proc) {
    const deadline = Date.now() + 30_000
    for (;;) {
      if (proc.child.exitCode !== null) {
        throw new Error(`the broker exited with ${proc.child.exitCode}: ${proc.stderr()}`)
      }
      try {
        const response = await this.fetch(`${this.url}/readyz`)
        await response.arrayBuffer()
        if (response.ok) return
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) throw new Error(`the broker did not start: ${proc.stderr()}`)
      await delay(50)
    }
  }

  /** Stop with SIGTERM (a graceful shutdown), or SIGKILL (a crash). */
  async stop(signal = /** @type {NodeJS.Signals} */ ('SIGTERM')) {
    if (this.proc) await stop(this.proc, signal)
    this.proc = null
  }
}

/**
 * A Redis and a broker for one test file; `stop()` ends both.
 * @param {Record<string, string>} env extra broker settings
 */
export async function startServices(env = {}) {
  const redis = await RedisServer.start()
  const broker = await Broker.start(redis.url, { env })
  return {
    redis,
    broker,
    async stop() {
      await broker.stop()
      await redis.stop()
    },
  }
}

/**
 * A test file's services: registers the hooks that start a Redis and a broker before the
 * file's tests (then runs `options.ready`), end every client `admin()` made after each test,
 * and stop both after the file's tests (`options.cleanup` first). Its `redis`, `broker` and
 * `url` (the broker's) are there once the tests run.
 * @param {{
 *   env?: Record<string, string>,
 *   ready?: (services: Services) => Promise<void> | void,
 *   cleanup?: () => Promise<void> | void,
 * }} options
 */
export function useServices(options = {}) {
  /** @type {Services | undefined} */
  let services
  before(async () => {
    services = await startServices(options.env)
    await options.ready?.(services)
  })
  afterEach(closeClients)
  after(async () => {
    await options.cleanup?.()
    await services?.stop()
  })
  const started = () => {
    if (!services) throw new Error('the services have not started yet')
    return services
  }
  return {
    get redis() { return started().redis },
    get broker() { return started().broker },
    get url() { return started().broker.url },
  }
}

/** @typedef {Awaited<ReturnType<typeof startServices>>} Services */

let counter = 0
/** A namespace no other test uses. */
export function namespace(prefix = 'ns') {
  counter += 1
  return `${prefix}-${process.pid}-${counter}`
}

/**
 * An admin client.
 * @param {string} baseUrl
 * @param {string} ns
 * @param {import('memp-sdk').MempOptions} options
 */
export function admin(baseUrl, ns, options = {}) {
  const client = new MEMP({ apiKey: ADMIN_KEY, namespace: ns, baseUrl, ...options })
  clients.add(client)
  return client
}

/** @type {Set<MEMP>} */
const clients = new Set()

/** Ends the subscriptions of every client `admin()` made (so a failed test leaves none open). */
export function closeClients() {
  for (const client of clients) client.close()
  clients.clear()
}

/**
 * A raw REST call with the admin key (for what the SDK does not wrap: config, schemas).
 * @param {string} baseUrl
 * @param {string} method
 * @param {string} path
 * @param {unknown} [body]
 */
export async function rest(baseUrl, method, path, body) {
  const response = await fetch(baseUrl + path, {
    method,
    headers: { Authorization: `Bearer ${ADMIN_KEY}`, 'Content-Type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  const text = await response.text()
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`)
  return text ? JSON.parse(text) : null
}

/**
 * The next `count` events of an iterator, failing if one takes longer than `timeout` ms.
 * @template T
 * @param {AsyncIterator<T>} iterator
 * @param {number} count
 * @param {number} timeout
 * @returns {Promise<T[]>}
 */
export async function take(iterator, count, timeout = WAIT) {
  /** @type {T[]} */
  const taken = []
  while (taken.length < count) {
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let timer
    const expired = new Promise((_, reject) => {
      timer = setTimeout(
        () => {
          const got = JSON.stringify(taken.map(describe))
          reject(new Error(`waited ${timeout} ms for item ${taken.length + 1} of ${count}; got ${got}`))
        },
        timeout,
      )
    })
    try {
      const item = await Promise.race([iterator.next(), expired])
      if (item.done) throw new Error(`the iterator ended after ${taken.length} of ${count} items`)
      taken.push(item.value)
    } finally {
      clearTimeout(timer)
    }
  }
  return taken
}

/** @param {any} event */
function describe(event) {
  return event && typeof event === 'object' && 'type' in event
    ? [event.type, event.key, event.version]
    : event
}
