// Every operation of openapi.yaml has a method in this SDK (`x-sdk.js`), but those listed here;
// sdk-python/tests/test_parity.py checks the Python SDK the same way.

import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { resolve } from 'node:path'
import { test } from 'node:test'

import { parse } from 'yaml'

import { MEMP } from 'memp-sdk'

import { REPO_DIR } from './helpers.js'

// Operations no SDK method serves, and why.
const EXEMPT = {
  healthz: 'system: for load balancers and probes',
  readyz: 'system: for load balancers and probes',
  metrics: 'system: for Prometheus',
  getOpenapiYaml: 'system: the contract itself',
  getOpenapiJson: 'system: the contract itself',
  getDocs: 'system: the contract as a web page, for people',
  runCellLifecycle: 'AMP admin pass: run by the broker every interval',
  purgeMemoryCells: "AMP admin pass: erasure is an operator's decision",
  mcpPost: 'MCP: spoken by MCP clients',
  mcpGet: 'MCP: spoken by MCP clients',
  mcpDelete: 'MCP: spoken by MCP clients',
  consoleRedirect: 'the console: a page for browsers',
  getConsoleFile: 'the console: a page for browsers',
}

/** @type {any} */
const spec = parse(readFileSync(resolve(REPO_DIR, 'openapi.yaml'), 'utf8'))
/** @type {Record<string, any>} */
const operations = {}
for (const item of Object.values(spec.paths)) {
  for (const [method, operation] of Object.entries(/** @type {Record<string, any>} */ (item))) {
    if (['get', 'put', 'post', 'delete', 'patch'].includes(method)) {
      operations[operation.operationId] = operation
    }
  }
}

test('every operation has a method or is listed', () => {
  for (const name of Object.keys(EXEMPT)) assert.ok(operations[name], `${name} is no operation`)
  const missing = Object.entries(operations)
    .filter(([name, operation]) => !(name in EXEMPT) && !operation['x-sdk'])
    .map(([name]) => name)
  assert.deepEqual(missing, [], 'operations without an SDK method')
})

test('the methods exist', () => {
  const client = new MEMP({ apiKey: 'k', namespace: 'n', baseUrl: 'http://127.0.0.1:9' })
  for (const [name, operation] of Object.entries(operations)) {
    if (name in EXEMPT) continue
    /** @type {any} */
    let target = client
    for (const part of operation['x-sdk'].js.split('.')) target = target?.[part]
    assert.equal(typeof target, 'function', `${name}: ${operation['x-sdk'].js}`)
  }
})
