// One entry: its value and metadata, live, and its history with a diff between any two
// versions.

import { explain, fields, fill, h, pretty, table, when } from './dom.js'
import { renderDiff } from './diff.js'

export class EntryView {
  constructor(client, root, names) {
    this.client = client
    this.root = root
    this.names = names
    this.key = null
    this.history = null
  }

  async open(key) {
    this.key = key
    this.history = null
    this.pick = null
    await this.refresh()
    this.root.querySelector('h3')?.focus()
  }

  async refresh(note = '') {
    const key = this.key
    let entry = null
    let problem = null
    try {
      entry = await this.client.memory.getEntry(key)
      await this.names.load()
    } catch (error) {
      problem = error.status === 404 ? 'This key holds no entry now (never written, deleted or expired).'
        : error.status === 403 ? 'This key may not read this entry.' : `Cannot read the entry: ${explain(error)}`
    }
    if (key !== this.key) return
    this.entry = entry
    fill(this.root,
      h('h3', { tabindex: '-1', class: 'mono' }, key),
      note ? h('p', { class: 'notice info', role: 'status' }, note) : null,
      problem ? h('p', { class: 'notice' }, problem) : this.details(entry),
      h('div', { class: 'row' },
        h('button', { type: 'button', onclick: () => this.loadHistory(), 'aria-controls': 'history' },
          this.history ? 'Reload history' : 'Show history')),
      h('section', { id: 'history', 'aria-label': 'History' }))
    if (this.history) await this.loadHistory()
  }

  details(entry) {
    const ttl = entry.ttlSeconds === null ? 'none'
      : h('span', {}, `${entry.ttlSeconds} s, expires `, when(entry.expiresAt))
    return h('div', {},
      fields([
        ['Version', String(entry.version)],
        ['Writer', this.names.label(entry.agentId)],
        ['Created', when(entry.createdAt)],
        ['Updated', when(entry.updatedAt)],
        entry.timestamp !== null ? ['Write timestamp', when(entry.timestamp)] : null,
        ['TTL', ttl],
        ['Schema', entry.schemaViolation
          ? h('span', { class: 'flag bad' }, 'violates its schema') : h('span', { class: 'flag ok' }, 'conforms')],
        ['Conflicts', entry.conflicts?.length ? h('span', { class: 'flag warn' }, `${entry.conflicts.length} flagged`) : 'none'],
      ]),
      h('h4', {}, 'Value'),
      h('pre', { tabindex: '0', 'aria-label': 'Value', class: 'value' }, pretty(entry.value)),
      entry.schemaErrors?.length ? [h('h4', {}, 'Schema errors'),
        table('Schema errors', ['Schema', 'Path', 'Message'],
          entry.schemaErrors.map((e) => [e.schemaId, h('code', {}, e.path || '/'), e.message]))] : null,
      entry.conflicts?.length ? [h('h4', {}, 'Merge conflicts'),
        table('Merge conflicts', ['Path', 'Base', 'Stored', 'Incoming', 'Stored by', 'Incoming by'],
          entry.conflicts.map((c) => [h('code', {}, c.path || '(whole value)'),
            h('code', {}, c.baseMissing ? '(base gone)' : JSON.stringify(c.base)),
            h('code', {}, JSON.stringify(c.stored)), h('code', {}, JSON.stringify(c.incoming)),
            c.storedAgent ?? '—', c.incomingAgent ?? '—']))] : null)
  }

  async loadHistory() {
    const key = this.key
    const section = this.root.querySelector('#history')
    try {
      const versions = await this.client.memory.history(key)
      if (key !== this.key) return
      this.history = versions
    } catch (error) {
      fill(section, h('p', { class: 'notice' }, `Cannot read the history: ${explain(error)}`))
      return
    }
    const versions = this.history
    if (!this.pick || !versions.some((v) => v.version === this.pick[0]) || !versions.some((v) => v.version === this.pick[1])) {
      this.pick = versions.length > 1 ? [versions[1].version, versions[0].version]
        : versions.length ? [versions[0].version, versions[0].version] : [null, null]
    }
    const radio = (side, version) => h('input', {
      type: 'radio', name: `diff-${side}`, value: String(version), checked: this.pick[side] === version,
      'aria-label': `${side === 0 ? 'From' : 'To'} version ${version}`,
      onchange: () => { this.pick[side] = version; this.showDiff() },
    })
    fill(section,
      h('h4', {}, `History (${versions.length} version${versions.length === 1 ? '' : 's'}, newest first)`),
      table('History', ['From', 'To', 'Version', 'Change', 'Writer', 'At'],
        versions.map((v) => [radio(0, v.version), radio(1, v.version), String(v.version),
          v.deleted ? 'delete' : 'put', this.names.label(v.agentId), when(v.updatedAt)])),
      h('div', { id: 'history-diff', 'aria-live': 'polite' }))
    this.showDiff()
  }

  showDiff() {
    const target = this.root.querySelector('#history-diff')
    if (!target || !this.history) return
    const [from, to] = this.pick
    const a = this.history.find((v) => v.version === from)
    const b = this.history.find((v) => v.version === to)
    if (!a || !b) return fill(target)
    fill(target, h('h4', {}, `Diff: version ${from} → version ${to}`),
      renderDiff(a.deleted ? undefined : a.value, b.deleted ? undefined : b.value, [`v${from}`, `v${to}`]))
  }

  /** The broker's data was reset (lost or trimmed): a key whose entry is gone is closed, so
   * the panel never shows what no longer exists; one that survived is read again. */
  async afterReset() {
    const key = this.key
    try {
      await this.client.memory.getEntry(key)
    } catch (error) {
      if (error.status !== 404 || key !== this.key) return
      this.key = null
      this.entry = null
      this.history = null
      fill(this.root, h('p', { class: 'notice info', role: 'status', id: 'entry-gone' },
        `${key} holds no entry any more: the broker's data was reset.`))
      return
    }
    if (key === this.key) this.refresh('Read again after the broker reset the stream.')
  }

  /** A live event on the open key: show the new state at once. */
  onEvent(event) {
    if (this.key && event.type === 'reset') return this.afterReset()
    if (!this.key || event.key !== this.key) return
    if (!['put', 'delete', 'expire'].includes(event.type)) return
    this.refresh(`Updated live: ${event.type} to version ${event.version ?? '?'}.`)
  }
}
