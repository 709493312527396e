import pg from 'pg'
import type { Logger } from 'pino'
import { EnvError, withoutSslFiles } from '../env.ts'
import { DependencyDown } from '../ops/dependencyDown.ts'
import { reportPostgresOutages } from './outageLog.ts'
import { dropConnection, endWithin, refusesConnectionsForNow } from './pool.ts'

/**
 * The SQLSTATEs with which Postgres refuses this service's role, its login or the objects it was
 * given: a privilege taken away (42501), a login refused (28000: role dropped, NOLOGIN, pg_hba.conf;
 * 28P01: password changed), the database (3D000), the schema (3F000) or a table (42P01) dropped or
 * renamed. Each lasts until an operator mends it, whatever the client sends, so a request meeting
 * one is answered 503, not 500. A missing object could be a defect (a statement naming a table no
 * migration made), but every statement runs in the tests and the start-up check finds each table
 * the service uses; at run time it was dropped or renamed under the service.
 */
const REFUSAL_SQLSTATES = new Set(['42501', '28000', '28P01', '3D000', '3F000', '42P01'])

/** Postgres's code and first line when it refuses the role (see REFUSAL_SQLSTATES); undefined for anything else. */
export function postgresRefusal(error: unknown): string | undefined {
  if (error instanceof AggregateError) return error.errors.map(postgresRefusal).find((words) => words !== undefined)
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown }
  if (typeof code !== 'string' || !REFUSAL_SQLSTATES.has(code)) return undefined
  return `${code}: ${String(message).split('\n')[0]!.slice(0, 200)}`
}

/** Privileges on one object the service uses: its database, its schema, or a table in that schema. */
export interface Grant {
  on: 'database' | 'schema' | 'table'
  /** The table's name in the schema; none for the database and the schema. */
  table?: string
  privileges: string[]
}

/** What a service's role must be granted, for the checks and for the log and exit lines naming the fix. */
export interface PostgresNeeds {
  /** Who needs them: "gateway", "pets-service", "keys CLI". */
  who: string
  schema: string
  /** What requests need: /readyz checks these. */
  serving: Grant[]
  /** What else the start-up needs (migrations, purges, the CLI's writes): checked at start with the others. */
  besides: Grant[]
  /**
   * What only some migration needs while it is still to apply (a trigger made on a table takes
   * TRIGGER on it): not asked of a start with nothing to migrate, named when a migration is refused.
   */
  migrating?: Grant[]
}

interface Missing {
  on: Grant['on']
  table: string | null
  privilege: string
  exists: boolean
}

interface CheckResult {
  role: string
  database: string
  missing: Missing[]
}

/** One query: which of the privileges the role lacks, and which objects do not exist. */
async function check(client: pg.Pool | pg.Client, schema: string, grants: Grant[]): Promise<CheckResult> {
  const rows = grants.flatMap((grant) => grant.privileges.map((privilege) => [grant.on, grant.table ?? '', privilege]))
  const { rows: [result] } = await client.query<CheckResult>(
    `WITH need(kind, name, privilege, ord) AS (SELECT * FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY)
     SELECT current_user AS role, current_database() AS database, COALESCE((
       SELECT json_agg(json_build_object('on', need.kind, 'table', NULLIF(need.name, ''), 'privilege', need.privilege,
                'exists', CASE need.kind WHEN 'database' THEN true WHEN 'schema' THEN n.oid IS NOT NULL ELSE c.oid IS NOT NULL END) ORDER BY need.ord)
         FROM need
         LEFT JOIN pg_namespace n ON n.nspname = $1
         LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = need.name AND need.kind = 'table'
        WHERE NOT COALESCE(CASE need.kind
                WHEN 'database' THEN has_database_privilege(current_database(), need.privilege)
                WHEN 'schema' THEN has_schema_privilege(n.oid, need.privilege)
                ELSE has_table_privilege(c.oid, need.privilege) END, false)), '[]') AS missing`,
    [schema, rows.map((row) => row[0]), rows.map((row) => row[1]), rows.map((row) => row[2])],
  )
  return result!
}

const quoted = (name: string) => `"${name.replaceAll('"', '""')}"`

