import { execFileSync } from 'node:child_process'
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { pino } from 'pino'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { EnvError } from '../../common/src/env.ts'
import { createConfigSource } from '../../gateway/src/config/configSource.ts'
import { ConfigError, loadGatewayConfig, parseGatewayConfig } from '../../gateway/src/config/loadConfig.ts'
import { certificateExpiry, readTlsPair } from '../../gateway/src/config/tlsFiles.ts'
import { createTlsRotation } from '../../gateway/src/config/tlsRotation.ts'
import { OPENSSL, issueCertificate, makeCa, opensslMissing, type TestCa, type TestCertificate } from '../helpers/certificates.ts'

const FIXTURE = 'test/fixtures/config/tls.yaml'

function problemsOf(load: () => unknown): string[] {
  try {
    load()
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError)
    return (error as ConfigError).problems
  }
  throw new Error('the config was accepted')
}

describe('gateway config: server.tls shape', () => {
  it('names the line and key of an empty path and of a key server.tls does not have (caFile)', () => {
    const fixture = 'test/fixtures/config/bad-tls.yaml'
    expect(problemsOf(() => parseGatewayConfig(readFileSync(fixture, 'utf8'), fixture))).toEqual([
      `${fixture}:7: server.tls.certFile must NOT have fewer than 1 characters`,
      `${fixture}:9: server.tls.caFile unknown key`,
    ])
  })

  it('the shipped config has no server.tls: plain HTTP, TLS in front of the gateway', () => {
    expect(loadGatewayConfig('config/gateway.yaml', {}).server.tls).toBeUndefined()
  })
})

/**
 * tls.yaml names tls/server.crt and tls/server.key, read from the config file's folder: each test
 * copies it into a temporary folder and the pair is generated there with the openssl CLI (no key
 * is kept in the repository).
 */
