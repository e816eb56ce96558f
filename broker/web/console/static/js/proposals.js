// The approval queue (governance routes, `review` permission): proposals, each with its diff
// against the current value, approved or rejected with a reason.

import { explain, fields, fill, h, pretty, table, when } from './dom.js'
import { governanceMissing, PagedView } from './governance.js'
import { applyPatch, renderDiff } from './diff.js'
import { approveProposal, getProposal, listProposals, noRoute, rejectProposal } from './api.js'

const STATUSES = ['pending', 'approved', 'rejected', 'expired', '']

export class ProposalsView extends PagedView {
  constructor(client, root, names) {
    super(client, root)
    this.names = names
    this.status = 'pending'
    this.keyFilter = ''
  }

  async load() {
    const namespace = this.client.namespace
    let page
    try {
      page = await listProposals(this.client, { status: this.status, key: this.keyFilter, cursor: this.cursor, limit: 50 })
    } catch (error) {
      if (noRoute(error)) return governanceMissing(this.root, 'proposals', 'proposals-missing')
      const message = error.status === 403
        ? `This key has no review permission in ${namespace}: there is no queue to show.`
        : `Cannot list proposals: ${explain(error)}`
      return fill(this.root, h('p', { class: 'notice', role: 'status', id: 'proposals-denied' }, message))
    }
    this.items.push(...(page.proposals ?? page.items ?? []))
    this.cursor = page.next_cursor ?? null
    this.reviewer ??= await this.mayReview()
    await this.names.load()
    this.render()
  }

  /**
   * Does the key hold `review`? A writer without it may list its own proposals, so the list
   * does not tell. Deciding a proposal that does not exist does: without `review` it is
   * refused (403) before any look-up; with it, there is no such proposal (404). Nothing is
   * changed either way.
   */
  async mayReview() {
    try {
      await approveProposal(this.client, 'no-such-proposal')
    } catch (error) {
      return error.status !== 403 && error.status !== 401
    }
    return true
  }

  render() {
    const statusSelect = h('select', { id: 'proposal-status', onchange: (e) => { this.status = e.target.value; this.reload() } },
      STATUSES.map((s) => h('option', { value: s, selected: s === this.status }, s || 'any')))
    const keyInput = h('input', { id: 'proposal-key', value: this.keyFilter, autocomplete: 'off', spellcheck: 'false' })
    const own = this.reviewer === false
    fill(this.root,
      own ? h('p', { class: 'notice', role: 'status', id: 'proposals-denied' },
        `This key has no review permission in ${this.client.namespace}: there is no queue to show. ` +
        'Below are only the proposals this key made itself.') : null,
      h('form', { class: 'row', role: 'search', onsubmit: (e) => { e.preventDefault(); this.keyFilter = keyInput.value.trim(); this.reload() } },
        h('label', { for: 'proposal-status' }, 'Status', statusSelect),
        h('label', { for: 'proposal-key' }, 'Key', keyInput),
        h('button', { type: 'submit' }, 'Filter'),
        h('button', { type: 'button', onclick: () => this.reload() }, 'Refresh')),
      this.items.length === 0 ? h('p', { class: 'status', id: 'proposals-empty' }, 'No proposals.') :
        table(own ? 'Your proposals' : 'Proposals', ['Key', 'Status', 'Proposed by', 'At', 'Base version', ''],
          this.items.map((p) => [h('code', {}, p.key), p.status, this.names.label(p.proposed_by),
            when(p.created_at), String(p.base_version ?? '—'),
            h('button', { type: 'button', onclick: () => this.open(p.id), 'aria-label': `${own ? 'Show' : 'Review'} proposal for ${p.key}` }, own ? 'Show' : 'Review')])),
      this.cursor ? h('button', { type: 'button', onclick: () => this.load() }, 'Load more proposals') : null,
      h('div', { id: 'proposal', 'aria-live': 'polite' }))
  }

  async open(id, note = null) {
    const target = this.root.querySelector('#proposal')
    let proposal
    let current
    try {
      proposal = await getProposal(this.client, id)
    } catch (error) {
      return fill(target, h('p', { class: 'notice bad' }, `Cannot read the proposal: ${explain(error)}`))
    }
    try {
      current = await this.client.memory.getEntry(proposal.key)
    } catch (error) {
      current = null
      if (error.status !== 404) note = note ?? `Cannot read the current value: ${explain(error)}`
    }
    fill(target, this.detail(proposal, current, note))
    target.querySelector('h3')?.focus()
  }

