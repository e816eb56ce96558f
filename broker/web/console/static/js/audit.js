// The audit trail (governance routes, `audit` permission): records newest first, filtered by
// actor, key, action and time, and a check of the namespace's hash chain.

import { explain, fill, h, table, when } from './dom.js'
import { listAudit, noRoute, verifyAudit } from './api.js'
import { governanceMissing, PagedView } from './governance.js'

// The actions the broker records (docs/governance.md), offered in the action filter.
const ACTIONS = ['put', 'merge', 'delete', 'expire', 'propose', 'approve', 'reject',
  'config', 'shares', 'schema', 'schema-delete', 'key-create', 'key-revoke', 'agent-register',
  'agent-remove', 'amp-create', 'amp-patch', 'amp-delete', 'amp-import', 'amp-stale',
  'amp-active', 'amp-archived', 'amp-expired', 'purge']

export class AuditView extends PagedView {
  constructor(client, root, names) {
    super(client, root)
    this.names = names
    this.filter = { actor: '', key: '', action: '', since: '', until: '' }
  }

  query() {
    const iso = (local) => (local ? new Date(local).toISOString() : undefined)
    const { actor, key, action, since, until } = this.filter
    return { actor, key, action, since: iso(since), until: iso(until), cursor: this.cursor, limit: 100 }
  }

  async load() {
    const namespace = this.client.namespace
    let page
    try {
      page = await listAudit(this.client, this.query())
    } catch (error) {
      if (noRoute(error)) return governanceMissing(this.root, 'audit trail', 'audit-missing')
      const message = error.status === 403
        ? `This key has no audit permission in ${namespace}: the audit trail is not shown.`
        : `Cannot read the audit trail: ${explain(error)}`
      if (error.status === 400 && this.form) {
        this.root.querySelector('#audit-result').textContent = message
        return
      }
      return fill(this.root, h('p', { class: 'notice', role: 'status', id: 'audit-denied' }, message))
    }
    this.items.push(...(page.records ?? []))
    this.cursor = page.next_cursor ?? null
    await this.names.load()
    this.render()
  }

  render() {
    const input = (name, label, type = 'text') => h('label', {}, label,
      h('input', { name, type, value: this.filter[name], autocomplete: 'off', spellcheck: 'false' }))
    this.form = h('form', {
      class: 'row', role: 'search', 'aria-label': 'Filter the audit trail',
      onsubmit: (event) => {
        event.preventDefault()
        const data = new FormData(event.target)
        for (const name of Object.keys(this.filter)) this.filter[name] = String(data.get(name) ?? '').trim()
        this.reload()
      },
    },
    input('actor', 'Actor'), input('key', 'Key'),
    h('label', {}, 'Action', h('select', { name: 'action' },
      ['', ...ACTIONS].map((a) => h('option', { value: a, selected: a === this.filter.action }, a || 'any')))),
    input('since', 'Since', 'datetime-local'), input('until', 'Until', 'datetime-local'),
    h('button', { type: 'submit' }, 'Filter'),
    h('button', { type: 'button', onclick: () => this.reload() }, 'Refresh'))
    fill(this.root, this.form,
      h('div', { class: 'row' },
        h('button', { type: 'button', onclick: () => this.verify() }, 'Check the chain'),
        h('p', { id: 'audit-verify', role: 'status' })),
      h('p', { id: 'audit-result', class: 'status', role: 'status' },
        `${this.items.length} record${this.items.length === 1 ? '' : 's'}${this.cursor ? ' loaded; more to load' : ''}.`),
      this.items.length ? table('Audit records', ['At', 'Actor', 'Action', 'Key', 'Versions', 'Content hash', 'Request'],
        this.items.map((r) => [when(r.at), this.names.label(r.actor), r.action,
          r.key ? h('code', {}, r.key) : '—',
          `${r.version_before ?? '—'} → ${r.version_after ?? '—'}`,
          h('span', { class: 'mono', title: r.content_hash ?? '' }, r.content_hash ? `${r.content_hash.slice(0, 12)}…` : '—'),
          h('span', { class: 'mono' }, r.request_id ?? '—')])) : null,
      this.cursor ? h('button', { type: 'button', onclick: () => this.load() }, 'Load more records') : null)
  }

  async verify() {
    const out = this.root.querySelector('#audit-verify')
    out.className = 'status'
    out.textContent = 'Checking…'
    try {
      const verdict = await verifyAudit(this.client)
      if (verdict.ok) {
        out.className = 'ok'
        out.textContent = `Chain intact: ${verdict.records} records, head ${String(verdict.head).slice(0, 16)}…`
      } else {
        out.className = 'error'
        out.textContent = `Chain broken at ${JSON.stringify(verdict.broken ?? {})} (${verdict.records} records checked).`
      }
    } catch (error) {
      out.className = 'error'
      out.textContent = `Cannot check the chain: ${explain(error)}`
    }
  }
}
