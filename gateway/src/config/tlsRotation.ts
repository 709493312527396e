import type { SecureContextOptions } from 'node:tls'
import type { Logger } from 'pino'
import { versionOf, watchFiles } from './fileWatch.ts'
import { TlsFilesError, certificateExpiry, readTlsPair, type TlsFiles, type TlsPair } from './tlsFiles.ts'

export interface TlsRotation {
  /** The pair the public port serves to new connections. */
  pair(): TlsPair
  /** Reads the files again; a pair that fails the checks keeps the one in force. */
  reload(): boolean
  /** Reloads on SIGHUP and when either file changes, into `server`; returns a function that stops watching. */
  watch(server: { setSecureContext(options: SecureContextOptions): void }): () => void
}

/**
 * How long a change of the files is left to settle before they are read: tools that renew a
 * certificate write the two files one after the other (`cp cert.pem …; cp key.pem …`), and read
 * between the two they are a mismatched pair, an error line and a failed reload with the final
 * pair valid. SIGHUP reads at once: whoever sends it says the files are ready.
 */
export const TLS_SETTLE_MILLIS = 1_000

/** What the server is given of a pair (the listener's own options, ALPN and the handshake timeout, stay). */
export function secureContextOptions(pair: TlsPair): SecureContextOptions {
  return { cert: pair.cert, key: pair.key }
}

/** setTimeout's longest wait (about 24.8 days); a pair valid later is read again then, and waits again. */
const MOST_TIMER_MILLIS = 2 ** 31 - 1

/**
 * The certificate of the public port, rotated without a restart: on SIGHUP and when either file
 * changes the pair is read and checked again (readTlsPair; an expired certificate replaces no
 * valid one: certificateExpiry) and handed to the running server with setSecureContext. New
 * connections get it; open ones keep the certificate they shook hands with. A pair that fails the
 * checks is logged with the reason and the one in force stays.
 */
export function createTlsRotation(
  files: TlsFiles,
  logger: Logger,
  onReload?: (outcome: 'success' | 'failure', pair: TlsPair) => void,
): TlsRotation {
  // stat follows links: a certbot live/ link moved to a new archive file is a change.
  const paths = [files.certFile, files.keyFile]
  const versions = () => versionOf(paths)
  let readAt = versions()
  let current = readTlsPair(files)
  let server: { setSecureContext(options: SecureContextOptions): void } | undefined
  const describe = (pair: TlsPair) => ({ serialNumber: pair.serialNumber, subject: pair.subject, validTo: pair.validTo.toISOString() })
  // A pair refused for not being valid yet is read again once it is (a second after): reloads
  // follow file changes and SIGHUP only, and it would have waited on disk while the one in force
  // went on to expire.
  let onceValid: NodeJS.Timeout | undefined

  const reload = (): boolean => {
    readAt = versions()
    clearTimeout(onceValid)
    try {
      const next = readTlsPair(files)
      const expired = certificateExpiry(next)
      // Taken as a success, such a rotation ended every handshake of clients that check.
      if (expired && !certificateExpiry(current)) {
        const wait = next.validFrom.getTime() - Date.now()
        if (wait > 0) {
          onceValid = setTimeout(reload, Math.min(wait + 1_000, MOST_TIMER_MILLIS))
          onceValid.unref()
        }
        throw new TlsFilesError('certFile', `${files.certFile}: ${expired}, and the one in force is valid`)
      }
      server?.setSecureContext(secureContextOptions(next))
      const previous = current
      current = next
      logger.info({ ...files, ...describe(next), previousSerialNumber: previous.serialNumber }, 'TLS certificate reloaded: new connections get it')
      onReload?.('success', current)
      return true
    } catch (error) {
      logger.error(
        { ...files, problem: error instanceof Error ? error.message : String(error), inForce: describe(current) },
        'TLS certificate reload refused; the certificate in force stays',
      )
      onReload?.('failure', current)
      return false
    }
  }

  let settling: NodeJS.Timeout | undefined
  const reloadOnceSettled = () => {
    clearTimeout(settling)
    settling = setTimeout(() => {
      settling = undefined
      reload()
    }, TLS_SETTLE_MILLIS)
    settling.unref()
  }

  return {
    pair: () => current,
    reload,
    watch(target) {
      server = target
      const onSignal = () => {
        clearTimeout(settling)
        settling = undefined
        reload()
      }
      process.on('SIGHUP', onSignal)
      const stopWatching = watchFiles(paths, () => readAt, reloadOnceSettled)
      return () => {
        stopWatching()
        clearTimeout(settling)
        clearTimeout(onceValid)
        process.off('SIGHUP', onSignal)
        server = undefined
      }
    },
  }
}
