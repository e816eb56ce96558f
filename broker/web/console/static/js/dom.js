// DOM helpers. Text goes in through textContent only: nothing a broker returns is ever parsed
// as HTML (the page's CSP refuses HTML sinks anyway, with Trusted Types).

/** An element: h('button', { type: 'button', onclick: fn }, 'text', child, ...). */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag)
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue
    if (name.startsWith('on') && typeof value === 'function') {
      node.addEventListener(name.slice(2), value)
    } else if (name === 'class') {
      node.className = value
    } else if (name === 'dataset') {
      Object.assign(node.dataset, value)
    } else if (value === true) {
      node.setAttribute(name, '')
    } else {
      node.setAttribute(name, String(value))
    }
  }
  append(node, children)
  return node
}

function append(node, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue
    if (Array.isArray(child)) append(node, child)
    else node.append(child instanceof Node ? child : String(child))
  }
}

/** Replace everything inside `node`. */
export function fill(node, ...children) {
  node.replaceChildren()
  append(node, children)
  return node
}

export const $ = (id) => document.getElementById(id)

/** A definition list of [label, value] pairs (values may be nodes). */
export function fields(pairs) {
  return h('dl', { class: 'fields' },
    pairs.filter(Boolean).map(([label, value]) => [h('dt', {}, label), h('dd', {}, value)]))
}

/** A table: heads, then rows of cells (strings or nodes). */
export function table(caption, heads, rows) {
  return h('div', { class: 'table-wrap' },
    h('table', {},
      caption ? h('caption', { class: 'visually-hidden' }, caption) : null,
      h('thead', {}, h('tr', {}, heads.map((head) => h('th', { scope: 'col' }, head)))),
      h('tbody', {}, rows.map((cells) => h('tr', {}, cells.map((cell) => h('td', {}, cell)))))))
}

/** A Unix-ms or ISO time, in local time with its age ("3 s ago"). */
export function when(moment) {
  if (moment === null || moment === undefined || moment === '') return '—'
  const date = typeof moment === 'number' ? new Date(moment) : new Date(String(moment))
  if (Number.isNaN(date.getTime())) return String(moment)
  return h('time', { datetime: date.toISOString(), title: date.toISOString(), 'data-at': String(date.getTime()) },
    stamp(date))
}

function stamp(date) {
  return `${date.toLocaleString()} (${age(date.getTime())})`
}

/** Bring every shown age ("30 s ago") up to date; the shell calls it every few seconds. */
export function refreshAges(root = document) {
  for (const time of root.querySelectorAll('time[data-at]')) {
    const text = stamp(new Date(Number(time.dataset.at)))
    if (time.textContent !== text) time.textContent = text
  }
}

export function age(ms) {
  let seconds = Math.round((Date.now() - ms) / 1000)
  const future = seconds < 0
  seconds = Math.abs(seconds)
  const text = seconds < 60 ? `${seconds} s`
    : seconds < 3600 ? `${Math.round(seconds / 60)} min`
      : seconds < 86400 ? `${Math.round(seconds / 3600)} h` : `${Math.round(seconds / 86400)} d`
  return future ? `in ${text}` : `${text} ago`
}

/** Pretty JSON for display. */
export function pretty(value) {
  return value === undefined ? '(none)' : JSON.stringify(value, null, 2)
}

/** A short message for an error from the SDK or fetch. */
export function explain(error) {
  if (!error) return 'unknown error'
  const status = error.status ? ` (${error.status})` : ''
  return `${error.message || String(error)}${status}`
}

/** Arrow-key movement between the focusable items of a list (Up/Down/Home/End). */
export function arrowKeys(list, selector = 'button') {
  list.addEventListener('keydown', (event) => {
    const items = [...list.querySelectorAll(selector)]
    const index = items.indexOf(document.activeElement)
    if (index < 0) return
    let next = null
    if (event.key === 'ArrowDown') next = items[index + 1]
    else if (event.key === 'ArrowUp') next = items[index - 1]
    else if (event.key === 'Home') next = items[0]
    else if (event.key === 'End') next = items[items.length - 1]
    if (next) {
      event.preventDefault()
      next.focus()
    }
  })
}
