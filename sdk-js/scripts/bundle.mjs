// The browser bundle the broker's console loads (broker/web/console/static/vendor/memp-sdk.js):
// one ES module with eventsource-parser inside, made by esbuild from src/. `node
// scripts/bundle.mjs` writes it; test/bundle.test.js checks the committed copy is current.

import { build } from 'esbuild'
import { writeFile } from 'node:fs/promises'
import { dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const SDK_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '..')
export const BUNDLE = resolve(SDK_DIR, '..', 'broker', 'web', 'console', 'static', 'vendor', 'memp-sdk.js')
const BANNER =
  '// memp-sdk browser bundle: generated from sdk-js/src by `npm run bundle:console`; do not edit.'

/** The bundle's text, built in memory. */
export async function bundle() {
  const result = await build({
    entryPoints: [resolve(SDK_DIR, 'src', 'index.ts')],
    bundle: true,
    format: 'esm',
    platform: 'browser',
    target: 'es2022',
    legalComments: 'none',
    banner: { js: BANNER },
    write: false,
    logLevel: 'silent',
  })
  const [output] = result.outputFiles ?? []
  if (!output) throw new Error('esbuild wrote nothing')
  return output.text
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await writeFile(BUNDLE, await bundle())
  console.log(`wrote ${BUNDLE}`)
}
