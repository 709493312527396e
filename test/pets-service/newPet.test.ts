import { describe, expect, it } from 'vitest'
import { ApiError } from '../../common/src/http/apiError.ts'
import { normaliseNewPet } from '../../pets-service/src/routes/createPet.ts'

describe('a new pet as stored', () => {
  it('has its name trimmed and status defaulting to available', () => {
    expect(normaliseNewPet({ name: '  Rex  ', categoryId: 4 })).toEqual({ name: 'Rex', categoryId: 4, status: 'available' })
  })

  it('keeps a given status', () => {
    expect(normaliseNewPet({ name: 'Rex', categoryId: 4, status: 'sold' }).status).toBe('sold')
  })

  it('counts characters, not UTF-16 units, against the 100 limit', () => {
    const name = '🐕'.repeat(100)
    expect(normaliseNewPet({ name, categoryId: 1 }).name).toBe(name)
    expect(() => normaliseNewPet({ name: name + '🐕', categoryId: 1 })).toThrow(ApiError)
  })

  it.each([['blank', ' \t '], ['a tab inside', 'Re\tx'], ['DEL', 'Re\u007fx'], ['lone surrogate', 'Re\ud800x']])(
    'refuses a name that is %s with validation_failed',
    (_case, name) => {
      expect(() => normaliseNewPet({ name, categoryId: 1 })).toThrow(
        expect.objectContaining({ code: 'validation_failed', status: 400 }),
      )
    },
  )
})
