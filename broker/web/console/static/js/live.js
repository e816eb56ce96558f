// The live stream: one SSE subscription to the whole namespace (narrowed by a filter, if one is
// set), its connection state shown in the header; the SDK reconnects with backoff and resumes
// from the last event id by itself.

import { explain } from './dom.js'

const TEXT = {
  connecting: 'Live: connecting…',
  open: 'Live: connected',
  waiting: 'Live: reconnecting…',
  closed: 'Live: stopped',
}
// The SDK's `ConnectionState.status` as the badge names it (`data-state`).
const BADGE = { connecting: 'connecting', connected: 'open', reconnecting: 'waiting', closed: 'closed' }

export class Live {
  constructor(client, badge, label, onEvent) {
    this.client = client
    this.badge = badge
    this.label = label
    this.onEvent = onEvent
    this.subscription = null
    this.filter = ''
    this.turn = null
  }

  /** Follow the namespace, or only the changes `filter` accepts; replaces a running stream. */
  start(filter = '') {
    this.stop()
    this.filter = filter
    this.badge.dataset.state = 'idle'
    this.set('connecting')
    const turn = {} // a stopped stream's late states are not this one's
    this.turn = turn
    this.subscription = this.client.subscribe('*', {
      filter: filter || undefined,
      onState: (state) => {
        if (this.turn === turn) this.set(BADGE[state.status] ?? 'waiting')
      },
    })
    this.pump(this.subscription)
  }

  async pump(subscription) {
    try {
      for await (const event of subscription) this.onEvent(event)
    } catch (error) {
      if (subscription !== this.subscription) return
      this.set('refused', error.status === 403 ? 'Live: off (this key may not subscribe here)'
        : error.status === 401 ? 'Live: off (the broker no longer accepts this key: sign in again)'
          : error.status === 400 && this.filter ? `Live: off (${explain(error)})`
            : `Live: stopped (${explain(error)})`)
    }
  }

  set(state, text = TEXT[state]) {
    if (state === 'closed' && this.badge.dataset.state === 'refused') return
    this.badge.dataset.state = state
    this.label.textContent = state === 'open' && this.filter ? `${text}, filtered` : text
  }

  stop() {
    const subscription = this.subscription
    this.subscription = null
    subscription?.close()
  }
}