describe.skipIf(opensslMissing)('gateway config: server.tls files, checked at start and by check-config', () => {
  let directory: string
  let ca: TestCa
  let server: TestCertificate
  let other: TestCertificate
  let configFile: string

  beforeAll(() => {
    directory = mkdtempSync(path.join(os.tmpdir(), 'aas-tls-config-'))
    mkdirSync(path.join(directory, 'tls'))
    ca = makeCa(path.join(directory, 'tls'))
    server = issueCertificate(ca, 'server', '1001')
    other = issueCertificate(ca, 'other', '1002')
    configFile = path.join(directory, 'gateway.yaml')
    copyFileSync(FIXTURE, configFile)
  })
  afterAll(() => rmSync(directory, { recursive: true, force: true }))

  const line = (start: string) => readFileSync(configFile, 'utf8').split('\n').findIndex((text) => text.trimStart().startsWith(start)) + 1

  it('resolves relative paths from the config file folder, wherever the process runs, and reads the pair', () => {
    const config = loadGatewayConfig(configFile, {}, os.tmpdir())
    expect(config.server.tls).toEqual({ certFile: server.certFile, keyFile: server.keyFile })
    expect(readTlsPair(config.server.tls!).serialNumber).toBe('1001')
  })

  it('names the file and the line of a certificate or key that is missing, not PEM, or not the pair', () => {
    const keep = readFileSync(server.keyFile)
    try {
      rmSync(server.keyFile)
      expect(problemsOf(() => loadGatewayConfig(configFile, {}))).toEqual([
        `${configFile}:${line('keyFile:')}: server.tls.keyFile ${server.keyFile} cannot be read (ENOENT)`,
      ])
      writeFileSync(server.keyFile, 'not a key\n')
      expect(problemsOf(() => loadGatewayConfig(configFile, {}))).toEqual([
        `${configFile}:${line('keyFile:')}: server.tls.keyFile ${server.keyFile} holds no PEM private key (-----BEGIN PRIVATE KEY-----)`,
      ])
      // The certificate given where the key goes.
      copyFileSync(server.certFile, server.keyFile)
      expect(problemsOf(() => loadGatewayConfig(configFile, {}))[0]).toContain(`server.tls.keyFile ${server.keyFile} holds no PEM private key`)
      // Another certificate's key: both files named, at the line of server.tls.
      copyFileSync(other.keyFile, server.keyFile)
      expect(problemsOf(() => loadGatewayConfig(configFile, {}))).toEqual([
        `${configFile}:${line('tls:')}: server.tls ${server.keyFile} is not the private key of the certificate in ${server.certFile}`,
      ])
    } finally {
      writeFileSync(server.keyFile, keep)
    }
    const keepCert = readFileSync(server.certFile)
    try {
      writeFileSync(server.certFile, '-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n')
      expect(problemsOf(() => loadGatewayConfig(configFile, {}))[0]).toMatch(
        new RegExp(`^${configFile}:${line('certFile:')}: server.tls.certFile ${server.certFile} is not a valid PEM certificate \\(`),
      )
    } finally {
      writeFileSync(server.certFile, keepCert)
    }
    expect(loadGatewayConfig(configFile, {}).server.tls).toBeDefined()
  })

  // A rotation to an expired certificate (a rollback, a stale file behind a link) was taken as a
  // success, and every handshake of a client that checks it failed while /readyz said ready.
  it('refuses a rotation from a valid certificate to an expired one, keeping the one in force, and says when it expired', () => {
    const month = issueCertificate(ca, 'month', '2001', undefined, undefined, 30)
    const day = issueCertificate(ca, 'day', '2002')
    const files = { certFile: path.join(directory, 'rotating.crt'), keyFile: path.join(directory, 'rotating.key') }
    copyFileSync(month.certFile, files.certFile)
    copyFileSync(month.keyFile, files.keyFile)
    const errors: Record<string, unknown>[] = []
    const rotation = createTlsRotation(files, { info: () => undefined, error: (fields: Record<string, unknown>) => errors.push(fields) } as never)
    vi.useFakeTimers({ toFake: ['Date'] })
    try {
      // Two days on: the month's certificate is valid still, the day's has expired.
      vi.setSystemTime(Date.now() + 2 * 86_400_000)
      copyFileSync(day.certFile, files.certFile)
      copyFileSync(day.keyFile, files.keyFile)
      expect(rotation.reload()).toBe(false)
      expect(rotation.pair().serialNumber).toBe('2001')
      expect(errors[0]?.problem).toMatch(/rotating\.crt: the certificate expired on .*: clients that check it refuse every handshake, and the one in force is valid/)
      expect(certificateExpiry(readTlsPair(files))).toMatch(/^the certificate expired on /)
    } finally {
      vi.useRealTimers()
    }
  })

  // A certificate whose validity begins later (an issuer's clock ahead, a renewal staged early)
  // replaced a valid one at rotation: every client that checks it then failed its handshakes.
  it('says a certificate not valid yet is refused by clients that check it, as an expired one is', () => {
    const files = issueCertificate(ca, 'staged', '2003')
    const { validFrom } = readTlsPair(files)
    vi.useFakeTimers({ toFake: ['Date'] })
    try {
      vi.setSystemTime(validFrom.getTime() - 86_400_000)
      expect(certificateExpiry(readTlsPair(files))).toBe(`the certificate is not valid until ${validFrom.toISOString()}: clients that check it refuse every handshake`)
      vi.setSystemTime(validFrom.getTime() + 1_000)
      expect(certificateExpiry(readTlsPair(files))).toBeUndefined()
    } finally {
      vi.useRealTimers()
    }
  })

  // Refused, it waited on disk (reloads follow file changes and SIGHUP) while the one in force
  // went on to expire: it is read again once it is valid.
  it('refuses a rotation to a certificate not valid yet, keeping the one in force, and takes it once it is valid', async () => {
    const inForce = issueCertificate(ca, 'in-force', '2004')
    const inForceFrom = readTlsPair(inForce).validFrom.getTime()
    // A certificate's validity begins on a whole second: the next one issued a second later begins later.
    while (Math.floor(Date.now() / 1_000) * 1_000 <= inForceFrom) await new Promise((resolve) => setTimeout(resolve, 100))
    const staged = issueCertificate(ca, 'staged-later', '2005')
    const stagedFrom = readTlsPair(staged).validFrom.getTime()
    expect(stagedFrom).toBeGreaterThan(inForceFrom)
    const files = { certFile: path.join(directory, 'staged-rotation.crt'), keyFile: path.join(directory, 'staged-rotation.key') }
    copyFileSync(inForce.certFile, files.certFile)
    copyFileSync(inForce.keyFile, files.keyFile)
    const errors: Record<string, unknown>[] = []
    const rotation = createTlsRotation(files, { info: () => undefined, error: (fields: Record<string, unknown>) => errors.push(fields) } as never)
    vi.useFakeTimers({ toFake: ['Date', 'setTimeout', 'clearTimeout'] })
    try {
      vi.setSystemTime(stagedFrom - 500)
      copyFileSync(staged.certFile, files.certFile)
      copyFileSync(staged.keyFile, files.keyFile)
      expect(rotation.reload()).toBe(false)
      expect(rotation.pair().serialNumber).toBe('2004')
      expect(errors[0]?.problem).toMatch(/staged-rotation\.crt: the certificate is not valid until .*, and the one in force is valid/)
      await vi.advanceTimersByTimeAsync(1_600)
      expect(rotation.pair().serialNumber).toBe('2005')
    } finally {
      vi.useRealTimers()
    }
  })

  it('refuses a key encrypted with a passphrase, saying so', () => {
    const encrypted = path.join(directory, 'tls', 'encrypted.key')
    execFileSync(OPENSSL, ['pkey', '-in', server.keyFile, '-aes256', '-passout', 'pass:secret', '-out', encrypted])
    expect(() => readTlsPair({ certFile: server.certFile, keyFile: encrypted })).toThrow(`${encrypted} is encrypted: the gateway needs the key without a passphrase`)
  })

  it('GATEWAY_TLS_CERT_FILE and GATEWAY_TLS_KEY_FILE replace the settings (relative to the working directory), and must name the pair together when the file has none', () => {
    const env = { GATEWAY_TLS_CERT_FILE: other.certFile, GATEWAY_TLS_KEY_FILE: path.relative(process.cwd(), other.keyFile) }
    expect(loadGatewayConfig(configFile, env).server.tls).toEqual({ certFile: other.certFile, keyFile: other.keyFile })
    expect(() => loadGatewayConfig('config/gateway.yaml', { GATEWAY_TLS_CERT_FILE: other.certFile })).toThrow(
      new EnvError('GATEWAY_TLS_CERT_FILE is set without GATEWAY_TLS_KEY_FILE, and the config has no server.tls: HTTPS needs both the certificate and its key'),
    )
    // A variable's file that fails is named by the variable.
    expect(() => loadGatewayConfig(configFile, { GATEWAY_TLS_KEY_FILE: other.keyFile })).toThrow(
      `GATEWAY_TLS_KEY_FILE: ${other.keyFile} is not the private key of the certificate in ${server.certFile}`,
    )
  })

  it('refuses PEM text given where a path goes (a key pasted inline, a variable filled from a secret) without printing it', () => {
    const pem = readFileSync(server.keyFile, 'utf8')
    const secret = pem.split('\n')[1]!
    const inline = path.join(directory, 'inline.yaml')
    writeFileSync(inline, readFileSync(configFile, 'utf8').replace(/keyFile: .*/, `keyFile: |\n${pem.trim().split('\n').map((text) => `      ${text}`).join('\n')}`))
    const problems = problemsOf(() => loadGatewayConfig(inline, {}))
    expect(problems).toEqual([`${inline}:${line('keyFile:')}: server.tls.keyFile holds PEM text (or several lines), not a path: name the file that holds it (the value is not shown)`])
    expect(problems.join('\n')).not.toContain(secret)
    let refused: unknown
    try {
      loadGatewayConfig(configFile, { GATEWAY_TLS_KEY_FILE: pem })
    } catch (error) {
      refused = error
    }
    expect(refused).toEqual(new EnvError('GATEWAY_TLS_KEY_FILE holds PEM text (or several lines), not a path: name the file that holds it (the value is not shown)'))
    expect(String((refused as Error).message)).not.toContain(secret)
  })

  it('a config reload does not read the files in force (their rotation is checked on its own)', () => {
    const keep = readFileSync(server.keyFile)
    try {
      rmSync(server.keyFile)
      const inForce = { certFile: server.certFile, keyFile: server.keyFile }
      expect(loadGatewayConfig(configFile, {}, undefined, { tlsFiles: false, tlsInForce: inForce }).server.tls?.keyFile).toBe(server.keyFile)
      // The keys CLI's read (the plans only): no files in force, none read (the key is often the gateway's alone).
      expect(loadGatewayConfig(configFile, {}, undefined, { tlsFiles: false }).server.tls?.keyFile).toBe(server.keyFile)
    } finally {
      writeFileSync(server.keyFile, keep)
    }
  })

  // server.tls is read at start only: a reload naming files the next start cannot read was counted a
  // success (gauge 1) while check-config refused the same file, and the gateway then did not start again.
  it('a reload naming other files than those in force reads them: one that cannot be read is refused at its line, the running config kept', () => {
    const watched = path.join(directory, 'watched.yaml')
    const shipped = readFileSync(configFile, 'utf8')
    writeFileSync(watched, shipped)
    const logs: { msg: string; problems?: string[] }[] = []
    const logger = pino({ level: 'info' }, { write: (text: string) => void logs.push(JSON.parse(text) as (typeof logs)[number]) })
    const outcomes: string[] = []
    const source = createConfigSource(watched, {}, logger, (outcome) => outcomes.push(outcome))
    const keep = readFileSync(server.keyFile)
    try {
      // The pair in force, mid-rotation (its key replaced): a plan change still reloads.
      rmSync(server.keyFile)
      writeFileSync(watched, shipped.replace('perMinute: 60,', 'perMinute: 30,'))
      expect(source.reload()).toBe(true)

      const missing = path.join(directory, 'tls', 'next.crt')
      const next = shipped.replace(/certFile: .*/, `certFile: ${missing}`)
      writeFileSync(watched, next)
      expect(source.reload()).toBe(false)
      expect(outcomes).toEqual(['success', 'failure'])
      expect(logs.at(-1)).toMatchObject({
        msg: 'gateway config reload refused; the running config stays',
        problems: [`${watched}:${line('certFile:')}: server.tls.certFile ${missing} cannot be read (ENOENT)`],
      })
      expect(source.get().plans.free?.perMinute).toBe(30)
    } finally {
      writeFileSync(server.keyFile, keep)
    }
  })
})

