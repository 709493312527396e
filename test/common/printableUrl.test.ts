import { describe, expect, it } from 'vitest'
import { printableUrl } from '../../common/src/database/printableUrl.ts'

describe('a database URL as the services and the CLI print it', () => {
  it('hides the password wherever pg would read one: the userinfo, ?password=, the socket form', () => {
    expect(printableUrl('postgres://app:s3cret@db:5432/pets')).toBe('postgres://app:***@db:5432/pets')
    expect(printableUrl('postgres://app@db:5432/pets?password=s3cret&sslmode=require')).toBe('postgres://app@db:5432/pets?password=***&sslmode=require')
    expect(printableUrl('socket:/var/run/postgresql?db=pets&password=s3cret')).not.toContain('s3cret')
    expect(printableUrl('postgres://app@db/pets?sslpassword=s3cret')).not.toContain('s3cret')
    expect(printableUrl('postgres://app@db:5432/pets')).toBe('postgres://app@db:5432/pets')
  })

  // DATABASE_URL=/tmp/pg, a form README allows, was printed as "(an unparsable URL)" in every error naming it.
  it('prints a socket folder as it is, with its database: it holds no secret', () => {
    expect(printableUrl('/var/run/postgresql')).toBe('/var/run/postgresql')
    expect(printableUrl('/var/run/postgresql pets')).toBe('/var/run/postgresql pets')
    expect(printableUrl('/var/run/postgresql pets and what pg ignores')).toBe('/var/run/postgresql pets')
  })

  it('prints nothing of a URL that does not parse (its password could be anywhere in it)', () => {
    expect(printableUrl('postgres://app:pa/ss#word@db/pets')).toBe('(an unparsable URL)')
  })
})