/** The statements that give the role what it lacks, and what does not exist. */
function grantsFor(schema: string, result: CheckResult): string {
  const role = quoted(result.role)
  const byObject = new Map<string, string[]>()
  const gone = new Set<string>()
  for (const { on, table, privilege, exists } of result.missing) {
    const object = on === 'database' ? `DATABASE ${quoted(result.database)}` : on === 'schema' ? `SCHEMA ${schema}` : `TABLE ${schema}.${table}`
    if (exists) byObject.set(object, [...(byObject.get(object) ?? []), privilege])
    else gone.add(on === 'schema' ? `schema ${schema}` : `table ${schema}.${table}`)
  }
  const statements = [...byObject].map(([object, privileges]) => `GRANT ${privileges.join(', ')} ON ${object} TO ${role}`)
  const missing = [...gone].map((object) => `${object} does not exist (dropped or renamed since the migrations ran): restore it`)
  return [...statements, ...missing].join('; ')
}

/** A login and one catalog query on a connection of its own, at most. */
const EXPLAIN_BOUND_MILLIS = 10_000

/** The role and database a new connection of the pool logs in as and to. */
function loginOf(pool: pg.Pool): { role: string; database: string } {
  let client: pg.Client & { user?: string; database?: string }
  try {
    client = new pg.Client(pool.options)
  } catch {
    // pg reads DATABASE_URL's sslrootcert, sslcert and sslkey as it makes a client: one gone
    // since the start (a rotation half done) threw here, out of the error line, as a stack trace.
    // The role and database are read from the URL without them (its files play no part in either).
    try {
      client = new pg.Client({ ...pool.options, connectionString: withoutSslFiles(pool.options.connectionString) })
    } catch {
      return { role: pool.options.user ?? '', database: pool.options.database ?? '' }
    }
  }
  return { role: client.user ?? '', database: client.database ?? '' }
}

/**
 * A login refused for its TLS or client certificate (28000, as pg_hba.conf's `hostssl … cert`
 * refuses it): the fix is in DATABASE_URL's ssl parameters, not in the role.
 */
function certificateLoginFix(message: string, role: string): string | undefined {
  if (message.includes('requires a valid client certificate')) {
    return `give DATABASE_URL the client certificate and key Postgres asks for (sslcert=/path/client.crt&sslkey=/path/client.key: signed by a CA in the server's ssl_ca_file, its CN the role's name, ${quoted(role)}), or allow the role another method in pg_hba.conf`
  }
  if (message.includes('certificate authentication failed')) {
    return `give DATABASE_URL (sslcert, sslkey) a client certificate whose CN is the role's name, ${quoted(role)}, or map its CN to the role in pg_ident.conf`
  }
  if (/^no pg_hba\.conf entry .*no encryption/.test(message)) {
    return `connect over TLS (sslmode=verify-full&sslrootcert=/path/ca.crt in DATABASE_URL) if pg_hba.conf takes the role on hostssl lines only, or allow it in pg_hba.conf`
  }
  return undefined
}

/**
 * What to do about a refusal no query can look into, one at login: said from its code, naming the
 * role and database this process logs in as.
 */
export function loginRefusalFix(error: unknown, pool: pg.Pool): string | undefined {
  const code = (error as { code?: unknown } | null)?.code
  const { role, database } = loginOf(pool)
  switch (code) {
    case '42501':
      return `GRANT CONNECT ON DATABASE ${quoted(database)} TO ${quoted(role)}`
    case '28000':
      return certificateLoginFix(String((error as { message?: unknown }).message ?? ''), role) ?? `let the role log in (ALTER ROLE ${quoted(role)} LOGIN, or create it again if it was dropped), or allow it in pg_hba.conf, or set DATABASE_URL's user to one that may`
    case '28P01':
      return `set DATABASE_URL's password (or PGPASSWORD) to the role ${quoted(role)}'s current password`
    case '3D000':
      return `restore or rename the database ${quoted(database)}, or point DATABASE_URL at the one the service uses`
    default:
      return undefined
  }
}

/**
 * Why Postgres refuses, and the fix: the GRANT statements for what the role lacks, found on a
 * connection of its own (the pool's may predate the change: a session keeps its login after
 * CONNECT is revoked or the password changed); Postgres's words and what its code asks for when
 * that connection is itself refused; Postgres's words alone when nothing the service needs is
 * missing any more (granted back meanwhile, or a privilege the list does not cover).
 */
