import { copyFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { eventually, sleep } from '../gateway/rateLimit/httpLimits.ts'
import { issueCertificate, makeCa, opensslMissing } from '../helpers/certificates.ts'
import { CLIENT_CERTIFICATE_HBA, privatePostgresAvailable, startPrivatePostgres, type PrivatePostgres } from '../helpers/postgresServer.ts'
import { baseEnv, exitWithin, freePort, killAll, runKeysCli, startNode, waitForReady, type NodeProcess } from '../scripts/processes.ts'
import { OPS_TEST_TOKEN, startGatewayProcess } from './gatewayProcess.ts'

// README, Managed Postgres and Redis: `sslmode` in DATABASE_URL follows pg, and a Postgres that asks
// for a client certificate (pg_hba.conf's `hostssl … cert`, no password) gets the one DATABASE_URL's
// sslcert and sslkey name. The gateway, the pets-service and the keys CLI log in with it; without it
// each exits 1 at once with Postgres's words and the fix, in one line (no stack trace, no wait); and
// none of them prints the key or the URL's password.
const URL_PASSWORD = 'url-password-not-to-be-printed'

describe.skipIf(opensslMissing !== undefined || !privatePostgresAvailable())('a Postgres that takes only TLS with a client certificate (hostssl … cert)', () => {
  let directory: string
  let postgres: PrivatePostgres
  let files: { ca: string; cert: string; key: string }
  let keyBody: string[]

  /** DATABASE_URL as an operator writes it for this server; `ssl` the parameters after sslmode. */
  const databaseUrl = (ssl: string) =>
    `postgres://postgres:${URL_PASSWORD}@127.0.0.1:${postgres.port}/postgres?sslmode=verify-full&sslrootcert=${files.ca}${ssl}`
  const withCertificate = () => databaseUrl(`&sslcert=${files.cert}&sslkey=${files.key}`)

  beforeAll(async () => {
    directory = mkdtempSync(path.join(os.tmpdir(), 'aas-pg-tls-'))
    const ca = makeCa(directory)
    const server = issueCertificate(ca, 'server', '01')
    // `cert` authentication: the certificate's CN is the role it logs in as.
    const client = issueCertificate(ca, 'client', '02', 'DNS:postgres', 'postgres')
    files = { ca: ca.certFile, cert: client.certFile, key: client.keyFile }
    keyBody = readFileSync(client.keyFile, 'utf8').split('\n').filter((line) => line && !line.startsWith('-----'))
    postgres = await startPrivatePostgres({}, { ssl: { certFile: server.certFile, keyFile: server.keyFile, caFile: ca.certFile }, hba: CLIENT_CERTIFICATE_HBA })
  })
  afterEach(killAll)
  afterAll(async () => {
    await postgres?.close()
    if (directory) rmSync(directory, { recursive: true, force: true })
  })

  /** Nothing any process wrote holds the client key or the URL's password. */
  function expectNoSecrets(output: string, who: string) {
    expect(output, who).not.toContain(URL_PASSWORD)
    expect(output, who).not.toContain('PRIVATE KEY')
    for (const line of keyBody) expect(output, who).not.toContain(line)
  }

  async function petsServiceEnv(url: string) {
    const [port, opsPort] = [await freePort(), await freePort()]
    const env = {
      ...baseEnv(),
      DATABASE_URL: url,
      INTERNAL_TOKEN: OPS_TEST_TOKEN,
      PETS_HOST: '127.0.0.1',
      PETS_PORT: String(port),
      PETS_OPS_HOST: '127.0.0.1',
      PETS_OPS_PORT: String(opsPort),
    }
    return { env, port, opsPort }
  }

  it('the pets-service, the gateway and the keys CLI log in with sslcert and sslkey, over TLS, as the certificate\'s CN', async () => {
    // The server really refuses a login without the certificate (the proof is worth nothing otherwise).
    const bare = new pg.Client({ connectionString: databaseUrl('') })
    await expect(bare.connect()).rejects.toThrow('connection requires a valid client certificate')
    await bare.end().catch(() => undefined)

    const pets = await petsServiceEnv(withCertificate())
    const petsService = startNode('pets-service/src/main.ts', { ...pets.env, LOG_LEVEL: 'debug' })
    await waitForReady(`http://127.0.0.1:${pets.opsPort}/readyz`, petsService, 20_000)
    const gateway = await startGatewayProcess({
      databaseUrl: withCertificate(),
      petsUrl: `http://127.0.0.1:${pets.port}`,
      env: { LOG_LEVEL: 'debug' },
    })
    try {
      expect(await gateway.readyz()).toEqual({ status: 200, body: { status: 'ready', dependencies: { postgres: 'up', upstream: 'up' } } })
      const cliEnv = { ...baseEnv(), DATABASE_URL: withCertificate() }
      const created = await runKeysCli(['create', '--plan', 'free', '--name', 'over-tls', '--json'], cliEnv)
      expect(created.code, created.stderr).toBe(0)
      const { key } = JSON.parse(created.stdout) as { key: string }
      const answer = await fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })
      expect(answer.status).toBe(200)
      const listed = await runKeysCli(['list'], cliEnv)
      expect(listed.code, listed.stderr).toBe(0)
      expect(listed.stdout).toContain('over-tls')

      // Every connection the services hold came over TLS with the client certificate.
      const admin = new pg.Client({ connectionString: postgres.socketUrl })
      await admin.connect()
      try {
        const { rows } = await admin.query<{ application_name: string; ssl: boolean; client_dn: string | null }>(
          `SELECT a.application_name, s.ssl, s.client_dn FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
            WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()`,
        )
        expect(rows.map((row) => row.application_name)).toEqual(expect.arrayContaining(['gateway', 'gateway-key-changes', 'pets-service']))
        for (const row of rows) expect(row, row.application_name).toMatchObject({ ssl: true, client_dn: '/CN=postgres' })
      } finally {
        await admin.end()
      }
      for (const [who, output] of [['pets-service', petsService.output()], ['gateway', gateway.proc.output()], ['keys create', created.stdout + created.stderr], ['keys list', listed.stdout + listed.stderr]] as const) {
        expectNoSecrets(output, who)
      }
    } finally {
      gateway.cleanup()
    }
  }, 30_000)

  it('an sslkey gone while the pets-service runs: what needs a new connection gets 503 with Retry-After, not 500, /readyz says Postgres is down, the error line names the file, and it serves again once the file is back', async () => {
    const keyFile = path.join(directory, 'rotating-client.key')
    copyFileSync(files.key, keyFile)
    const pets = await petsServiceEnv(databaseUrl(`&sslcert=${files.cert}&sslkey=${keyFile}`))
    const petsService = startNode('pets-service/src/main.ts', pets.env)
    await waitForReady(`http://127.0.0.1:${pets.opsPort}/readyz`, petsService, 20_000)
    const list = () => fetch(`http://127.0.0.1:${pets.port}/pets`, { headers: { 'x-internal-token': OPS_TEST_TOKEN } })
    expect((await list()).status).toBe(200)

    rmSync(keyFile)
    // Its connections end (as at a Postgres restart): the next query needs a new one.
    const admin = new pg.Client({ connectionString: postgres.socketUrl })
    await admin.connect()
    try {
      await admin.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pets-service'`)
    } finally {
      await admin.end()
    }
    const refused = await list()
    expect(refused.status).toBe(503)
    expect(((await refused.json()) as { code: string }).code).toBe('service_unavailable')
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    const readyz = await fetch(`http://127.0.0.1:${pets.opsPort}/readyz`)
    expect(readyz.status).toBe(503)
    expect(await readyz.json()).toMatchObject({ dependencies: { postgres: 'down' } })
    // The operator's error line says which file (log lines leave in batches: a moment later). The
    // first request may have gone out on a connection the service had not yet seen terminated (a
    // 503 too, its line naming the termination): each look without the line sends one more, which
    // needs a new connection.
    await eventually(async () => {
      if (petsService.output().includes(`no such file or directory, open '${keyFile}'`)) return true
      expect((await list()).status).toBe(503)
      return false
    }, 5_000)

    copyFileSync(files.key, keyFile)
    await eventually(async () => (await list()).status === 200, 10_000)
    expect(petsService.hasExited()).toBe(false)
  }, 30_000)

  it('an sslkey gone while the gateway runs: it keeps running, keys it holds are served, one it must look up gets 503, and its key-change feed comes back with the file', async () => {
    const keyFile = path.join(directory, 'rotating-gateway.key')
    copyFileSync(files.key, keyFile)
    const url = databaseUrl(`&sslcert=${files.cert}&sslkey=${keyFile}`)
    const pets = await petsServiceEnv(withCertificate())
    const petsService = startNode('pets-service/src/main.ts', pets.env)
    await waitForReady(`http://127.0.0.1:${pets.opsPort}/readyz`, petsService, 20_000)
    const gateway = await startGatewayProcess({ databaseUrl: url, petsUrl: `http://127.0.0.1:${pets.port}`, env: { LOG_LEVEL: 'info' } })
    try {
      const cliEnv = { ...baseEnv(), DATABASE_URL: withCertificate() }
      const keyOf = async (name: string) => {
        const created = await runKeysCli(['create', '--plan', 'free', '--name', name, '--json'], cliEnv)
        expect(created.code, created.stderr).toBe(0)
        return (JSON.parse(created.stdout) as { key: string }).key
      }
      const held = await keyOf('held-before-the-key-file-went')
      const unseen = await keyOf('first-used-after-the-key-file-went')
      // A key's creation reaches the gateway as a key change (read every second), which drops it
      // from the cache: used before that, `held` was dropped after, and looked up in Postgres later.
      await sleep(2_500)
      const status = async (key: string) => (await fetch(`${gateway.url}/v1/pets`, { headers: { authorization: `Bearer ${key}` } })).status
      expect(await status(held)).toBe(200)

      rmSync(keyFile)
      // Every connection ends (as at a Postgres restart), the LISTEN of the gateway's key-change feed among them.
      const admin = new pg.Client({ connectionString: postgres.socketUrl })
      await admin.connect()
      try {
        await admin.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`)
      } finally {
        await admin.end()
      }
      // The feed tries to listen again 5 s after it lost its connection.
      await sleep(6_500)
      expect(gateway.proc.hasExited(), gateway.proc.output().slice(-3_000)).toBe(false)
      expect(await status(held)).toBe(200)
      expect(await status(unseen)).toBe(503)

      copyFileSync(files.key, keyFile)
      await eventually(async () => (await status(unseen)) === 200, 10_000)
      // Log lines leave in batches: the feed's line comes a moment after it listens again.
      await eventually(async () => gateway.proc.output().includes('API key change notifications restored'), 15_000)
      expect(gateway.proc.hasExited()).toBe(false)
    } finally {
      gateway.cleanup()
    }
  }, 60_000)

  /** A service started on `url`: its exit within 15 s, and what it wrote. */
  async function exitOf(script: string, url: string): Promise<{ code: number | null; output: string }> {
    let proc: NodeProcess
    if (script === 'gateway/src/main.ts') {
      const port = await freePort()
      proc = startNode(script, {
        ...baseEnv(),
        DATABASE_URL: url,
        INTERNAL_TOKEN: OPS_TEST_TOKEN,
        PETS_URL: 'http://127.0.0.1:9',
        REDIS_URL: '',
        GATEWAY_HOST: '127.0.0.1',
        GATEWAY_PORT: String(port),
        GATEWAY_OPS_HOST: '127.0.0.1',
        GATEWAY_OPS_PORT: String(await freePort()),
      })
    } else {
      proc = startNode(script, (await petsServiceEnv(url)).env)
    }
    const { code } = await exitWithin(proc, 15_000)
    return { code, output: proc.output() }
  }

  /** Each of the three refuses `url` with exit 1 within 15 s, saying it once with every one of `words`, no stack trace, no secret. */
  async function expectEachRefuses(url: string, words: string[]) {
    const [gateway, petsService, cli] = await Promise.all([
      exitOf('gateway/src/main.ts', url),
      exitOf('pets-service/src/main.ts', url),
      runKeysCli(['list'], { ...baseEnv(), DATABASE_URL: url }, 15_000),
    ])
    for (const [who, code, output] of [
      ['gateway', gateway.code, gateway.output],
      ['pets-service', petsService.code, petsService.output],
      ['keys list', cli.code, cli.stdout + cli.stderr],
    ] as const) {
      expect(code, `${who}:\n${output}`).toBe(1)
      for (const word of words) expect(output, who).toContain(word)
      // Said once, not once per retry: a service's log line, and the plain line a terminal gets beside it.
      const saying = output.split('\n').filter((line) => line.includes(words[0]!))
      expect(saying.filter((line) => line.startsWith('{')).length, output).toBeLessThanOrEqual(1)
      expect(saying.filter((line) => !line.startsWith('{')), output).toHaveLength(1)
      expect(output, who).not.toMatch(/\n\s+at \S/)
      expect(output, who).not.toContain('"stack"')
      expectNoSecrets(output, who)
    }
    return { gateway, petsService, cli }
  }

  it('without sslcert and sslkey each exits 1 within 15 s, saying once that Postgres wants a client certificate and what to give DATABASE_URL', async () => {
    const { gateway, petsService, cli } = await expectEachRefuses(databaseUrl(''), [
      '28000: connection requires a valid client certificate',
      'give DATABASE_URL the client certificate and key Postgres asks for (sslcert=/path/client.crt&sslkey=/path/client.key',
    ])
    expect(gateway.output).toContain('gateway cannot start: cannot use Postgres at DATABASE_URL: 28000')
    expect(petsService.output).toContain('pets-service cannot start: cannot use Postgres at DATABASE_URL: 28000')
    // The CLI says which DATABASE_URL it used, password hidden, and writes one line.
    expect(cli.stdout).toBe('')
    expect(cli.stderr.trim().split('\n')).toHaveLength(1)
    expect(cli.stderr).toContain(`DATABASE_URL (postgres://postgres:***@127.0.0.1:${postgres.port}/postgres?sslmode=verify-full`)
  }, 30_000)

  it('with an sslkey that cannot be read each exits 1 within 15 s, saying once, naming DATABASE_URL\'s sslkey, not with a stack trace', async () => {
    const missing = path.join(directory, 'no-such-client.key')
    const url = databaseUrl(`&sslcert=${files.cert}&sslkey=${missing}`)
    const gone = `DATABASE_URL's sslkey cannot be read: ${missing} (ENOENT)`
    const { cli } = await expectEachRefuses(url, [gone])
    expect(cli.stderr).toBe(`error: ${gone}; pg reads it at every new connection\n`)
  }, 30_000)
})
