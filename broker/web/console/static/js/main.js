// The console's shell: sign-in, the namespace, the views (tabs), and the live stream.

import { $, explain, fill, refreshAges } from './dom.js'
import { AgentNames } from './names.js'
import * as session from './session.js'
import { Live } from './live.js'
import { KeyTree } from './tree.js'
import { EntryView } from './entry.js'
import { ProposalsView } from './proposals.js'
import { AuditView } from './audit.js'
import { AmpView } from './amp.js'

const VIEWS = ['memory', 'proposals', 'audit', 'amp']
const AGES_MS = 5000 // how often shown ages ("30 s ago") are brought up to date
let current = null // { session, client, live, tree, entry, views }

function showSignIn(message = '') {
  $('app').hidden = true
  for (const id of ['who', 'stream', 'ns-form', 'live-filter-form', 'sign-out']) $(id).hidden = true
  $('signin').hidden = false
  $('signin-error').textContent = message
  const saved = session.load()
  if (saved) $('signin-ns').value = saved.namespace
  $('signin-key').focus()
}

async function signIn(saved) {
  const client = session.client(saved)
  // One cheap call proves the token; 403 (no read here) still signs in: the key may review.
  try {
    await client.memory.page('*', { limit: 1 })
  } catch (error) {
    if (error.status !== 403) throw error
  }
  session.save(saved)
  start(saved, client)
}

function start(saved, client) {
  stop()
  $('signin').hidden = true
  $('app').hidden = false
  for (const id of ['who', 'stream', 'ns-form', 'live-filter-form', 'sign-out']) $(id).hidden = false
  $('who').textContent = `${session.describeKey(saved.key)} · namespace ${saved.namespace}`
  $('ns-input').value = saved.namespace
  document.title = `${saved.namespace} · MEMP console`
  const names = new AgentNames(client)
  const entry = new EntryView(client, $('entry'), names)
  const tree = new KeyTree(client, { onSelect: (key) => entry.open(key) })
  const live = new Live(client, $('stream'), $('stream-text'), (event) => {
    tree.onEvent(event)
    entry.onEvent(event)
  })
  current = {
    session: saved, client, live, tree, entry,
    views: {
      proposals: new ProposalsView(client, $('proposals'), names),
      audit: new AuditView(client, $('audit'), names),
      amp: new AmpView(client, $('amp'), names),
    },
    ages: setInterval(() => refreshAges(), AGES_MS),
  }
  tree.reload()
  $('live-filter-input').value = ''
  live.start()
  route()
}

function stop() {
  if (!current) return
  current.live.stop()
  clearInterval(current.ages)
  current.client.close()
  current = null
  fill($('entry'))
}

function route() {
  if (!current) return
  const view = VIEWS.includes(location.hash.slice(1)) ? location.hash.slice(1) : 'memory'
  for (const name of VIEWS) {
    $(`view-${name}`).hidden = name !== view
    const tab = $(`tab-${name}`)
    if (name === view) tab.setAttribute('aria-current', 'page')
    else tab.removeAttribute('aria-current')
  }
  current.views[view]?.show()
}

$('signin-form').addEventListener('submit', async (event) => {
  event.preventDefault()
  const key = $('signin-key').value.trim()
  const namespace = $('signin-ns').value.trim()
  const button = event.submitter
  if (button) button.disabled = true
  $('signin-error').textContent = ''
  try {
    await signIn({ key, namespace })
    $('signin-key').value = ''
    $('main').focus()
  } catch (error) {
    $('signin-error').textContent = error.status === 401
      ? 'The broker does not accept this key.' : `Cannot sign in: ${explain(error)}`
  } finally {
    if (button) button.disabled = false
  }
})

$('ns-form').addEventListener('submit', (event) => {
  event.preventDefault()
  const namespace = $('ns-input').value.trim()
  if (!current || !namespace || namespace === current.session.namespace) return
  const saved = { key: current.session.key, namespace }
  session.save(saved)
  start(saved, session.client(saved))
})

// The live stream follows only the changes the filter accepts (the broker's filter
// language); the tree and the open entry then update for those alone.
$('live-filter-form').addEventListener('submit', (event) => {
  event.preventDefault()
  if (current) current.live.start($('live-filter-input').value.trim())
})

$('sign-out').addEventListener('click', () => {
  stop()
  session.clear()
  $('signin-ns').value = ''
  showSignIn('Signed out.')
})

window.addEventListener('hashchange', route)

const saved = session.load()
if (saved) start(saved, session.client(saved))
else showSignIn()
