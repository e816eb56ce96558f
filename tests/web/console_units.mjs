// Unit checks of the console's pure modules (diffs, patches, patterns), run by
// tests/web/test_console.py with Node.js: `node --test tests/web/console_units.mjs`.

import assert from 'node:assert/strict'
import { test } from 'node:test'

import { applyPatch, jsonPatch, lineDiff } from '../../broker/web/console/static/js/diff.js'
import { matches, validPattern } from '../../broker/web/console/static/js/patterns.js'

test('a JSON Patch from one value to another applies back to the second', () => {
  const pairs = [
    [{ a: 1, b: [1], d: { e: { f: 1 } } }, { a: 2, c: 3, d: { e: { g: 2 } } }],
    [null, { x: 1 }],
    [{ 'a/b': { 'm~n': 1 } }, { 'a/b': { 'm~n': 2 } }],
    [[1, 2], [2, 1]],
    ['text', 42],
    [{}, {}],
  ]
  for (const [before, after] of pairs) assert.deepEqual(applyPatch(before, jsonPatch(before, after)), after)
  assert.deepEqual(jsonPatch({ a: 1 }, { a: 1 }), [])
  assert.deepEqual(jsonPatch({ a: 1, b: 2 }, { a: 3 }), [
    { op: 'remove', path: '/b' }, { op: 'replace', path: '/a', value: 3 }])
})

test('patches from the broker: add, remove, replace, move, copy, test, arrays', () => {
  assert.deepEqual(applyPatch({ v: 'first' }, [{ op: 'replace', path: '/v', value: 'second' }]), { v: 'second' })
  assert.deepEqual(applyPatch({ l: [1, 2] }, [{ op: 'add', path: '/l/1', value: 9 }, { op: 'add', path: '/l/-', value: 3 }]),
    { l: [1, 9, 2, 3] })
  assert.deepEqual(applyPatch({ a: { b: 1 } }, [{ op: 'move', from: '/a/b', path: '/c' }, { op: 'copy', from: '/c', path: '/d' }]),
    { a: {}, c: 1, d: 1 })
  assert.throws(() => applyPatch({ a: 1 }, [{ op: 'replace', path: '/nope', value: 1 }]))
  assert.throws(() => applyPatch({ a: 1 }, [{ op: 'test', path: '/a', value: 2 }]))
  const original = { keep: { me: 1 } }
  applyPatch(original, [{ op: 'remove', path: '/keep/me' }])
  assert.deepEqual(original, { keep: { me: 1 } })
})

test('line diffs keep common lines and show removals before additions', () => {
  assert.deepEqual(lineDiff('a\nb\nc', 'a\nx\nc').map((l) => l.op + l.text), ['samea', 'delb', 'addx', 'samec'])
  assert.deepEqual(lineDiff('', 'a').map((l) => l.op), ['add'])
  assert.deepEqual(lineDiff('a', '').map((l) => l.op), ['del'])
  const long = Array.from({ length: 3000 }, (_, i) => `line ${i}`)
  const changed = [...long.slice(0, 1500), 'new', ...long.slice(1500)]
  const ops = lineDiff(long.join('\n'), changed.join('\n'))
  assert.equal(ops.filter((l) => l.op === 'add').length, 1)
  assert.equal(ops.filter((l) => l.op === 'del').length, 0)
})

test('patterns match as the broker matches them', () => {
  const cases = [
    ['*', 'any/key', true],
    ['customer/*', 'customer/1/plan', true],
    ['customer/*', 'customers/1', false],
    ['cust*', 'customers/1', true],
    ['customer/*/summary', 'customer/1/summary', true],
    ['customer/*/summary', 'customer/1/2/summary', false],
    ['customer/*/s*', 'customer/1/summary/x', true],
    ['exact/key', 'exact/key', true],
    ['exact/key', 'exact/key/more', false],
  ]
  for (const [pattern, key, expected] of cases) assert.equal(matches(pattern, key), expected, `${pattern} ${key}`)
  assert.ok(validPattern('a/*/b') && validPattern('a*') && validPattern('*'))
  assert.ok(!validPattern('a//b') && !validPattern('a*b') && !validPattern('a/*x/b') && !validPattern(''))
})
