import { createHash } from 'node:crypto'
import { BIDI_CONTROL, CONTROL_CHARACTER, LINE_SEPARATOR } from '../../../common/src/text/displaySafety.ts'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { petsErrors } from '../errors.ts'
import { consumerId, publicPrefix } from '../http/forwarded.ts'
import type { NewPetRow, PetRepository } from '../repository/petRepository.ts'
import { IdempotencyHeaders, NAME_MAX_LENGTH, NewPet, NoQuery, Pet } from '../schemas/pet.ts'

// Nothing but invisible characters: format characters (U+200B), the default-ignorable ones
// (variation selectors, U+034F, the Hangul fillers), separators, marks with nothing to mark, the
// blank braille pattern, code points with no character assigned (noncharacters such as U+FFFF
// among them). A name no one can see in a list. Joiners inside a visible name (emoji sequences,
// Persian) are fine.
const NOTHING_VISIBLE = /^[\p{Default_Ignorable_Code_Point}\p{Cf}\p{Z}\p{M}\p{Cn}\u2800]*$/u

// What trimming takes off either end: a user-perceived character (grapheme) made only of white
// space, characters that show nothing and marks (a combining accent on a space, or on nothing). A variation selector or joiner that belongs to the
// character before it is part of that character's grapheme and stays (the emoji presentation of
// U+2764 U+FE0F, a tag-sequence flag); a joiner at the very end joins nothing and goes. NEL
// (U+0085) is white space to Unicode, not to String.trim or \s.
const INVISIBLE_GRAPHEME = /^[\s\u0085\p{Default_Ignorable_Code_Point}\p{Cf}\p{Z}\p{M}\u2800]+$/u
const TRAILING_JOINERS = /[\u200c\u200d]+$/u
// A variation selector, grapheme joiner or tag attached to a Latin letter changes nothing one can
// see ("Rex\uFE0F" shows as "Rex"); after an emoji it chooses how the emoji shows, after a Han or
// Mongolian letter which glyph a name is written with: there it stays.
const TRAILING_IGNORABLES = /\p{Default_Ignorable_Code_Point}+$/u
const LATIN_LETTER = /^\p{Script=Latin}/u
const graphemes = new Intl.Segmenter(undefined, { granularity: 'grapheme' })

/** The name without white space or invisible characters at either end: "Rex\u200b" is "Rex", not a second name that looks the same. */
function trimName(name: string): string {
  const parts = [...graphemes.segment(name.trim())].map(({ segment }) => segment)
  let start = 0
  let end = parts.length
  while (start < end && INVISIBLE_GRAPHEME.test(parts[start]!)) start++
  while (end > start && INVISIBLE_GRAPHEME.test(parts[end - 1]!)) end--
  const kept = parts.slice(start, end)
  const last = kept.length - 1
  if (last >= 0 && LATIN_LETTER.test(kept[last]!)) kept[last] = kept[last]!.replace(TRAILING_IGNORABLES, '')
  return kept.join('').replace(TRAILING_JOINERS, '')
}

/** DESIGN: the name is trimmed and must then hold 1 to 100 characters; status defaults to available. */
export function normaliseNewPet(body: NewPet): NewPetRow {
  if (!body.name.isWellFormed()) {
    throw petsErrors.create('validation_failed', 'body/name must be well-formed Unicode text: it holds a lone surrogate')
  }
  // Before trimming, which would take one at either end off silently: a name that holds one is refused.
  if (BIDI_CONTROL.test(body.name)) {
    throw petsErrors.create('validation_failed', 'body/name must not hold bidirectional override, embedding or isolate characters (U+202A–U+202E, U+2066–U+2069)')
  }
  const name = trimName(body.name)
  const length = [...name].length
  if (length < 1 || length > NAME_MAX_LENGTH) {
    throw petsErrors.create('validation_failed', `body/name must hold 1 to ${NAME_MAX_LENGTH} characters once trimmed`)
  }
  // Control characters have no place in a name, and Postgres text cannot hold NUL at all.
  if (CONTROL_CHARACTER.test(name)) {
    throw petsErrors.create('validation_failed', 'body/name must be Unicode text without control characters')
  }
  // A name is one line: U+2028 and U+2029 break it as a newline does, which the check above refuses.
  if (LINE_SEPARATOR.test(name)) {
    throw petsErrors.create('validation_failed', 'body/name must be one line, without line or paragraph separators (U+2028, U+2029)')
  }
  if (NOTHING_VISIBLE.test(name)) {
    throw petsErrors.create('validation_failed', 'body/name must hold at least one visible character')
  }
  return { name, categoryId: body.categoryId, status: body.status ?? 'available' }
}

function fingerprint(pet: NewPetRow): string {
  return createHash('sha256').update(JSON.stringify([pet.name, pet.categoryId, pet.status])).digest('base64url')
}

/** POST /pets (createPet): 201 with the pet and its Location; Idempotency-Key makes retries safe. */
export const createPetRoute: FastifyPluginAsyncTypebox<{ pets: PetRepository }> = async (app, { pets }) => {
  app.post(
    '/pets',
    { schema: { body: NewPet, querystring: NoQuery, headers: IdempotencyHeaders, response: { 201: Pet } } },
    async (request, reply) => {
      const pet = normaliseNewPet(request.body)
      const key = request.headers['idempotency-key']
      const claim = key === undefined ? undefined : { consumer: consumerId(request), key, fingerprint: fingerprint(pet) }
      const result = await pets.create(pet, claim)
      if (result.outcome === 'key_reused') throw petsErrors.create('idempotency_key_reused')
      if (result.outcome === 'replayed') reply.header('idempotent-replayed', 'true')
      return reply
        .code(201)
        .header('location', `${publicPrefix(request)}/pets/${result.pet.id}`)
        .send(result.pet)
    },
  )
}
