// The README's code blocks marked to run (```js run), run as written: each one as a program
// (an ES module importing 'memp-sdk', the package built in dist/) against a real broker, with
// MEMP_API_KEY the admin key and a namespace of its own, so an example cannot rot.

import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { after, test } from 'node:test'

import { ADMIN_KEY, namespace, SDK_DIR, useServices } from './helpers.js'

const services = useServices()
const README = resolve(SDK_DIR, 'README.md')
const ENTRY = pathToFileURL(resolve(SDK_DIR, 'dist', 'index.js')).href
const blocks = [...readFileSync(README, 'utf8').matchAll(/^```js run\n([\s\S]*?)^```$/gm)]
  .map((match) => match[1] ?? '')
const scratch = mkdtempSync(join(tmpdir(), 'memp-readme-'))
after(() => rmSync(scratch, { recursive: true, force: true }))

/** @param {string} file @param {Record<string, string>} env */
function run(file, env) {
  return new Promise((done) => {
    const child = spawn(process.execPath, [file], { env: { ...process.env, ...env } })
    let output = ''
    child.stdout.on('data', (chunk) => { output += chunk })
    child.stderr.on('data', (chunk) => { output += chunk })
    child.on('close', (code) => done({ code, output }))
  })
}

test('the README marks the blocks that run', () => {
  assert.ok(blocks.length >= 1, 'no ```js run block in sdk-js/README.md')
})

blocks.forEach((code, index) => {
  test(`README block ${index + 1} runs as written`, async () => {
    const file = join(scratch, `block-${index + 1}.mjs`)
    writeFileSync(file, code.replaceAll("from 'memp-sdk'", `from '${ENTRY}'`))
    const { code: status, output } = await /** @type {Promise<{ code: number, output: string }>} */ (
      run(file, { MEMP_BASE_URL: services.url, MEMP_API_KEY: ADMIN_KEY, MEMP_NAMESPACE: namespace('readme') }))
    assert.equal(status, 0, `${code}\n---\n${output}`)
  })
})
