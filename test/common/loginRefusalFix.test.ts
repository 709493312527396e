import pg from 'pg'
import { afterAll, describe, expect, it } from 'vitest'
import { loginRefusalFix } from '../../common/src/database/privileges.ts'

const refusal = (message: string) => Object.assign(new Error(message), { code: '28000' })

describe('the fix a refused login is said with', () => {
  const pool = new pg.Pool({ connectionString: 'postgres://app@127.0.0.1:5432/pets?sslmode=verify-full' })
  afterAll(() => pool.end())

  // pg reads sslkey as it makes a client: a file gone since the start threw out of this function.
  it('does not throw when DATABASE_URL names an sslkey that cannot be read any more', () => {
    const gone = new pg.Pool({ connectionString: 'postgres://app@127.0.0.1:5432/pets?sslmode=verify-full&sslkey=/nonexistent/client.key' })
    expect(() => loginRefusalFix(refusal('role "app" is not permitted to log in'), gone)).not.toThrow()
    void gone.end()
  })
})
