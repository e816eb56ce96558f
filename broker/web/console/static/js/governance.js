// What the governance views (the approval queue, the audit trail) share: a list loaded a page
// at a time, first when the view is shown, and the notice for a broker without the routes.

import { fill, h } from './dom.js'

export function governanceMissing(root, what, id) {
  fill(root, h('p', { class: 'notice info', role: 'status', id },
    `This broker has no governance routes: it serves no ${what}. ` +
    '(The approval queue and the audit trail arrive with a broker that has them.)'))
}

// Subclasses give `load()`, which appends the next page to `items` and moves `cursor`.
export class PagedView {
  constructor(client, root) {
    this.client = client
    this.root = root
    this.items = []
    this.cursor = null
    this.shown = false
  }

  show() {
    if (this.shown) return
    this.shown = true
    this.reload()
  }

  async reload() {
    this.items = []
    this.cursor = null
    await this.load()
  }
}
