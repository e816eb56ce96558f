// The key tree: keys under a folder (a prefix ending in `/`) grouped by their next segment, a
// page at a time, or the keys matching a filter; kept current by live events.

import { $, arrowKeys, explain, fill, h } from './dom.js'
import { matches, validPattern } from './patterns.js'

const PAGE = 500 // keys per request
const MAX_ROUNDS = 20 // requests one "load more" may make
const SHOWN = 2000 // rows rendered at most; narrow with a folder or a filter beyond that
const CHANGED_MS = 4000 // how long a key changed live stays highlighted

export class KeyTree {
  constructor(client, { onSelect }) {
    this.client = client
    this.onSelect = onSelect
    this.prefix = ''
    this.filter = ''
    this.selected = null
    this.changed = new Map() // key -> time it changed live
    this.list = $('keys')
    this.more = $('keys-more')
    this.status = $('keys-status')
    this.more.onclick = () => this.loadMore()
    arrowKeys(this.list)
    $('filter-form').onsubmit = (event) => {
      event.preventDefault()
      this.setFilter($('filter-input').value.trim())
    }
    $('filter-input').value = ''
  }

  /** The query pattern for the folder and filter in force. */
  pattern() {
    if (this.filter.includes('*')) return this.filter
    if (this.filter) return `${this.prefix}${this.filter}*`
    return this.prefix ? `${this.prefix}*` : '*'
  }

  setFilter(text) {
    if (text && text.includes('*') && !validPattern(text)) {
      this.status.textContent = `"${text}" is not a pattern: use whole segments around a middle *, or end with *.`
      return
    }
    this.filter = text
    this.reload()
  }

  open(prefix) {
    this.prefix = prefix
    this.filter = ''
    $('filter-input').value = ''
    this.reload()
  }

  reload() {
    this.generation = (this.generation ?? 0) + 1
    this.entries = new Map() // key -> { version, updatedAt, schemaViolation, conflicts }
    this.cursor = null
    this.done = false
    this.lastKey = null
    this.error = null
    this.crumbs()
    this.loadMore()
  }

  async loadMore() {
    const generation = this.generation
    this.more.disabled = true
    this.status.textContent = 'Loading keys…'
    try {
      // A page may come back short (a middle-`*` pattern skips keys, the broker caps the
      // keys one request examines): keep asking until a page's worth arrived or the end.
      let added = 0
      for (let round = 0; round < MAX_ROUNDS && added < PAGE && !this.done; round++) {
        const page = await this.client.memory.page(this.pattern(), { cursor: this.cursor ?? undefined, limit: PAGE - added })
        if (generation !== this.generation) return
        for (const entry of page.entries) this.entries.set(entry.key, summary(entry))
        if (page.entries.length) this.lastKey = page.entries[page.entries.length - 1].key
        added += page.entries.length
        this.cursor = page.nextCursor
        this.done = page.nextCursor === null
      }
    } catch (error) {
      if (generation !== this.generation) return
      this.error = error.status === 403 ? `This key may not read namespace ${this.client.namespace}.`
        : error.status === 401 ? 'The broker no longer accepts this key (revoked or expired): sign in again.'
          : `Cannot list keys: ${explain(error)}`
    } finally {
      if (generation === this.generation) this.more.disabled = false
    }
    this.render()
  }

  /** A live event: add, update or drop the key if it is in the part of the list loaded. */
  onEvent(event) {
    if (event.type === 'reset') {
      this.reload()
      return
    }
    if (!event.key || !matches(this.pattern(), event.key)) return
    const loaded = this.done || (this.lastKey !== null && event.key <= this.lastKey)
    if (event.type === 'put' && loaded) this.entries.set(event.key, summary(event.entry))
    else if (event.type === 'delete' || event.type === 'expire') this.entries.delete(event.key)
    else return
    this.changed.set(event.key, Date.now())
    if (!this.pending) {
      this.pending = true
      requestAnimationFrame(() => {
        this.pending = false
        this.render()
      })
    }
    clearTimeout(this.fade)
    this.fade = setTimeout(() => this.render(), CHANGED_MS + 50)
  }

