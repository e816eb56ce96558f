// The SDK's types against the contract: the interfaces in src/models.ts (read with the
// TypeScript compiler API) and the exported enum constants are checked against the broker's
// openapi.yaml, so they cannot drift apart.

import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { createServer } from 'node:http'
import { resolve } from 'node:path'
import { describe, test } from 'node:test'

import ts from 'typescript'
import { parse } from 'yaml'

import {
  CURSOR_EVENT_TYPES,
  END_EVENT_TYPES,
  ERROR_CODES,
  EVENT_TYPES,
  MEMP,
  MempError,
  PERMISSIONS,
  SchemaViolationError,
  WARNINGS,
} from 'memp-sdk'

import { REPO_DIR, SDK_DIR } from './helpers.js'

/** @type {any} */
const spec = parse(readFileSync(resolve(REPO_DIR, 'openapi.yaml'), 'utf8'))
/** @type {Record<string, any>} */
const schemas = spec.components.schemas
const MODELS = resolve(SDK_DIR, 'src', 'models.ts')
const source = ts.createSourceFile(MODELS, readFileSync(MODELS, 'utf8'), ts.ScriptTarget.Latest, true)

// Each wire (snake_case) interface and the component it reads.
const WIRE = {
  WireEntry: 'EntryFields',
  WireAgent: 'Agent',
  WireApiKey: 'ApiKeyRecord',
  WireCredentials: 'Credentials',
}
// Each camelCase interface the SDK hands out, its component, and the fields only the SDK adds.
/** @type {Record<string, [string, string[]]>} */
const PUBLIC = {
  Entry: ['EntryFields', ['warnings']],
  Agent: ['Agent', []],
  Credentials: ['Credentials', []],
  ApiKey: ['ApiKeyRecord', []],
  CreatedKey: ['CreatedKey', []],
  Grant: ['Grant', []],
  Page: ['Page', []],
  Conflict: ['Conflict', []],
  SchemaError: ['SchemaErrorDetail', []],
}
const SDK_ONLY = ['MempEvent'] // built from SSE frames by the subscription

/** @param {any} schema */
function deref(schema) {
  while (schema && schema.$ref) schema = schemas[schema.$ref.split('/').pop()]
  return schema
}

/**
 * A schema's properties and required names, its `allOf` parts included.
 * @param {any} schema
 * @returns {{ properties: Record<string, any>, required: Set<string> }}
 */
function shape(schema) {
  /** @type {Record<string, any>} */
  const properties = {}
  const required = new Set()
  for (const part of [...(deref(schema).allOf ?? []), deref(schema)]) {
    const resolved = deref(part)
    Object.assign(properties, resolved.properties ?? {})
    for (const name of resolved.required ?? []) required.add(name)
  }
  return { properties, required }
}

/**
 * The JSON types a schema allows; null for any JSON value.
 * @param {any} schema
 * @returns {Set<string> | null}
 */
function jsonTypes(schema) {
  schema = deref(schema)
  if (schema.enum) return new Set(schema.enum.map(jsonType))
  if ('const' in schema) return new Set([jsonType(schema.const)])
  if (schema.type) return new Set([schema.type].flat())
  for (const combined of ['oneOf', 'anyOf']) {
    if (!schema[combined]) continue
    const parts = schema[combined].map(jsonTypes)
    return parts.includes(null) ? null : new Set(parts.flatMap((/** @type {Set<string>} */ p) => [...p]))
  }
  for (const part of schema.allOf ?? []) {
    const found = jsonTypes(part)
    if (found) return found
  }
  return null
}

/** @param {unknown} value */
function jsonType(value) {
  if (value === null) return 'null'
  if (Array.isArray(value)) return 'array'
  if (typeof value === 'number') return Number.isInteger(value) ? 'integer' : 'number'
  return typeof value
}

/**
 * The JSON types a TypeScript type takes; null for anything.
 * @param {ts.TypeNode} node
 * @returns {Set<string> | null}
 */