async function explain(pool: pg.Pool, needs: PostgresNeeds, grants: Grant[], words?: string): Promise<{ refused: boolean; words: string; fix: string }> {
  const client = new pg.Client(pool.options)
  client.on('error', () => undefined)
  // Outside the pool, so outside its statement bound: a server that stops answering after the
  // login (a PgBouncer holding the query while its Postgres is down, a host that hangs) held this
  // connection, the /readyz check and the episode's error line for as long.
  const bound = setTimeout(() => dropConnection(client), EXPLAIN_BOUND_MILLIS)
  try {
    await client.connect()
    const result = await check(client, needs.schema, grants)
    if (result.missing.length > 0) return { refused: true, words: words ?? 'privileges missing', fix: grantsFor(needs.schema, result) }
    return { refused: false, words: words ?? '', fix: 'grant the role what Postgres names' }
  } catch (error) {
    const refusal = postgresRefusal(error)
    if (refusal === undefined) throw error
    return { refused: true, words: refusal, fix: loginRefusalFix(error, pool) ?? 'grant the role what Postgres names' }
  } finally {
    clearTimeout(bound)
    // A Postgres that stopped answering after the check never confirms the end: the episode's
    // error line and /readyz's answer waited for it, for good.
    await endWithin(client)
  }
}

/**
 * Start-up: stops the service (EnvError, exit 1, one line) when its role lacks a privilege it
 * needs, naming the GRANT statements. Run before the migrations, for what they need (objects not
 * made yet are theirs to make), and after them, for everything; a migration refused anyway is
 * explained the same way.
 */
export async function requirePostgresGrants(pool: pg.Pool, needs: PostgresNeeds, migrate: () => Promise<unknown>): Promise<void> {
  const grants = [...needs.serving, ...needs.besides]
  const refuse = (fix: string, words?: string) =>
    new EnvError(`cannot use Postgres at DATABASE_URL: it refuses the ${needs.who}'s role what it needs${words ? ` (${words})` : ''}; ${fix}`)
  const before = await check(pool, needs.schema, grants)
  before.missing = before.missing.filter((missing) => missing.exists)
  if (before.missing.length > 0) throw refuse(grantsFor(needs.schema, before))
  try {
    await migrate()
  } catch (error) {
    const words = postgresRefusal(error) ?? postgresRefusal((error as { cause?: unknown }).cause)
    if (words === undefined) throw error
    const explained = await explain(pool, needs, [...grants, ...(needs.migrating ?? [])], words)
    throw refuse(explained.fix, words)
  }
  const after = await check(pool, needs.schema, grants)
  if (after.missing.length > 0) throw refuse(grantsFor(needs.schema, after))
}

/**
 * For a one-off command (the keys CLI): Postgres's words and the fix, when the error is a refusal
 * (also as a cause: a migration's); undefined otherwise.
 */
export async function describeRefusal(pool: pg.Pool, needs: PostgresNeeds, error: unknown): Promise<string | undefined> {
  const words = postgresRefusal(error) ?? postgresRefusal((error as { cause?: unknown } | null)?.cause)
  if (words === undefined) return undefined
  const { fix } = await explain(pool, needs, [...needs.serving, ...needs.besides, ...(needs.migrating ?? [])], words).catch(() => ({
    fix: 'grant the role what Postgres names',
  }))
  // A database that is not there is no privilege the role lacks, and the operator who mistyped its
  // name in DATABASE_URL was sent looking for one.
  const headline = words.startsWith('3D000:') ? 'Postgres has no such database' : `Postgres refuses the ${needs.who}'s role what it needs`
  return `${headline} (${words}): ${fix}`
}

interface Episode {
  reason: string
  recheck?: NodeJS.Timeout
}

/** While an episode lasts, how often the watch looks, on a new connection, whether the role has what requests need again. */
const EPISODE_RECHECK_MILLIS = 10_000

export interface PostgresRefusalWatch {
  /**
   * Called with the error behind a request's 5xx: true when it is a Postgres refusal, which this
   * watch says once per episode, or Postgres unavailable, said at most once a minute with a count
   * (reportPostgresOutages): the request needs no error line of its own.
   */
  report(error: unknown): boolean
  /** For /readyz: rejects, with a reason, while Postgres refuses the role what requests need. */
  probe(): Promise<void>
}