  crumbs() {
    const parts = this.prefix ? this.prefix.slice(0, -1).split('/') : []
    const buttons = [['(root)', '']]
    parts.forEach((part, i) => buttons.push([part, parts.slice(0, i + 1).join('/') + '/']))
    fill($('crumbs'), buttons.map(([label, prefix], i) =>
      h('button', {
        type: 'button', onclick: () => this.open(prefix),
        'aria-current': i === buttons.length - 1 ? 'location' : null,
        'aria-label': i === 0 ? 'Root folder' : `Folder ${prefix}`,
      }, i === 0 ? label : `${label}/`)))
  }

  /** The rows: with no filter, one per folder (with its key count) and one per key here. */
  rows() {
    const keys = [...this.entries.keys()].sort()
    if (this.filter) return keys.map((key) => ({ key, label: key }))
    const rows = []
    const folders = new Map()
    for (const key of keys) {
      const rest = key.slice(this.prefix.length)
      const slash = rest.indexOf('/')
      if (slash < 0) {
        rows.push({ key, label: rest })
        continue
      }
      const folder = this.prefix + rest.slice(0, slash + 1)
      let row = folders.get(folder)
      if (!row) {
        row = { folder, label: rest.slice(0, slash + 1), count: 0, changed: 0 }
        folders.set(folder, row)
        rows.push(row)
      }
      row.count += 1
      row.changed = Math.max(row.changed, this.changed.get(key) ?? 0)
    }
    return rows
  }

  render() {
    if (this.error) {
      fill(this.list)
      this.status.textContent = this.error
      this.more.hidden = true
      return
    }
    const now = Date.now()
    for (const [key, at] of this.changed) if (now - at > CHANGED_MS) this.changed.delete(key)
    const rows = this.rows()
    const items = rows.slice(0, SHOWN).map((row) => {
      const recent = now - (row.folder ? row.changed : this.changed.get(row.key) ?? 0) < CHANGED_MS
      if (row.folder) {
        return h('li', { class: `folder${recent ? ' changed' : ''}` },
          h('button', { type: 'button', onclick: () => this.open(row.folder), 'aria-label': `Folder ${row.folder}, ${row.count}${this.done ? '' : '+'} keys` },
            h('span', { class: 'name' }, row.label),
            h('span', { class: 'meta' }, `${row.count}${this.done ? '' : '+'} key${row.count === 1 && this.done ? '' : 's'}`)))
      }
      const entry = this.entries.get(row.key)
      return h('li', { class: recent ? 'changed' : null, dataset: { key: row.key } },
        h('button', {
          type: 'button', 'aria-current': row.key === this.selected ? 'true' : null,
          onclick: () => this.select(row.key),
        },
        h('span', { class: 'name' }, row.label,
          entry.schemaViolation ? h('span', { class: 'flag bad', title: 'schema violation' }, 'schema') : null,
          entry.conflicts ? h('span', { class: 'flag warn', title: 'merge conflicts' }, 'conflicts') : null),
        h('span', { class: 'meta' }, `v${entry.version}`)))
    })
    fill(this.list, items)
    const total = this.entries.size
    const where = this.filter ? `matching ${this.pattern()}` : this.prefix ? `under ${this.prefix}` : 'in the namespace'
    this.status.textContent = (total === 0 && this.done ? `No keys ${where}.`
      : `${total} key${total === 1 ? '' : 's'} ${where}${this.done ? '' : ' loaded; more to load'}.`) +
      (rows.length > SHOWN ? ` Showing the first ${SHOWN} rows: open a folder or filter to see the rest.` : '')
    this.more.hidden = this.done
  }

  select(key) {
    this.selected = key
    for (const button of this.list.querySelectorAll('button[aria-current]')) button.removeAttribute('aria-current')
    const li = [...this.list.children].find((item) => item.dataset.key === key)
    li?.querySelector('button')?.setAttribute('aria-current', 'true')
    this.onSelect(key)
  }
}

function summary(entry) {
  return {
    version: entry.version,
    schemaViolation: entry.schemaViolation,
    conflicts: Boolean(entry.conflicts && entry.conflicts.length),
  }
}
