import type { Socket } from 'node:net'
import type { Logger } from 'pino'
import { countedLinesByKey } from '../../common/src/ops/countedLines.ts'

/**
 * Why a TLS handshake on the public port failed, as a bounded label: what an operator can act on.
 * `closed` is a client that hung up mid-handshake; a Node client that refuses the certificate does
 * that (over TLS 1.3) instead of sending an alert, as curl and browsers do (unknown_ca, …).
 */
export const HANDSHAKE_FAILURE_REASONS = [
  'http_request',
  'version',
  'no_shared_cipher',
  'alpn',
  'unknown_ca',
  'certificate_expired',
  'bad_certificate',
  'timeout',
  'closed',
  'other',
] as const
export type HandshakeFailureReason = (typeof HANDSHAKE_FAILURE_REASONS)[number]

/** Node's codes for OpenSSL's reasons (ERR_SSL_ + the reason) and its own handshake timeout. */
const REASON_OF_CODE: Record<string, HandshakeFailureReason> = {
  ERR_SSL_HTTP_REQUEST: 'http_request',
  ERR_SSL_HTTPS_PROXY_REQUEST: 'http_request',
  ERR_SSL_UNSUPPORTED_PROTOCOL: 'version',
  ERR_SSL_VERSION_TOO_LOW: 'version',
  ERR_SSL_VERSION_TOO_HIGH: 'version',
  ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION: 'version',
  ERR_SSL_NO_SHARED_CIPHER: 'no_shared_cipher',
  ERR_SSL_NO_SHARED_GROUPS: 'no_shared_cipher',
  ERR_SSL_NO_SUITABLE_SIGNATURE_ALGORITHM: 'no_shared_cipher',
  ERR_SSL_NO_APPLICATION_PROTOCOL: 'alpn',
  ERR_SSL_TLSV1_ALERT_UNKNOWN_CA: 'unknown_ca',
  ERR_SSL_SSLV3_ALERT_CERTIFICATE_EXPIRED: 'certificate_expired',
  ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE: 'bad_certificate',
  ERR_SSL_SSLV3_ALERT_CERTIFICATE_UNKNOWN: 'bad_certificate',
  ERR_SSL_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE: 'bad_certificate',
  ERR_SSL_SSLV3_ALERT_CERTIFICATE_REVOKED: 'bad_certificate',
  ERR_TLS_HANDSHAKE_TIMEOUT: 'timeout',
  ECONNRESET: 'closed',
  EPIPE: 'closed',
}

export function handshakeFailureReason(error: NodeJS.ErrnoException): HandshakeFailureReason {
  return REASON_OF_CODE[error.code ?? ''] ?? 'other'
}

/** At most one log line per reason in this time, carrying the failures since the line before. */
export const HANDSHAKE_LOG_INTERVAL_MILLIS = 60_000

/** Only Node's and OpenSSL's own names are logged; anything else is left out. */
const ERROR_CODE = /^[A-Z][A-Z0-9_]{0,79}$/

/**
 * The server's `tlsClientError` listener: counts each failed handshake by reason and logs them,
 * one warn per reason at most every `intervalMillis`, with the number since the last one, so a
 * scanner or a fleet of misconfigured clients cannot flood the log. A connection that sent no
 * byte before closing (a load balancer's TCP check, a port scan) is not a handshake and is left
 * alone. The log holds the reason, Node's error code and the last client's address, never bytes
 * the client sent (not its server name either).
 */
export function reportHandshakeFailures(
  logger: Pick<Logger, 'warn'>,
  onFailure?: (reason: HandshakeFailureReason) => void,
  intervalMillis = HANDSHAKE_LOG_INTERVAL_MILLIS,
) {
  // One counted line per reason: a flood of one kind does not hide the first failure of another.
  const say = countedLinesByKey<HandshakeFailureReason, { code?: string; remoteAddress?: string }>(intervalMillis, (reason, { code, remoteAddress }, count) =>
    logger.warn({ reason, count, code, lastRemoteAddress: remoteAddress, withinSeconds: intervalMillis / 1_000 }, 'TLS handshakes failed on the public port'),
  )

  return (error: NodeJS.ErrnoException, socket: Socket): void => {
    // The TLS socket's own count is of decrypted bytes; the TCP socket under it has the raw ones.
    const tcp = (socket as Socket & { _parent?: Socket | null })._parent
    // A client that closed before sending a byte (a TCP health check) made no handshake; one that
    // stayed silent until the handshake timeout cut it is counted with the other timeouts.
    if (tcp && tcp.bytesRead === 0 && error.code !== 'ERR_TLS_HANDSHAKE_TIMEOUT') return
    // A client that hung up is reported once its socket has closed, when only an address read
    // before (rememberClientAddress) is still known.
    const remoteAddress = socket.remoteAddress ?? tcp?.remoteAddress
    const reason = handshakeFailureReason(error)
    onFailure?.(reason)
    const code = error.code !== undefined && ERROR_CODE.test(error.code) ? error.code : undefined
    say(reason, { code, remoteAddress })
  }
}

/**
 * The server's `connection` listener, ahead of the TLS server's own: reads the client's address
 * while its TCP socket is open, which keeps it on the socket. A client that hangs up mid-handshake
 * is reported after its socket has closed, when the address can no longer be asked for.
 */
export function rememberClientAddress(socket: Socket): void {
  void socket.remoteAddress
}
