import type { Socket } from 'node:net'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { handshakeFailureReason, reportHandshakeFailures, type HandshakeFailureReason } from '../../gateway/src/handshakeFailures.ts'

/** A TLS socket as the server hands it to tlsClientError: the TCP socket under it counts the bytes read. */
function tlsSocket(bytesRead = 300, remoteAddress = '192.0.2.7'): Socket {
  return { remoteAddress, _parent: { bytesRead } } as unknown as Socket
}

const failure = (code: string) => Object.assign(new Error(code), { code })

describe('failed TLS handshakes: counted each, logged at most once a minute per reason', () => {
  beforeEach(() => void vi.useFakeTimers())
  afterEach(() => void vi.useRealTimers())

  function reporter() {
    const warn = vi.fn()
    const counted: HandshakeFailureReason[] = []
    const report = reportHandshakeFailures({ warn } as never, (reason) => counted.push(reason))
    const lines = () => warn.mock.calls.map(([fields]) => fields as Record<string, unknown>)
    return { report, counted, lines }
  }

  it('a burst of plain-HTTP clients is one line at once, then one line with the rest of the minute', () => {
    const { report, counted, lines } = reporter()
    for (let i = 0; i < 1_000; i++) report(failure('ERR_SSL_HTTP_REQUEST'), tlsSocket())
    expect(counted).toHaveLength(1_000)
    expect(lines()).toEqual([expect.objectContaining({ reason: 'http_request', count: 1, code: 'ERR_SSL_HTTP_REQUEST', lastRemoteAddress: '192.0.2.7' })])
    vi.advanceTimersByTime(60_000)
    expect(lines()).toHaveLength(2)
    expect(lines()[1]).toMatchObject({ reason: 'http_request', count: 999 })
    // A quiet minute ends the quiet: the next failure is logged at once.
    vi.advanceTimersByTime(60_000)
    expect(lines()).toHaveLength(2)
    report(failure('ERR_SSL_HTTP_REQUEST'), tlsSocket())
    expect(lines()).toHaveLength(3)
    expect(lines()[2]).toMatchObject({ count: 1 })
  })

  it('each reason has its own line', () => {
    const { report, lines } = reporter()
    report(failure('ERR_SSL_TLSV1_ALERT_UNKNOWN_CA'), tlsSocket())
    report(failure('ERR_SSL_UNSUPPORTED_PROTOCOL'), tlsSocket())
    report(failure('ERR_SSL_TLSV1_ALERT_UNKNOWN_CA'), tlsSocket())
    expect(lines().map((line) => line.reason)).toEqual(['unknown_ca', 'version'])
  })

  it('a connection closed before sending a byte (a TCP health check) is not a handshake', () => {
    const { report, counted, lines } = reporter()
    report(failure('ECONNRESET'), tlsSocket(0))
    expect(counted).toEqual([])
    expect(lines()).toEqual([])
  })

  // A flood of connections that never say a word was cut at the timeout, and showed nowhere in
  // the TLS series, though README counts "no handshake within the header timeout".
  it('a connection that sends nothing until the handshake timeout cuts it is a timeout', () => {
    const { report, counted, lines } = reporter()
    report(failure('ERR_TLS_HANDSHAKE_TIMEOUT'), tlsSocket(0))
    expect(counted).toEqual(['timeout'])
    expect(lines()).toEqual([expect.objectContaining({ reason: 'timeout', code: 'ERR_TLS_HANDSHAKE_TIMEOUT' })])
  })

  it('an error code that is not one of Node\'s names is not logged', () => {
    const { report, lines } = reporter()
    report(failure('\u001b[31mX'), tlsSocket())
    expect(lines()).toEqual([expect.objectContaining({ reason: 'other', code: undefined })])
  })

  it('names the reasons from the codes Node gives', () => {
    expect(handshakeFailureReason(failure('ERR_SSL_SSLV3_ALERT_CERTIFICATE_EXPIRED'))).toBe('certificate_expired')
    expect(handshakeFailureReason(failure('ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE'))).toBe('bad_certificate')
    expect(handshakeFailureReason(failure('ERR_SSL_NO_APPLICATION_PROTOCOL'))).toBe('alpn')
    expect(handshakeFailureReason(failure('ERR_TLS_HANDSHAKE_TIMEOUT'))).toBe('timeout')
    expect(handshakeFailureReason(failure('ERR_SSL_WRONG_VERSION_NUMBER'))).toBe('other')
  })
})