  detail(p, current, note) {
    const currentValue = current ? current.value : undefined
    const operation = p.operation ?? p.op ?? 'put'
    const deleting = operation === 'delete'
    const moved = current && p.base_version != null && current.version !== p.base_version
    let proposed = deleting ? undefined : p.value
    if (Array.isArray(p.diff) && !deleting && !moved) {
      try {
        proposed = applyPatch(currentValue ?? null, p.diff)
      } catch {
        proposed = p.value
      }
    }
    const reason = h('textarea', { id: 'reject-reason', 'aria-describedby': 'reject-help' })
    const pending = p.status === 'pending' && this.reviewer !== false
    return h('div', { class: 'card' },
      h('h3', { tabindex: '-1' }, 'Proposal for ', h('code', {}, p.key)),
      note,
      fields([
        ['Id', h('span', { class: 'mono' }, p.id)],
        ['Status', p.status],
        ['Operation', operation],
        p.expires_at ? ['Expires', when(p.expires_at)] : null,
        p.version ? ['Applied as version', String(p.version)] : null,
        ['Proposed by', this.names.label(p.proposed_by)],
        ['Created', when(p.created_at)],
        ['Base version', String(p.base_version ?? '— (new key)')],
        ['Current version', current ? String(current.version) : 'none (no entry)'],
        p.decided_by ? ['Decided by', this.names.label(p.decided_by)] : null,
        p.reason ? ['Reason', p.reason] : null,
      ]),
      moved ? h('p', { class: 'notice', role: 'status' },
        `The key moved since this proposal was made (base version ${p.base_version}, now ${current.version}). ` +
        'Approving it is refused with the current entry and a fresh diff; nothing is applied blindly.') : null,
      h('div', { class: 'split' },
        h('div', {}, h('h4', {}, current ? `Current value (v${current.version})` : 'Current value'), h('pre', { tabindex: '0' }, pretty(currentValue))),
        h('div', {}, h('h4', {}, 'Proposed value'), h('pre', { tabindex: '0' }, deleting ? '(delete)' : pretty(proposed)))),
      h('h4', {}, 'Diff against the current value'),
      renderDiff(currentValue, proposed, ['current', 'proposed'], Array.isArray(p.diff) && !moved ? p.diff : null),
      pending ? h('div', { class: 'row' },
        h('button', { type: 'button', class: 'primary', onclick: (e) => this.decide(p, 'approve', null, e.target) }, 'Approve')) : null,
      pending ? h('div', {},
        h('label', { for: 'reject-reason' }, 'Reason for rejecting'), reason,
        h('p', { id: 'reject-help', class: 'help' }, 'Required: the proposer sees it.'),
        h('button', { type: 'button', class: 'danger', onclick: (e) => this.decide(p, 'reject', reason.value.trim(), e.target) }, 'Reject')) : null,
      h('p', { id: 'decision', role: 'status' }))
  }

  async decide(p, action, reason, button, baseVersion = null) {
    const out = this.root.querySelector('#decision')
    if (action === 'reject' && !reason) {
      out.className = 'error'
      out.textContent = 'Give a reason to reject.'
      this.root.querySelector('#reject-reason')?.focus()
      return
    }
    button.disabled = true
    try {
      const reply = action === 'reject' ? await rejectProposal(this.client, p.id, reason)
        : await approveProposal(this.client, p.id, baseVersion)
      const version = reply?.entry?.version ?? reply?.version
      const done = action === 'approve'
        ? `Approved${version ? `: applied as version ${version}` : ''}.` : 'Rejected.'
      this.items = this.items.filter((item) => item.id !== p.id || this.status !== 'pending')
      this.render()
      await this.open(p.id, h('p', { class: 'notice info', role: 'status', id: 'decision-done' }, done))
    } catch (error) {
      button.disabled = false
      if (error.status === 409) {
        const details = error.details ?? {}
        const fresh = details.current ?? null
        await this.open(p.id, h('div', { class: 'notice', role: 'alert', id: 'decision-conflict' },
          h('p', {}, `Not applied (409): ${error.message}`),
          fresh ? h('p', {}, `It is now at version ${fresh.version}.`) : null,
          Array.isArray(details.diff) ? renderDiff(fresh?.value, applySafe(fresh?.value, details.diff), ['now', 'proposed'], details.diff) : null,
          typeof details.current_version === 'number' ? h('button', {
            type: 'button', class: 'primary', id: 'approve-rebased',
            onclick: (e) => this.decide(p, 'approve', null, e.target, details.current_version),
          }, `Approve rebased onto version ${details.current_version}`) : null))
        return
      }
      out.className = 'error'
      out.textContent = error.status === 403 ? `Refused: ${explain(error)}` : `Failed: ${explain(error)}`
    }
  }
}

function applySafe(value, patch) {
  try {
    return applyPatch(value ?? null, patch)
  } catch {
    return undefined
  }
}
