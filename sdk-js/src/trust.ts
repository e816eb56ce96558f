/**
 * Which certificates the SDK accepts from an `https://` broker. By default the platform's
 * fetch decides (Node.js: its CA store, plus NODE_EXTRA_CA_CERTS; browsers: the system's). With
 * the `ca` option or MEMP_CA_BUNDLE (Node.js only), requests go through an undici `Agent`
 * trusting only those CAs; undici is what Node's own fetch is built on, and it is loaded only
 * then, so browsers never load it.
 */

import { ConnectionFailedError } from './errors.js'

/** PEM certificates: one text, or several; bytes are read as text. */
export type CertificateAuthorities = string | Uint8Array | ReadonlyArray<string | Uint8Array>

/** The part of undici used here (its own types would pull Node.js types into the library). */
interface Undici {
  Agent: new (options: { connect: { ca: string[] } }) => object
  fetch: (input: unknown, init: unknown) => Promise<Response>
}

/** A fetch that trusts only `ca`, or the PEM file `file`, built on first use. */
export function fetchTrusting(ca: CertificateAuthorities | undefined, file?: string): typeof fetch {
  let ready: Promise<Undici['fetch']> | undefined
  return async (input, init) => {
    ready ??= build(ca, file)
    return (await ready)(input, init)
  }
}

async function build(
  ca: CertificateAuthorities | undefined,
  file: string | undefined,
): Promise<Undici['fetch']> {
  const pems = file === undefined ? texts(ca ?? []) : [await read(file)]
  const undici = (await load('undici')) as Undici
  const dispatcher = new undici.Agent({ connect: { ca: pems } })
  return (input, init) => undici.fetch(input, { ...(init as object), dispatcher })
}

async function read(file: string): Promise<string> {
  const fs = (await load('node:fs/promises')) as {
    readFile(path: string, encoding: 'utf8'): Promise<string>
  }
  try {
    return await fs.readFile(file, 'utf8')
  } catch (error) {
    throw new ConnectionFailedError(
      `cannot read the CA bundle ${file} (MEMP_CA_BUNDLE): ${(error as Error).message}`,
      { code: 'connection_error', cause: error },
    )
  }
}

/** `import()` of a name bundlers do not follow: this code runs only in Node.js. */
function load(name: string): Promise<unknown> {
  return import(name)
}

function texts(ca: CertificateAuthorities): string[] {
  const list = typeof ca === 'string' || ca instanceof Uint8Array ? [ca] : [...ca]
  return list.map((pem) => (typeof pem === 'string' ? pem : new TextDecoder().decode(pem)))
}

/** Node.js's codes for a certificate it could not verify (OpenSSL's, and its own for names). */
const UNVERIFIED = new Set([
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_REJECTED',
  'CERT_REVOKED',
  'CERT_SIGNATURE_FAILURE',
  'CERT_UNTRUSTED',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'ERR_TLS_CERT_ALTNAME_INVALID',
  'HOSTNAME_MISMATCH',
  'INVALID_CA',
  'INVALID_PURPOSE',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
])

/** The certificate check that failed under a fetch error, if one did (Node.js says so in the
 * error's cause; browsers never tell). */
export function unverified(error: unknown): Error | null {
  let cause: unknown = error
  for (let depth = 0; depth < 4 && cause instanceof Error; depth++) {
    const code = (cause as { code?: unknown }).code
    if (typeof code === 'string' && UNVERIFIED.has(code)) return cause
    cause = (cause as { cause?: unknown }).cause
  }
  return null
}
