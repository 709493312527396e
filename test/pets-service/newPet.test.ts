import { describe, expect, it } from 'vitest'
import { ApiError } from '../../common/src/http/apiError.ts'
import { normaliseNewPet } from '../../pets-service/src/routes/createPet.ts'

describe('a new pet as stored', () => {
  it('has its name trimmed and status defaulting to available', () => {
    expect(normaliseNewPet({ name: '  Rex  ', categoryId: 4 })).toEqual({ name: 'Rex', categoryId: 4, status: 'available' })
  })

  it('has white space and invisible characters trimmed off either end, not the variation selector or tags that belong to the last character', () => {
    const trimmed = (name: string) => normaliseNewPet({ name, categoryId: 1 }).name
    // Those attached to the last letter too (a variation selector, the grapheme joiner, a tag, a Mongolian selector after a Latin x).
    for (const name of ['Rex\u200b', '\u200bRex', '\u2060Rex\u2060', 'Rex\u00ad', '\u180eRex', '\u{e0001}Rex', '\ufeff Rex \u3000', 'Rex\u200d', '\u200dRex\u200c', '\u2800Rex\u2800', 'Rex\ufe0f', 'Rex\u034f', 'Rex\u{e0020}', 'Rex\u{e0100}', 'Rex\u180b', 'Rex\u0301\ufe0f\u034f', 'Rex\u0085', '\u0085 Rex', 'Rex \u0301', '\u0301Rex', ' \u20e3Rex']) {
      expect(trimmed(name), JSON.stringify(name)).toBe(name.startsWith('Rex\u0301') ? 'Rex\u0301' : 'Rex')
    }
    // A selector that chooses a glyph: an emoji's presentation, a Han ideograph's variant (names), a Mongolian letter's form.
    for (const name of ['Rex \u2764\ufe0f', 'Rex \u{1f3f4}\u{e0067}\u{e0062}\u{e0065}\u{e006e}\u{e0067}\u{e007f}', 'Rex \u{1f468}\u200d\u{1f469}\u200d\u{1f467}', 'Zoe\u0308', '\u0600\u0661', '\u845b\u{e0100}', '\u1820\u180b']) {
      expect(trimmed(name), JSON.stringify(name)).toBe(name)
    }
    expect(trimmed('Re\u200bx')).toBe('Re\u200bx')
  })

  it('keeps a given status', () => {
    expect(normaliseNewPet({ name: 'Rex', categoryId: 4, status: 'sold' }).status).toBe('sold')
  })

  it('counts characters, not UTF-16 units, against the 100 limit', () => {
    const name = '🐕'.repeat(100)
    expect(normaliseNewPet({ name, categoryId: 1 }).name).toBe(name)
    expect(() => normaliseNewPet({ name: name + '🐕', categoryId: 1 })).toThrow(ApiError)
  })

  it.each([
    ['blank', ' \t '],
    ['a tab inside', 'Re\tx'],
    ['DEL', 'Re\u007fx'],
    ['a next-line character (U+0085) inside', 'Re\u0085x'],
    ['lone surrogate', 'Re\ud800x'],
    ['only noncharacters', '\uffff\ufffe\ufdd0'],
    ['only code points with no character assigned', '\u0378\u{1ffff}'],
    ['only invisible characters and a joiner', '\u200b\u200d\u2060'],
    ['a bidirectional override at its end', 'Rex\u202e'],
  ])(
    'refuses a name that is %s with validation_failed',
    (_case, name) => {
      expect(() => normaliseNewPet({ name, categoryId: 1 })).toThrow(
        expect.objectContaining({ code: 'validation_failed', status: 400 }),
      )
    },
  )
})
