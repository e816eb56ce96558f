// The console's copy of the browser bundle is what `npm run bundle:console` makes from src/ now.

import assert from 'node:assert/strict'
import { readFile } from 'node:fs/promises'
import { test } from 'node:test'

import { BUNDLE, bundle } from '../scripts/bundle.mjs'

test('the committed browser bundle is up to date (run `npm run bundle:console` after changing src/)', async () => {
  const committed = await readFile(BUNDLE, 'utf8')
  assert.ok(committed === (await bundle()), `${BUNDLE} is stale: run \`npm run bundle\` in sdk-js`)
})

test('the bundle loads nothing from Node.js or the network', async () => {
  const text = await bundle()
  assert.doesNotMatch(text, /from ['"](node:|undici|https?:)/)
  assert.match(text, /export \{/)
})
