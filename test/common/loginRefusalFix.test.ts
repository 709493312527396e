import pg from 'pg'
import { afterAll, describe, expect, it } from 'vitest'
import { loginRefusalFix } from '../../common/src/database/privileges.ts'

const refusal = (message: string) => Object.assign(new Error(message), { code: '28000' })

describe('the fix a refused login is said with', () => {
  const pool = new pg.Pool({ connectionString: 'postgres://app@127.0.0.1:5432/pets?sslmode=verify-full' })
  afterAll(() => pool.end())

  // pg_hba.conf's `hostssl … cert`: Postgres's words when no certificate, or one for another role,
  // came with the login. The fix is DATABASE_URL's sslcert and sslkey; ALTER ROLE … LOGIN was said.
  it('a login without the client certificate Postgres asks for: give DATABASE_URL sslcert and sslkey, not ALTER ROLE', () => {
    const fix = loginRefusalFix(refusal('connection requires a valid client certificate'), pool)
    expect(fix).toContain('sslcert=/path/client.crt&sslkey=/path/client.key')
    expect(fix).toContain('its CN the role\'s name, "app"')
    expect(fix).not.toContain('ALTER ROLE')
  })

  it('a client certificate for another name: its CN must be the role\'s', () => {
    const fix = loginRefusalFix(refusal('certificate authentication failed for user "app"'), pool)
    expect(fix).toContain('a client certificate whose CN is the role\'s name, "app"')
    expect(fix).not.toContain('ALTER ROLE')
  })

  it('a connection without TLS where pg_hba.conf has no line for one: says TLS, and pg_hba.conf', () => {
    const fix = loginRefusalFix(refusal('no pg_hba.conf entry for host "127.0.0.1", user "app", database "pets", no encryption'), pool)
    expect(fix).toContain('sslmode=verify-full&sslrootcert=/path/ca.crt')
    expect(fix).toContain('pg_hba.conf')
  })

  it('other 28000 refusals keep the role fix', () => {
    expect(loginRefusalFix(refusal('role "app" is not permitted to log in'), pool)).toContain('ALTER ROLE "app" LOGIN')
  })

  // pg reads sslkey as it makes a client: a file gone since the start threw out of this function.
  it('does not throw when DATABASE_URL names an sslkey that cannot be read any more', () => {
    const gone = new pg.Pool({ connectionString: 'postgres://app@127.0.0.1:5432/pets?sslmode=verify-full&sslkey=/nonexistent/client.key' })
    expect(() => loginRefusalFix(refusal('role "app" is not permitted to log in'), gone)).not.toThrow()
    // … and still names the role and database DATABASE_URL gives, not "".
    expect(loginRefusalFix(refusal('role "app" is not permitted to log in'), gone)).toContain('ALTER ROLE "app" LOGIN')
    expect(loginRefusalFix(Object.assign(new Error('database "pets" does not exist'), { code: '3D000' }), gone)).toContain('the database "pets"')
    void gone.end()
  })
})
