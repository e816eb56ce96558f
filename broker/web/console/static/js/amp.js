// AMP cells per owner, or recalled by meaning for a question: status, score, decay score,
// access policy (the `/amp` API, `amp` permission).

import { explain, fill, h, table, when } from './dom.js'

const OWNER_TYPES = ['user', 'agent', 'organization']
const STATUSES = ['active', 'stale', 'archived']
const MODES = ['hybrid', 'semantic', 'keyword']
const DEGRADED = {
  embedder_unavailable: 'The embedder is unavailable: these cells are ranked by their words alone.',
}

export class AmpView {
  constructor(client, root, names) {
    this.client = client
    this.root = root
    this.names = names
    this.owner = { type: 'user', id: '' }
    this.recall = { query: '', mode: 'hybrid', minScore: '' }
    this.agent = ''
    this.statuses = new Set(['active', 'stale'])
    this.shown = false
  }

  async show() {
    if (this.shown) return
    this.shown = true
    await this.names.load()
    this.render([], null)
  }

  render(hits, message, more = false, degraded = undefined) {
    const ownerId = h('input', { id: 'amp-owner', value: this.owner.id, autocomplete: 'off', spellcheck: 'false' })
    const ownerType = h('select', { id: 'amp-owner-type' },
      OWNER_TYPES.map((t) => h('option', { value: t, selected: t === this.owner.type }, t)))
    const query = h('input', { id: 'amp-query', type: 'search', value: this.recall.query, maxlength: '1000', autocomplete: 'off', 'aria-describedby': 'amp-query-help' })
    const mode = h('select', { id: 'amp-mode' },
      MODES.map((m) => h('option', { value: m, selected: m === this.recall.mode }, m)))
    const minScore = h('input', { id: 'amp-min-score', type: 'number', min: '0', max: '1', step: 'any', inputmode: 'decimal', value: this.recall.minScore })
    // The namespace's agents to act as, by name (the id beside it); any other id may be typed.
    const known = this.names.list()
    const listed = known.some((a) => a.id === this.agent)
    const agent = h('select', { id: 'amp-agent', 'aria-describedby': 'amp-agent-help' },
      h('option', { value: '' }, "this key's own agent"),
      known.map((a) => h('option', { value: a.id, selected: a.id === this.agent, title: a.id }, `${a.name} — ${a.id}`)))
    const typed = h('input', { id: 'amp-agent-id', value: listed ? '' : this.agent, autocomplete: 'off', spellcheck: 'false' })
    const boxes = STATUSES.map((s) => h('label', {},
      h('input', { type: 'checkbox', name: 'status', value: s, checked: this.statuses.has(s) }), ` ${s}`))
    const scored = Boolean(this.recall.query)
    fill(this.root,
      h('form', {
        class: 'row', role: 'search', 'aria-label': 'Cells of an owner, or recalled by meaning',
        onsubmit: (event) => {
          event.preventDefault()
          this.owner = { type: ownerType.value, id: ownerId.value.trim() }
          this.recall = { query: query.value.trim(), mode: mode.value, minScore: minScore.value.trim() }
          this.agent = typed.value.trim() || agent.value
          this.statuses = new Set(boxes.map((b) => b.querySelector('input')).filter((i) => i.checked).map((i) => i.value))
          this.hits = []
          this.cursor = undefined
          this.search()
        },
      },
      h('label', { for: 'amp-query' }, 'Question or words', query),
      h('label', { for: 'amp-mode' }, 'Mode', mode),
      h('label', { for: 'amp-min-score' }, 'Min score', minScore),
      h('label', { for: 'amp-owner-type' }, 'Owner type', ownerType),
      h('label', { for: 'amp-owner' }, 'Owner id', ownerId),
      h('fieldset', { class: 'inline' }, h('legend', {}, 'Status'), boxes),
      h('label', { for: 'amp-agent' }, 'Act as agent', agent),
      h('label', { for: 'amp-agent-id' }, 'Or an agent id', typed),
      h('button', { type: 'submit' }, 'Show cells')),
      h('p', { id: 'amp-query-help', class: 'help' },
        'A question finds cells by meaning (hybrid: meaning and words; semantic: meaning alone; keyword: words alone), ' +
        'best first; min score (0 to 1) leaves out weaker matches. Without one, an owner\'s cells come by decay score.'),
      h('p', { id: 'amp-agent-help', class: 'help' },
        'AMP decides cell by cell what the acting agent may read. A key bound to an agent acts as that agent; ' +
        'with any other key, pick the agent to act as from the namespace\'s agents, or type its id ' +
        '(sent as X-AMP-Agent-ID, which needs the impersonate permission or an admin key).'),
      degraded ? h('p', { class: 'notice', role: 'status', id: 'amp-degraded' }, DEGRADED[degraded] ?? `Search degraded: ${degraded}.`) : null,
      message ? h('p', { class: 'notice', role: 'status', id: 'amp-message' }, message) : null,
      hits.length ? table('Memory cells', ['Cell', ...(scored ? ['Score'] : []), 'Type', 'Status', 'Decay score', 'Readable by', 'Writable by', 'Created', 'Last access'],
        hits.map(({ cell, score, decayScore }) => [
          h('div', {}, h('div', {}, cell.content.text), h('code', { class: 'help' }, cell.id)),
          ...(scored ? [score.toFixed(3)] : []),
          cell.type, cell.lifecycle.status, decayScore.toFixed(3),
          (cell.access_policy.readable_by ?? []).join(', ') || '—',
          (cell.access_policy.writable_by ?? []).join(', ') || '—',
          when(cell.lifecycle.created_at), when(cell.lifecycle.last_accessed_at)])) : null,
      more ? h('button', { type: 'button', onclick: () => this.search() }, 'Load more cells') : null)
  }

  async search() {
    const { query, mode, minScore } = this.recall
    if (!this.owner.id && !query) return this.render([], 'Name an owner, or ask a question.')
    let page
    try {
      page = await this.client.amp.search({
        query: query || undefined, mode: query ? mode : undefined,
        minScore: query && minScore !== '' ? Number(minScore) : undefined,
        ownerId: this.owner.id || undefined, ownerType: this.owner.id ? this.owner.type : undefined,
        status: [...this.statuses], limit: 50, cursor: this.cursor, agent: this.agent || undefined,
      })
    } catch (error) {
      const message = error.status === 403 ? `This key may not do that on the AMP API: ${explain(error)}`
        : error.field === 'X-AMP-Agent-ID' ? 'This key is not bound to an agent: name the agent to act as.'
          : `Cannot search cells: ${explain(error)}`
      return this.render([], message)
    }
    this.hits = [...(this.hits ?? []), ...page.results]
    this.cursor = page.nextCursor ?? undefined
    const none = query ? `No ${[...this.statuses].join(' or ')} cells match "${query}"${this.owner.id ? ` for ${this.owner.type} ${this.owner.id}` : ''}.`
      : `No ${[...this.statuses].join(' or ')} cells for ${this.owner.type} ${this.owner.id}.`
    this.render(this.hits, this.hits.length ? null : none, Boolean(page.nextCursor), page.degraded)
  }
}
