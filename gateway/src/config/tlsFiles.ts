import { X509Certificate, createPrivateKey } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { createSecureContext } from 'node:tls'

/** The files server.tls names, as absolute paths (resolveGatewayConfig resolves them). */
export interface TlsFiles {
  certFile: string
  keyFile: string
}

/** A certificate and its key as read, checked to be PEM and to belong together. */
export interface TlsPair {
  /** The certificate file's text: the server's certificate first, then any intermediates. */
  cert: Buffer
  key: Buffer
  /** Of the server's certificate, for the log lines and the metrics. */
  serialNumber: string
  subject: string
  validFrom: Date
  validTo: Date
}

/** A pair that cannot be served; `file` is the one at fault, or both when they do not match. */
export class TlsFilesError extends Error {
  readonly setting: 'certFile' | 'keyFile' | 'both'
  constructor(setting: 'certFile' | 'keyFile' | 'both', message: string) {
    super(message)
    this.name = 'TlsFilesError'
    this.setting = setting
  }
}

const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----/
const PEM_KEY = /-----BEGIN (?:RSA |EC |ENCRYPTED )?PRIVATE KEY-----/

function read(setting: 'certFile' | 'keyFile', file: string): Buffer {
  try {
    return readFileSync(file)
  } catch (error) {
    throw new TlsFilesError(setting, `${file} cannot be read (${(error as NodeJS.ErrnoException).code ?? 'error'})`)
  }
}

/** OpenSSL's reason without its prefix (`error:1E08010C:DECODER routines::unsupported` is the whole of some). */
function reason(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).split('\n')[0]!
}

/**
 * Reads server.tls's files and checks what the TLS server would otherwise refuse at start or at a
 * rotation, naming the file: a PEM certificate (a chain: the server's first), an unencrypted PEM
 * private key (the gateway has no passphrase to give), and a key that is the certificate's.
 */
export function readTlsPair({ certFile, keyFile }: TlsFiles): TlsPair {
  const cert = read('certFile', certFile)
  const key = read('keyFile', keyFile)
  if (!PEM_CERTIFICATE.test(cert.toString('latin1'))) {
    throw new TlsFilesError('certFile', `${certFile} holds no PEM certificate (-----BEGIN CERTIFICATE-----)`)
  }
  let certificate: X509Certificate
  try {
    certificate = new X509Certificate(cert)
  } catch (error) {
    throw new TlsFilesError('certFile', `${certFile} is not a valid PEM certificate (${reason(error)})`)
  }
  if (!PEM_KEY.test(key.toString('latin1'))) {
    throw new TlsFilesError('keyFile', `${keyFile} holds no PEM private key (-----BEGIN PRIVATE KEY-----)`)
  }
  let privateKey: ReturnType<typeof createPrivateKey>
  try {
    privateKey = createPrivateKey(key)
  } catch (error) {
    const why = reason(error)
    const encrypted = /passphrase/i.test(why) || /ENCRYPTED/.test(key.toString('latin1'))
    throw new TlsFilesError('keyFile', encrypted ? `${keyFile} is encrypted: the gateway needs the key without a passphrase` : `${keyFile} is not a valid PEM private key (${why})`)
  }
  if (!certificate.checkPrivateKey(privateKey)) {
    throw new TlsFilesError('both', `${keyFile} is not the private key of the certificate in ${certFile}`)
  }
  try {
    // What the server itself will do with them (a chain it cannot load, a key type it cannot use).
    createSecureContext({ cert, key })
  } catch (error) {
    throw new TlsFilesError('both', `${certFile} and ${keyFile} cannot be served together (${reason(error)})`)
  }
  return {
    cert,
    key,
    serialNumber: certificate.serialNumber,
    subject: certificate.subject.replaceAll('\n', ', '),
    validFrom: new Date(certificate.validFrom),
    validTo: new Date(certificate.validTo),
  }
}

/**
 * Why a client that checks the certificate refuses it now, or undefined: it has expired, or is
 * not valid yet (an issuer's clock ahead, a renewal staged early). Some clients do not check (a
 * load balancer in front, often given a self-signed certificate), so such a certificate is served
 * at start, with an error line; a rotation to one from a pair that is valid is refused
 * (tlsRotation.ts): a rollback, a stale file behind a link, a renewal put in place too soon.
 */
export function certificateExpiry(pair: Pick<TlsPair, 'validFrom' | 'validTo'>, now: Date = new Date()): string | undefined {
  if (pair.validTo < now) return `the certificate expired on ${pair.validTo.toISOString()}: clients that check it refuse every handshake`
  if (pair.validFrom > now) return `the certificate is not valid until ${pair.validFrom.toISOString()}: clients that check it refuse every handshake`
  return undefined
}