function accepted(node) {
  if (ts.isUnionTypeNode(node)) {
    const parts = node.types.map(accepted)
    return parts.includes(null) ? null : new Set(parts.flatMap((p) => [...(p ?? [])]))
  }
  if (ts.isLiteralTypeNode(node)) {
    if (node.literal.kind === ts.SyntaxKind.NullKeyword) return new Set(['null'])
    if (ts.isStringLiteral(node.literal)) return new Set(['string'])
  }
  if (ts.isArrayTypeNode(node)) return new Set(['array'])
  if (ts.isTypeLiteralNode(node)) return new Set(['object'])
  switch (node.kind) {
    case ts.SyntaxKind.StringKeyword:
      return new Set(['string'])
    case ts.SyntaxKind.NumberKeyword:
      return new Set(['number', 'integer'])
    case ts.SyntaxKind.BooleanKeyword:
      return new Set(['boolean'])
    case ts.SyntaxKind.UnknownKeyword:
    case ts.SyntaxKind.AnyKeyword:
      return null
  }
  if (ts.isTypeReferenceNode(node)) {
    const name = node.typeName.getText(source)
    if (name === 'T') return null // the caller's value type
    if (name === 'Permission' || name === 'Warning') return new Set(['string'])
    return new Set(['object']) // another interface of this module
  }
  throw new Error(`no JSON type known for ${node.getText(source)}`)
}

/**
 * The interfaces of src/models.ts: each property, whether it is optional, and its type.
 * @returns {Map<string, Map<string, { optional: boolean, type: ts.TypeNode }>>}
 */
function interfaces() {
  const found = new Map()
  for (const statement of source.statements) {
    if (ts.isInterfaceDeclaration(statement)) found.set(statement.name.text, members(statement))
  }
  return found
}

/** @param {ts.InterfaceDeclaration | ts.TypeLiteralNode} node */
function members(node) {
  const found = new Map()
  for (const member of node.members) {
    if (!ts.isPropertySignature(member) || !member.type) continue
    found.set(member.name.getText(source), { optional: !!member.questionToken, type: member.type })
  }
  return found
}

/** @param {string} name */
function camel(name) {
  return name.replace(/_([a-z])/g, (_, letter) => letter.toUpperCase())
}

/**
 * Where a type fails to take what the document says the broker sends.
 * @param {string} where
 * @param {ts.TypeNode} node
 * @param {any} schema
 * @returns {string[]}
 */
function problems(where, node, schema) {
  const found = []
  const sent = jsonTypes(schema)
  const taken = accepted(node)
  if (taken && (!sent || [...sent].some((kind) => !taken.has(kind)))) {
    found.push(`${where}: ${node.getText(source)} does not take ${[...(sent ?? ['any JSON'])]}`)
  }
  const array = ts.isUnionTypeNode(node) ? node.types.find(ts.isArrayTypeNode) : node
  const items = deref(schema).items
  if (array && ts.isArrayTypeNode(array) && items && ts.isTypeLiteralNode(array.elementType)) {
    found.push(...wireProblems(`${where}[]`, members(array.elementType), items))
  }
  return found
}

/**
 * A wire interface against its schema: the same names, optional where the broker may leave a
 * field out, and each type taking what the broker sends.
 * @param {string} where
 * @param {Map<string, { optional: boolean, type: ts.TypeNode }>} fields
 * @param {any} schema
 */
function wireProblems(where, fields, schema) {
  const { properties, required } = shape(schema)
  const found = []
  assert.deepEqual([...fields.keys()].sort(), Object.keys(properties).sort(), where)
  for (const [name, field] of fields) {
    if (!field.optional && !required.has(name)) {
      found.push(`${where}.${name} is required, but the broker may leave it out`)
    }
    found.push(...problems(`${where}.${name}`, field.type, properties[name]))
  }
  return found
}

