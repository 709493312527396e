import { readFileSync } from 'node:fs'
import { describe, expect, it } from 'vitest'
import { printableUrl } from '../../common/src/database/printableUrl.ts'
import { COMPOSE_DEFAULT_INTERNAL_TOKEN, EnvError, databaseUrlFromEnv, httpUrlProblem, internalTokenFromEnv, maxConnectionsFromEnv, ordersTokenFromEnv, poolSizeFromEnv, upstreamUrlProblem, warnOfPublishedToken, listenHostFromEnv, portFromEnv } from '../../common/src/env.ts'
import { checkLogLevel } from '../../common/src/logger.ts'
import { loadPetsConfig } from '../../pets-service/src/config.ts'

describe('environment the services read at boot', () => {
  it('refuses to start either service on a missing or short INTERNAL_TOKEN, naming it', () => {
    expect(() => internalTokenFromEnv({})).toThrow('INTERNAL_TOKEN must be set')
    expect(() => internalTokenFromEnv({ INTERNAL_TOKEN: '123456789012345' })).toThrow('INTERNAL_TOKEN must be at least 16 characters')
    expect(internalTokenFromEnv({ INTERNAL_TOKEN: '1234567890123456' })).toBe('1234567890123456')
  })

  it('refuses an INTERNAL_TOKEN that would not arrive as sent (a space HTTP trims, a character beyond latin-1), naming it', () => {
    const problem = 'must be visible ASCII characters only (no spaces, no accents): it is sent as a header value'
    expect(() => internalTokenFromEnv({ INTERNAL_TOKEN: '0123456789abcdef-secret ' })).toThrow(`INTERNAL_TOKEN ${problem}`)
    expect(() => internalTokenFromEnv({ INTERNAL_TOKEN: '0123456789abcdef-€uro' })).toThrow(`INTERNAL_TOKEN ${problem}`)
    expect(internalTokenFromEnv({ INTERNAL_TOKEN: 'aZ09-._~!$&()*+,;=:@/?[]{}|' })).toBe('aZ09-._~!$&()*+,;=:@/?[]{}|')
  })

  it("refuses an orders upstream without a credential of its own: ORDERS_INTERNAL_TOKEN set, long enough, not the pets-service's", () => {
    const pets = { INTERNAL_TOKEN: 'pets-token-0123456789', INTERNAL_TOKEN_PREVIOUS: 'old-pets-token-0123456789' }
    expect(() => ordersTokenFromEnv(pets)).toThrow('ORDERS_INTERNAL_TOKEN must be set when config/gateway.yaml names upstreams.orders')
    expect(() => ordersTokenFromEnv({ ...pets, ORDERS_INTERNAL_TOKEN: 'short' })).toThrow('ORDERS_INTERNAL_TOKEN must be at least 16 characters')
    expect(() => ordersTokenFromEnv({ ...pets, ORDERS_INTERNAL_TOKEN: pets.INTERNAL_TOKEN })).toThrow('ORDERS_INTERNAL_TOKEN must differ from INTERNAL_TOKEN')
    expect(() => ordersTokenFromEnv({ ...pets, ORDERS_INTERNAL_TOKEN: pets.INTERNAL_TOKEN_PREVIOUS })).toThrow('must differ')
    expect(ordersTokenFromEnv({ ...pets, ORDERS_INTERNAL_TOKEN: 'orders-token-0123456789' })).toBe('orders-token-0123456789')
  })

  it("warns when INTERNAL_TOKEN is docker-compose.yml's published default, and only then", () => {
    const warnings: string[] = []
    const logger = { warn: (message: string) => warnings.push(message) } as unknown as Parameters<typeof warnOfPublishedToken>[1]
    warnOfPublishedToken('a-token-of-our-own-0123', logger)
    expect(warnings).toEqual([])
    warnOfPublishedToken(COMPOSE_DEFAULT_INTERNAL_TOKEN, logger)
    expect(warnings).toEqual([expect.stringContaining('published default')])
    expect(readFileSync('docker-compose.yml', 'utf8')).toContain(`INTERNAL_TOKEN:-${COMPOSE_DEFAULT_INTERNAL_TOKEN}}`)
  })

  it('reads a port, falls back when it is unset, and refuses one that is not a port', () => {
    expect(portFromEnv('P', 8080, { P: '9000' })).toBe(9000)
    expect(portFromEnv('P', 8080, {})).toBe(8080)
    expect(portFromEnv('P', 8080, { P: '0' })).toBe(0)
    for (const raw of ['70000', '-1', '80.5', '1e3', ' 80', '0x50', 'http']) {
      expect(() => portFromEnv('P', 8080, { P: raw }), raw).toThrow(`P must be a port number between 0 and 65535, got "${raw}"`)
    }
  })

  it('refuses 0 for a port that cannot be any free one, with the same range and the reason in one message', () => {
    const socketName = { why: 'it names a socket file' }
    expect(portFromEnv('P', 54329, { P: '5433' }, socketName)).toBe(5433)
    for (const raw of ['0', '70000']) {
      expect(() => portFromEnv('P', 54329, { P: raw }, socketName), raw).toThrow(
        `P must be a port number between 1 and 65535 (it names a socket file), got "${raw}"`,
      )
    }
  })

  it('takes DATABASE_POOL_SIZE as a whole number of connections from 1 to 1000, 10 when unset, and refuses anything else by name', () => {
    expect(poolSizeFromEnv({})).toBe(10)
    expect(poolSizeFromEnv({ DATABASE_POOL_SIZE: '' })).toBe(10)
    expect(poolSizeFromEnv({ DATABASE_POOL_SIZE: '4' })).toBe(4)
    expect(poolSizeFromEnv({ DATABASE_POOL_SIZE: '1000' })).toBe(1000)
    for (const raw of ['0', '1001', '2.5', '-3', '1e2', ' 4', 'ten']) {
      expect(() => poolSizeFromEnv({ DATABASE_POOL_SIZE: raw }), raw).toThrow(`DATABASE_POOL_SIZE must be a whole number of connections from 1 to 1000, got "${raw}"`)
    }
    expect(loadPetsConfig({ DATABASE_URL: 'postgres://db/pets', INTERNAL_TOKEN: '1234567890123456', DATABASE_POOL_SIZE: '25' }).poolSize).toBe(25)
  })

  // Both on one address, the second listener failed at start with EADDRINUSE and a stack trace
  // naming no variable.
  it('refuses PETS_OPS_PORT equal to PETS_PORT on one address, naming both variables', () => {
    const pets = { DATABASE_URL: 'postgres://db/pets', INTERNAL_TOKEN: '1234567890123456' }
    expect(() => loadPetsConfig({ ...pets, PETS_PORT: '3001', PETS_OPS_PORT: '3001' })).toThrow(
      'PETS_OPS_PORT must differ from PETS_PORT (both 3001): the ops and public listeners would take one address',
    )
    expect(() => loadPetsConfig({ ...pets, PETS_OPS_PORT: '3001', PETS_OPS_HOST: '0.0.0.0' })).toThrow(/^PETS_OPS_PORT must differ from PETS_PORT/)
    // Another address, or any free port for both: two listeners.
    expect(loadPetsConfig({ ...pets, PETS_OPS_PORT: '3001', PETS_OPS_HOST: '127.0.0.2' }).opsPort).toBe(3001)
    expect(loadPetsConfig({ ...pets, PETS_PORT: '0', PETS_OPS_PORT: '0' }).opsPort).toBe(0)
  })

  it('takes PETS_MAX_CONNECTIONS as a whole number from 1 to 1000000, derived at start when unset, and refuses anything else by name', () => {
    const pets = { DATABASE_URL: 'postgres://db/pets', INTERNAL_TOKEN: '1234567890123456' }
    expect(loadPetsConfig(pets).maxConnections).toBeUndefined()
    expect(loadPetsConfig({ ...pets, PETS_MAX_CONNECTIONS: '' }).maxConnections).toBeUndefined()
    expect(loadPetsConfig({ ...pets, PETS_MAX_CONNECTIONS: '2000' }).maxConnections).toBe(2000)
    expect(maxConnectionsFromEnv('PETS_MAX_CONNECTIONS', undefined, { PETS_MAX_CONNECTIONS: '1000000' })).toBe(1_000_000)
    for (const raw of ['0', '1000001', '2.5', '-3', '1e3', ' 4', 'many']) {
      expect(() => loadPetsConfig({ ...pets, PETS_MAX_CONNECTIONS: raw }), raw).toThrow(
        `PETS_MAX_CONNECTIONS must be a whole number of connections from 1 to 1000000, got "${raw}"`,
      )
    }
  })

  it('listens on an IP address or a host name, and refuses a host with a port or IPv6 in brackets by name instead of failing later with ENOTFOUND', () => {
    for (const host of ['0.0.0.0', '::', '::1', 'localhost', 'pets-service', 'pets_service', 'gateway.internal.example.com']) {
      expect(listenHostFromEnv('H', '127.0.0.1', { H: host }), host).toBe(host)
    }
    expect(listenHostFromEnv('H', '127.0.0.1', {})).toBe('127.0.0.1')
    expect(() => listenHostFromEnv('H', '127.0.0.1', { H: '0.0.0.0:8080' })).toThrow(
      'H must be an IP address or a host name; a port goes in its own setting (got "0.0.0.0:8080")',
    )
    expect(() => listenHostFromEnv('H', '127.0.0.1', { H: '[::]' })).toThrow(
      'H must be an IP address or a host name; an IPv6 address takes no brackets here (got "[::]")',
    )
    expect(() => listenHostFromEnv('H', '127.0.0.1', { H: 'http://host' })).toThrow(/^H must be an IP address or a host name/)
    const pets = { DATABASE_URL: 'postgres://db/pets', INTERNAL_TOKEN: '1234567890123456' }
    expect(() => loadPetsConfig({ ...pets, PETS_HOST: '0.0.0.0:3001' })).toThrow(/^PETS_HOST must be an IP address or a host name/)
    expect(() => loadPetsConfig({ ...pets, PETS_OPS_HOST: '[::1]' })).toThrow(/^PETS_OPS_HOST must be an IP address or a host name/)
  })

  it('takes DATABASE_URL as a postgres:// URL and refuses anything else at once, instead of waiting for a host named "base"', () => {
    const accepted = [
      'postgres://app@db:5432/pets',
      'postgresql://app:s3cret@10.0.0.5/pets?sslmode=require',
      'socket:/var/run/postgresql?db=pets',
      // Forms pg takes that WHATWG URL parsing refuses: credentials without a host, a socket directory.
      'postgres://app:s3cret@/pets?host=/cloudsql/project:region:instance',
      '/var/run/postgresql pets',
    ]
    for (const url of accepted) {
      expect(databaseUrlFromEnv({ DATABASE_URL: url }), url).toBe(url)
    }
    expect(() => databaseUrlFromEnv({})).toThrow('DATABASE_URL must be set')
    for (const wrong of ['nonsense', 'db:5432/pets', 'mysql://db/pets']) {
      expect(() => databaseUrlFromEnv({ DATABASE_URL: wrong }), wrong).toThrow(/^DATABASE_URL must be a postgres:\/\/ URL/)
    }
  })

  // Parsed, the password's rest was the host (`ss`) and the path: part of it was printed in the
  // errors and looked up in DNS. A parameter's value may hold an '@'.
  it("refuses a DATABASE_URL whose password holds an unencoded '/', '?' or '#' before an '@', without printing it", () => {
    for (const url of ['postgres://u:p@ss/w@rd@127.0.0.1:5432/x', 'postgres://u:p#w@rd@127.0.0.1/x', 'postgres://u:p?w@rd@127.0.0.1/x', 'postgres://app:Xy@9/b=Q@127.0.0.1:5432/db', 'postgres://app@127.0.0.1/a@b']) {
      let refused: unknown
      try {
        databaseUrlFromEnv({ DATABASE_URL: url })
      } catch (error) {
        refused = error
      }
      expect(refused, url).toBeInstanceOf(EnvError)
      expect((refused as Error).message).toMatch(/^DATABASE_URL holds an '@' after its host: percent-encode/)
      expect((refused as Error).message).not.toMatch(/u:p|w@rd|127\.0\.0\.1/)
      expect(printableUrl(url)).toMatch(/^\((an unparsable URL|a URL with an '@' after its host: not printed)\)$/)
    }
    expect(databaseUrlFromEnv({ DATABASE_URL: 'postgres://u:p%40ss%2Fw%40rd@127.0.0.1/x?application_name=a@b' })).toContain('a@b')
    expect(printableUrl('postgres://u:p@ss/w@rd@127.0.0.1:5432/x')).toBe("(a URL with an '@' after its host: not printed)")
    expect(printableUrl('postgres://u:p%40ss@127.0.0.1/x#part')).toBe('postgres://u:***@127.0.0.1/x')
    // A password's rest read as a parameter pg has no use for: its value is not printed.
    expect(printableUrl('postgres://u:p@ss?w=rd@db/x')).toBe('postgres://u:***@ss?w=***')
    expect(printableUrl('postgres://app@db/pets?sslmode=require&application_name=me@host')).toBe('postgres://app@db/pets?sslmode=require&application_name=me@host')
  })

  // pg reads these files as it makes each client and throws there: both services stopped with a
  // stack trace (from the code wording Postgres's refusals), and the keys CLI said it could not
  // prepare the gateway schema.
  it('refuses a DATABASE_URL whose sslrootcert, sslcert or sslkey cannot be read, naming the parameter and path', () => {
    const base = 'postgres://app@db/pets?sslmode=verify-full'
    for (const name of ['sslrootcert', 'sslcert', 'sslkey']) {
      expect(() => databaseUrlFromEnv({ DATABASE_URL: `${base}&${name}=/nonexistent/${name}.pem` }), name).toThrow(
        `DATABASE_URL's ${name} cannot be read: /nonexistent/${name}.pem (ENOENT); pg reads it at every new connection`,
      )
    }
    expect(() => databaseUrlFromEnv({ DATABASE_URL: `${base}&sslkey=%2Fnonexistent%2Fk.pem` })).toThrow("sslkey cannot be read: /nonexistent/k.pem (ENOENT)")
    expect(() => databaseUrlFromEnv({ DATABASE_URL: `${base}&sslcert=/tmp` })).toThrow("sslcert cannot be read: /tmp (EISDIR)")
    const readable = `${base}&sslrootcert=package.json&sslcert=package.json&sslkey=package.json`
    expect(databaseUrlFromEnv({ DATABASE_URL: readable })).toBe(readable)
  })

  it('takes LOG_LEVEL as one of pino\'s levels, unset or empty as info, and refuses any other by name', () => {
    for (const level of ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent', '']) expect(() => checkLogLevel({ LOG_LEVEL: level })).not.toThrow()
    expect(() => checkLogLevel({})).not.toThrow()
    expect(() => checkLogLevel({ LOG_LEVEL: 'loud' })).toThrow('LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent (got "loud")')
  })

  it('takes an http or https URL the WHATWG parser accepts, and says what to look at otherwise', () => {
    for (const url of ['http://127.0.0.1:3001', 'https://pets.internal', 'http://[::1]:3001/base']) expect(httpUrlProblem(url), url).toBeUndefined()
    expect(httpUrlProblem('http://127.0.0.1:99999')).toBe('must be a valid http:// or https:// URL (is the port 1-65535? is every [ closed?)')
    expect(httpUrlProblem('http://[::1:3001')).toBe('must be a valid http:// or https:// URL (is the port 1-65535? is every [ closed?)')
    expect(httpUrlProblem('ftp://127.0.0.1/')).toBe('must be an http:// or https:// URL')
  })

  it("takes an upstream's URL as an origin only: a path, query or user:password it would not send is refused", () => {
    for (const url of ['http://127.0.0.1:3001', 'http://127.0.0.1:3001/', 'https://pets.internal', 'http://[::1]:3001']) expect(upstreamUrlProblem(url), url).toBeUndefined()
    const problem = 'must be an http:// or https:// origin only (scheme, host, port): the gateway sends no path, query or user:password of it'
    for (const url of ['http://127.0.0.1:3001/base', 'http://127.0.0.1:3001/?a=1', 'http://127.0.0.1:3001?', 'http://127.0.0.1:3001/#x', 'http://gw:pw@pets:3001', 'http://gw@pets:3001']) {
      expect(upstreamUrlProblem(url), url).toBe(problem)
    }
    expect(upstreamUrlProblem('ftp://127.0.0.1/')).toBe('must be an http:// or https:// URL')
  })
})
