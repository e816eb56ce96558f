// Agents by name: the namespace's agent listing, fetched once and again when it is older than
// a few seconds, so writers, proposers and actors show as names with the id on hover.

import { h } from './dom.js'

const FRESH_MS = 10_000

export class AgentNames {
  constructor(client) {
    this.client = client
    this.agents = new Map()
    this.loaded = 0
    this.loading = null
  }

  /** The listing (every page), unless a fresh one is at hand; a refusal leaves ids as ids. */
  async load() {
    if (Date.now() - this.loaded < FRESH_MS) return this.agents
    this.loading ??= this.fetch().finally(() => { this.loading = null })
    return this.loading
  }

  async fetch() {
    const agents = new Map()
    try {
      let cursor
      do {
        const page = await this.client.agents.list({ cursor, limit: 100 })
        for (const agent of page.agents) agents.set(agent.id, agent)
        cursor = page.nextCursor ?? undefined
      } while (cursor)
    } catch {
      // no read on the namespace: ids are shown as they are
    }
    this.agents = agents
    this.loaded = Date.now()
    return agents
  }

  /** An agent id as people read it: the name, the id on hover (and for copying). */
  label(id) {
    if (!id) return '—'
    const agent = this.agents.get(id)
    return agent ? h('span', { class: 'agent', title: id, 'data-agent-id': id }, agent.name)
      : h('span', { class: 'mono' }, id)
  }

  list() {
    return [...this.agents.values()]
  }
}
