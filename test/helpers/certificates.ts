import { execFileSync } from 'node:child_process'
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import path from 'node:path'

export const OPENSSL = '/usr/bin/openssl'

/** Why TLS tests cannot run here, or undefined: they generate their certificates with the openssl CLI. */
export const opensslMissing = existsSync(OPENSSL) ? undefined : `${OPENSSL} not found: the TLS tests make their throwaway CA and certificates with it`

function openssl(args: string[], cwd: string): void {
  execFileSync(OPENSSL, args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] })
}

export interface TestCa {
  directory: string
  certFile: string
  keyFile: string
  /** The CA certificate's PEM, for a client's `ca`. */
  pem: string
}

/** A throwaway certificate authority (P-256, one day) in `directory`. */
export function makeCa(directory: string, name = 'ca'): TestCa {
  const certFile = path.join(directory, `${name}.crt`)
  const keyFile = path.join(directory, `${name}.key`)
  openssl(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', keyFile, '-out', certFile, '-days', '1', '-subj', `/CN=test ${name}`], directory)
  return { directory, certFile, keyFile, pem: readFileSync(certFile, 'utf8') }
}

export interface TestCertificate {
  certFile: string
  keyFile: string
  /** As node:tls and X509Certificate show it: upper-case hex. */
  serialNumber: string
}

/**
 * A server certificate for 127.0.0.1 and localhost (or `altNames`) signed by `ca`, with the serial
 * `serial` (hex), valid for `days`. `commonName` is the subject's CN: a client certificate for
 * Postgres's `cert` authentication names the database user there.
 */
export function issueCertificate(ca: TestCa, name: string, serial: string, altNames = 'IP:127.0.0.1,DNS:localhost', commonName = 'localhost', days = 1): TestCertificate {
  const { directory } = ca
  const keyFile = path.join(directory, `${name}.key`)
  const certFile = path.join(directory, `${name}.crt`)
  const csr = path.join(directory, `${name}.csr`)
  const extensions = path.join(directory, `${name}.ext`)
  writeFileSync(extensions, `subjectAltName=${altNames}\n`)
  openssl(['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', keyFile, '-out', csr, '-subj', `/CN=${commonName}`], directory)
  openssl(['x509', '-req', '-in', csr, '-CA', ca.certFile, '-CAkey', ca.keyFile, '-set_serial', `0x${serial}`, '-days', String(days), '-extfile', extensions, '-out', certFile], directory)
  return { certFile, keyFile, serialNumber: serial.toUpperCase() }
}
