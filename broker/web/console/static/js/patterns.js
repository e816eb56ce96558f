// The broker's key patterns (docs/api.md, "Concepts"): an exact key, a prefix ending in `*`, or `*`
// as whole middle segments matching exactly one segment.

/** Does `key` match `pattern`? */
export function matches(pattern, key) {
  if (pattern === '*') return true
  const star = pattern.indexOf('*')
  if (star < 0) return pattern === key
  const parts = pattern.split('/')
  const last = parts[parts.length - 1]
  const segments = key.split('/')
  const middle = parts.slice(0, -1)
  if (!middle.includes('*')) {
    return pattern.endsWith('*') && key.startsWith(pattern.slice(0, -1))
  }
  // Middle `*` segments: compare segment by segment; a final `x*` matches the rest.
  for (let i = 0; i < middle.length; i++) {
    if (i >= segments.length) return false
    if (middle[i] !== '*' && middle[i] !== segments[i]) return false
  }
  const rest = segments.slice(middle.length).join('/')
  if (last.endsWith('*')) return segments.length > middle.length && rest.startsWith(last.slice(0, -1))
  return segments.length === middle.length + 1 && rest === last
}

/** Is `text` a pattern the broker accepts (roughly: no empty segments, `*` placed right)? */
export function validPattern(text) {
  if (!text || text.length > 1024) return false
  const parts = text.split('/')
  return parts.every((part, i) => part !== '' && part !== '.' && part !== '..' &&
    (!part.includes('*') || part === '*' || (i === parts.length - 1 && part.endsWith('*') &&
      part.indexOf('*') === part.length - 1)))
}