/**
 * A privilege taken from the service's role while it runs (REVOKE, NOLOGIN, a password changed, an
 * object dropped): requests that meet it are answered 503, one error line per episode names what
 * Postgres refused and the GRANT that mends it, /readyz says not ready until the role has again
 * what requests need, and then one line says so (looked at every EPISODE_RECHECK_MILLIS, and by
 * each /readyz). While nothing is refused, /readyz checks the
 * privileges on a pooled connection (one catalog query, as cheap as the SELECT 1 it replaces);
 * during an episode on a new connection, which a revoked CONNECT or a changed password refuses
 * where the pool's older sessions would still pass.
 */
export function watchPostgresRefusals(pool: pg.Pool, needs: PostgresNeeds, logger: Logger): PostgresRefusalWatch {
  let episode: Episode | undefined
  const outages = reportPostgresOutages(logger, needs.who)
  const end = (ended: Episode) => {
    if (episode !== ended) return
    clearTimeout(ended.recheck)
    episode = undefined
    logger.info(`Postgres grants the ${needs.who}'s role what requests need again`)
  }
  // Not only /readyz ends an episode: with no one polling it (npm start, systemd, a load balancer
  // checking the port only) the episode outlived the grant, and a later revoke had no line at all.
  const recheckLater = (current: Episode) => {
    current.recheck = setTimeout(() => {
      const again = () => episode === current && recheckLater(current)
      explain(pool, needs, needs.serving, current.reason).then((explained) => (explained.refused ? again() : end(current)), again)
    }, EPISODE_RECHECK_MILLIS).unref()
  }
  const begin = (words: string | undefined, explained?: { words: string; fix: string }) => {
    if (episode) return
    const reason = explained?.words ?? words ?? 'privileges missing'
    episode = { reason }
    recheckLater(episode)
    const said = explained ? Promise.resolve(explained) : explain(pool, needs, needs.serving, words).catch(() => ({ words: words ?? '', fix: 'grant the role what Postgres names' }))
    void said.then(({ words: refused, fix }) =>
      logger.error(
        { problem: refused },
        `Postgres refuses the ${needs.who}'s role what requests need (${refused}): ${fix}; requests are answered 503 and /readyz says not ready until then`,
      ),
    )
  }
  return {
    report(error) {
      const words = postgresRefusal(error)
      if (words === undefined) return outages(error)
      begin(words)
      return true
    },
    async probe() {
      if (episode) {
        const current = episode
        const explained = await explain(pool, needs, needs.serving, current.reason)
        if (explained.refused) throw new DependencyDown(`Postgres refuses the role (${explained.words}): ${explained.fix}`)
        end(current)
        return
      }
      let result: CheckResult
      try {
        result = await check(pool, needs.schema, needs.serving)
      } catch (error) {
        const words = postgresRefusal(error)
        if (words === undefined) throw unansweredPostgres(error)
        begin(words)
        throw new DependencyDown(`Postgres refuses the role (${words}): ${loginRefusalFix(error, pool) ?? 'grant the role what Postgres names'}`)
      }
      if (result.missing.length === 0) return
      const fix = grantsFor(needs.schema, result)
      begin(undefined, { words: 'privileges missing', fix })
      throw new DependencyDown(`Postgres refuses the role (privileges missing): ${fix}`)
    },
  }
}

/** The /readyz check of a service still starting: Postgres answers at all, or why not (unansweredPostgres). */
export async function postgresAnswers(pool: pg.Pool): Promise<void> {
  try {
    await pool.query('SELECT 1')
  } catch (error) {
    throw unansweredPostgres(error)
  }
}

/**
 * A Postgres that gave no answer, for /readyz: the reason is the system's code (ECONNREFUSED,
 * ENOTFOUND, …) or what pg says happened, never the driver's message, which names addresses.
 */
function unansweredPostgres(error: unknown): DependencyDown {
  if (refusesConnectionsForNow(error)) return new DependencyDown('Postgres takes no connections to the database for now (SQLSTATE 55000: ALLOW_CONNECTIONS false)')
  return new DependencyDown(`no answer from Postgres (${unanswered(error)})`)
}

function unanswered(error: unknown): string {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown }
  if (typeof code === 'string' && /^E[A-Z]+$/.test(code)) return code
  if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return `SQLSTATE ${code}`
  const text = typeof message === 'string' ? message : ''
  if (/timeout/i.test(text)) return 'timed out'
  if (/terminated|closed|ended/i.test(text)) return 'connection lost'
  return 'unreachable'
}
