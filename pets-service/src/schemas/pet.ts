import { Type, type Static } from 'typebox'

export const PET_STATUSES = ['available', 'pending', 'sold'] as const

export const PetStatus = Type.Enum([...PET_STATUSES], { description: 'Availability of the animal' })

/** Largest id or categoryId a JSON client can send and read back without rounding. */
export const MAX_SAFE_ID = Number.MAX_SAFE_INTEGER

const Id = Type.Integer({ minimum: 1, maximum: MAX_SAFE_ID })

export const NAME_MAX_LENGTH = 100

// The raw name may carry surrounding whitespace that is trimmed away; the trimmed name's
// length and characters are checked after parsing (see normaliseNewPet).
export const NewPet = Type.Object(
  {
    name: Type.String({ minLength: 1, maxLength: 1_000 }),
    categoryId: Id,
    status: Type.Optional(PetStatus),
  },
  { additionalProperties: false },
)
export type NewPet = Static<typeof NewPet>

export const Pet = Type.Object({
  id: Type.Integer(),
  name: Type.String(),
  categoryId: Type.Integer(),
  status: PetStatus,
})
export type Pet = Static<typeof Pet>
export type PetStatus = Pet['status']

export const PetList = Type.Array(Pet)

export const ListPetsQuery = Type.Object(
  {
    // A string until parsed, as petId is: coerced to a number, "0x10", "1e1", " 5" and "05" would
    // all pass as integers.
    limit: Type.String({ pattern: '^(?:[1-9][0-9]?|100)$', default: '20', description: 'an integer from 1 to 100' }),
    status: Type.Optional(PetStatus),
    cursor: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
  },
  { additionalProperties: false },
)

/** For the operations the spec gives no query parameters: one sent is refused, as the list refuses one it does not know. */
export const NoQuery = Type.Object({}, { additionalProperties: false })

// petId stays a string until parsed: a number schema would accept "1e3" and round
// 9007199254740993 before we could refuse it.
export const PetIdParams = Type.Object({
  petId: Type.String({ pattern: '^[1-9][0-9]{0,18}$', description: 'an integer between 1 and 2^63 - 1' }),
})

export const IdempotencyHeaders = Type.Object({
  'idempotency-key': Type.Optional(
    Type.String({ minLength: 1, maxLength: 255, pattern: '^[\\x21-\\x7e]+$', description: 'printable ASCII without spaces' }),
  ),
})