describe('the SDK against openapi.yaml', () => {
  const declared = interfaces()

  test('every interface of models.ts is checked', () => {
    const checked = [...Object.keys(WIRE), ...Object.keys(PUBLIC), ...SDK_ONLY]
    assert.deepEqual([...declared.keys()].sort(), checked.sort())
  })

  for (const [name, component] of Object.entries(WIRE)) {
    test(`${name} reads ${component}`, () => {
      const fields = declared.get(name)
      assert.ok(fields, name)
      assert.deepEqual(wireProblems(name, fields, schemas[component]), [])
    })
  }

  for (const [name, [component, extras]] of Object.entries(PUBLIC)) {
    test(`${name} is ${component} in camelCase`, () => {
      const fields = declared.get(name)
      assert.ok(fields, name)
      const { properties, required } = shape(schemas[component])
      const expected = Object.keys(properties).map(camel)
      assert.deepEqual([...fields.keys()].filter((f) => !extras.includes(f)).sort(), expected.sort())
      const found = []
      for (const [wire, schema] of Object.entries(properties)) {
        const field = fields.get(camel(wire))
        assert.ok(field && !field.optional, `${name}.${camel(wire)} is always there`)
        // what the broker may leave out is handed out as null
        const sent = required.has(wire) ? schema : { anyOf: [schema, { type: 'null' }] }
        found.push(...problems(`${name}.${camel(wire)}`, field.type, sent))
      }
      assert.deepEqual(found, [])
    })
  }

  test('PERMISSIONS are the Permission enum', () => {
    assert.deepEqual([...PERMISSIONS].sort(), [...schemas.Permission.enum].sort())
  })

  test('WARNINGS are the Warning enum', () => {
    assert.deepEqual([...WARNINGS].sort(), [...schemas.Warning.enum].sort())
  })

  test('ERROR_CODES are the ErrorCode enum', () => {
    assert.deepEqual([...ERROR_CODES].sort(), [...schemas.ErrorCode.enum].sort())
  })

  test('the event types handed out, resumed after and only moving the cursor are every event the stream sends', () => {
    const stream = spec.paths['/v1/subscribe'].get.responses['200'].content['text/event-stream']
    const known = [...EVENT_TYPES, ...END_EVENT_TYPES, ...CURSOR_EVENT_TYPES]
    assert.equal(new Set(known).size, known.length)
    assert.deepEqual(known.sort(), Object.keys(stream['x-events']).sort())
  })
})

describe('error codes pick the error class', () => {
  test('a 422 that is not a schema violation is no SchemaViolationError', async () => {
    /** @type {[number, string, Function][]} */
    const replies = [
      [422, 'schema_violation', SchemaViolationError],
      [422, 'schema_timeout', MempError],
      [422, 'idempotency_key_reused', MempError],
      [405, 'method_not_allowed', MempError],
    ]
    let next = 0
    const server = createServer((request, response) => {
      const [status, code] = replies[next++] ?? [500, 'internal']
      response.writeHead(status, { 'content-type': 'application/json' })
      response.end(JSON.stringify({ error: { code, message: 'why', details: { n: 1 } } }))
    })
    await new Promise((done) => server.listen(0, '127.0.0.1', () => done(null)))
    try {
      const address = server.address()
      const port = typeof address === 'object' && address ? address.port : 0
      const broker = new MEMP({ apiKey: 'k', namespace: 'n', baseUrl: `http://127.0.0.1:${port}` })
      for (const [status, code, kind] of replies) {
        const error = await broker.memory.get('k').then(
          () => assert.fail(`expected ${code}`),
          (/** @type {unknown} */ error) => error,
        )
        assert.ok(error instanceof MempError)
        assert.equal(error.constructor, kind, code)
        assert.deepEqual([error.status, error.code, error.message, error.details],
          [status, code, 'why', { n: 1 }])
      }
    } finally {
      server.close()
      server.closeAllConnections()
    }
  })
})
