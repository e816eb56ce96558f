// Diffs between two JSON values: an RFC 6902 JSON Patch (what changed, by path) and a line
// diff of the pretty-printed values (how a reviewer reads it).

import { h } from './dom.js'

const escape = (segment) => String(segment).replaceAll('~', '~0').replaceAll('/', '~1')
const isObject = (value) => value !== null && typeof value === 'object' && !Array.isArray(value)

/** The JSON Patch turning `a` into `b` (objects by member, arrays and scalars replaced). */
export function jsonPatch(a, b, path = '') {
  if (a === undefined && b === undefined) return []
  if (a === undefined) return [{ op: 'add', path, value: b }]
  if (b === undefined) return [{ op: 'remove', path }]
  if (isObject(a) && isObject(b)) {
    const ops = []
    for (const name of Object.keys(a)) {
      if (!(name in b)) ops.push({ op: 'remove', path: `${path}/${escape(name)}` })
    }
    for (const name of Object.keys(b)) {
      ops.push(...jsonPatch(a[name], b[name], `${path}/${escape(name)}`))
    }
    return ops
  }
  return JSON.stringify(a) === JSON.stringify(b) ? [] : [{ op: 'replace', path, value: b }]
}

const LIMIT = 4_000_000 // cells of the LCS table; past it the diff is shown as remove + add

/** Lines of `before` and `after` as same/del/add, by longest common subsequence. */
export function lineDiff(before, after) {
  const a = before === '' ? [] : before.split('\n')
  const b = after === '' ? [] : after.split('\n')
  // Trim the common head and tail first: most edits touch a few lines of a long value.
  let head = 0
  while (head < a.length && head < b.length && a[head] === b[head]) head++
  let tail = 0
  while (tail < a.length - head && tail < b.length - head &&
         a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++
  const midA = a.slice(head, a.length - tail)
  const midB = b.slice(head, b.length - tail)
  const out = a.slice(0, head).map((text) => ({ op: 'same', text }))
  if (midA.length * midB.length > LIMIT) {
    out.push(...midA.map((text) => ({ op: 'del', text })), ...midB.map((text) => ({ op: 'add', text })))
  } else {
    const n = midA.length
    const m = midB.length
    const table = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1))
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        table[i][j] = midA[i] === midB[j] ? table[i + 1][j + 1] + 1
          : Math.max(table[i + 1][j], table[i][j + 1])
      }
    }
    let i = 0
    let j = 0
    while (i < n || j < m) {
      if (i < n && j < m && midA[i] === midB[j]) {
        out.push({ op: 'same', text: midA[i] }); i++; j++
      } else if (i < n && (j === m || table[i + 1][j] >= table[i][j + 1])) {
        out.push({ op: 'del', text: midA[i] }); i++
      } else {
        out.push({ op: 'add', text: midB[j] }); j++
      }
    }
  }
  out.push(...a.slice(a.length - tail).map((text) => ({ op: 'same', text })))
  return out
}

const show = (value) => (value === undefined ? '' : JSON.stringify(value, null, 2))

/** A diff of two values: the patch as a list and the line diff; `labels` name both sides. */
export function renderDiff(before, after, labels = ['before', 'after'], patch = null) {
  const ops = patch ?? jsonPatch(before, after)
  const lines = lineDiff(show(before), show(after))
  const changed = lines.filter((line) => line.op !== 'same').length
  return h('div', { class: 'diff-view' },
    h('p', { class: 'status' },
      ops.length === 0 ? `No difference between ${labels[0]} and ${labels[1]}.`
        : `${ops.length} change${ops.length === 1 ? '' : 's'} from ${labels[0]} to ${labels[1]} ` +
          `(${changed} line${changed === 1 ? '' : 's'}).`),
    ops.length === 0 ? null : h('ul', { class: 'patch mono', 'aria-label': 'JSON Patch' },
      ops.map((op) => h('li', {}, `${op.op} ${op.path || '(whole value)'}` +
        (op.from !== undefined ? ` from ${op.from}` : '') +
        ('value' in op ? ` = ${JSON.stringify(op.value)}` : '')))),
    h('div', { class: 'diff mono', role: 'region', 'aria-label': `Line diff, ${labels[0]} to ${labels[1]}`, tabindex: '0' },
      lines.map((line) => h('div', { class: line.op },
        line.op === 'same' ? null : h('span', { class: 'visually-hidden' }, line.op === 'add' ? 'added: ' : 'removed: '),
        line.text))))
}

const unescape = (segment) => segment.replaceAll('~1', '/').replaceAll('~0', '~')

/** `value` with an RFC 6902 patch applied (add, remove, replace, move, copy, test); throws on a
 * path that does not exist. */
export function applyPatch(value, patch) {
  const root = { doc: structuredClone(value) }
  const parts = (path) => ['doc', ...(path === '' ? [] : path.split('/').slice(1).map(unescape))]
  const walk = (names) => names.reduce((node, part) => {
    if (node === null || typeof node !== 'object' || !(part in node)) throw new Error(`no ${part}`)
    return node[part]
  }, root)
  const get = (path) => walk(parts(path))
  const set = (path, item, insert) => {
    const names = parts(path)
    const parent = walk(names.slice(0, -1))
    const last = names[names.length - 1]
    if (Array.isArray(parent)) {
      const index = last === '-' ? parent.length : Number(last)
      if (!Number.isInteger(index) || index < 0 || index > parent.length) throw new Error(`bad index ${last}`)
      if (insert) parent.splice(index, 0, item)
      else parent[index] = item
    } else if (parent !== null && typeof parent === 'object') {
      parent[last] = item
    } else {
      throw new Error(`no parent for ${path}`)
    }
  }
  const remove = (path) => {
    const names = parts(path)
    const parent = walk(names.slice(0, -1))
    const last = names[names.length - 1]
    if (Array.isArray(parent)) parent.splice(Number(last), 1)
    else delete parent[last]
  }
  for (const op of patch) {
    if (op.op === 'add') set(op.path, structuredClone(op.value), true)
    else if (op.op === 'replace') { get(op.path); set(op.path, structuredClone(op.value), false) }
    else if (op.op === 'remove') { get(op.path); remove(op.path) }
    else if (op.op === 'move') { const item = get(op.from); remove(op.from); set(op.path, item, true) }
    else if (op.op === 'copy') set(op.path, structuredClone(get(op.from)), true)
    else if (op.op === 'test') { if (JSON.stringify(get(op.path)) !== JSON.stringify(op.value)) throw new Error('test failed') }
    else throw new Error(`unknown op ${op.op}`)
  }
  return root.doc
}