// README, Managed Postgres and Redis: a Redis that asks clients for a certificate (tls-auth-clients
// yes, Redis's default) gets the pair REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE name.
describe.skipIf(opensslMissing)('gateway config: the certificate presented to Redis (REDIS_TLS_CERT_FILE, REDIS_TLS_KEY_FILE)', () => {
  let directory: string
  let client: TestCertificate
  let other: TestCertificate
  const TLS_REDIS = { REDIS_URL: 'rediss://redis.example.com:6380' }

  beforeAll(() => {
    directory = mkdtempSync(path.join(os.tmpdir(), 'aas-redis-client-tls-'))
    const ca = makeCa(directory)
    client = issueCertificate(ca, 'client', '2001')
    other = issueCertificate(ca, 'other', '2002')
  })
  afterAll(() => rmSync(directory, { recursive: true, force: true }))

  const load = (env: NodeJS.ProcessEnv) => loadGatewayConfig('config/gateway.yaml', env)

  it('takes the pair for a rediss:// REDIS_URL or rediss:// seeds, a relative path from the working directory; none by default', () => {
    const env = { REDIS_TLS_CERT_FILE: client.certFile, REDIS_TLS_KEY_FILE: path.relative(process.cwd(), client.keyFile) }
    expect(load({ ...TLS_REDIS, ...env }).redis.clientCertificate).toEqual({ certFile: client.certFile, keyFile: client.keyFile })
    expect(load({ REDIS_CLUSTER_NODES: 'rediss://node-1.example.com:6379,rediss://node-2.example.com:6379', ...env }).redis.clientCertificate).toEqual({
      certFile: client.certFile,
      keyFile: client.keyFile,
    })
    expect(load(TLS_REDIS).redis.clientCertificate).toBeUndefined()
  })

  it('refuses one without the other, and a pair no connection would present (no Redis, or one reached without TLS)', () => {
    expect(() => load({ ...TLS_REDIS, REDIS_TLS_CERT_FILE: client.certFile })).toThrow(
      new EnvError('REDIS_TLS_CERT_FILE is set without REDIS_TLS_KEY_FILE: a client certificate for Redis needs both the certificate and its key'),
    )
    expect(() => load({ ...TLS_REDIS, REDIS_TLS_KEY_FILE: client.keyFile })).toThrow('REDIS_TLS_KEY_FILE is set without REDIS_TLS_CERT_FILE')
    const pair = { REDIS_TLS_CERT_FILE: client.certFile, REDIS_TLS_KEY_FILE: client.keyFile }
    const refusal = 'REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE are set but no Redis is reached over TLS (a rediss:// REDIS_URL, or rediss:// seeds in REDIS_CLUSTER_NODES): no connection would present the certificate'
    for (const redis of [{}, { REDIS_URL: 'redis://redis.example.com:6379' }, { REDIS_CLUSTER_NODES: 'node-1.example.com:6379' }]) {
      expect(() => load({ ...redis, ...pair })).toThrow(new EnvError(refusal))
    }
  })

  // connectRedis uses REDIS_CLUSTER_NODES when both are set: the check must look where the gateway connects.
  it('beside both REDIS_URL and REDIS_CLUSTER_NODES, judges by the seeds, which the gateway connects to', () => {
    const pair = { REDIS_TLS_CERT_FILE: client.certFile, REDIS_TLS_KEY_FILE: client.keyFile }
    expect(load({ REDIS_URL: 'redis://redis.example.com:6379', REDIS_CLUSTER_NODES: 'rediss://node-1.example.com:6379', ...pair }).redis.clientCertificate).toEqual({
      certFile: client.certFile,
      keyFile: client.keyFile,
    })
    expect(() => load({ ...TLS_REDIS, REDIS_CLUSTER_NODES: 'node-1.example.com:6379', ...pair })).toThrow('no Redis is reached over TLS')
  })

  it('reads the pair at start, naming the variable of a file that is missing, not PEM, or not the pair', () => {
    const missing = path.join(directory, 'missing.key')
    expect(() => load({ ...TLS_REDIS, REDIS_TLS_CERT_FILE: client.certFile, REDIS_TLS_KEY_FILE: missing })).toThrow(
      new EnvError(`REDIS_TLS_KEY_FILE: ${missing} cannot be read (ENOENT)`),
    )
    expect(() => load({ ...TLS_REDIS, REDIS_TLS_CERT_FILE: client.keyFile, REDIS_TLS_KEY_FILE: client.keyFile })).toThrow(
      `REDIS_TLS_CERT_FILE: ${client.keyFile} holds no PEM certificate`,
    )
    expect(() => load({ ...TLS_REDIS, REDIS_TLS_CERT_FILE: client.certFile, REDIS_TLS_KEY_FILE: other.keyFile })).toThrow(
      new EnvError(`REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE: ${other.keyFile} is not the private key of the certificate in ${client.certFile}`),
    )
    // A config reload reads none of the files.
    expect(loadGatewayConfig('config/gateway.yaml', { ...TLS_REDIS, REDIS_TLS_CERT_FILE: client.certFile, REDIS_TLS_KEY_FILE: missing }, undefined, { tlsFiles: false }).redis.clientCertificate?.keyFile).toBe(missing)
  })

  it('refuses PEM text given where a path goes, without printing it', () => {
    const pem = readFileSync(client.keyFile, 'utf8')
    let refused: unknown
    try {
      load({ ...TLS_REDIS, REDIS_TLS_CERT_FILE: client.certFile, REDIS_TLS_KEY_FILE: pem })
    } catch (error) {
      refused = error
    }
    expect(refused).toEqual(new EnvError('REDIS_TLS_KEY_FILE holds PEM text (or several lines), not a path: name the file that holds it (the value is not shown)'))
    expect(String((refused as Error).message)).not.toContain(pem.split('\n')[1]!)
  })
})
