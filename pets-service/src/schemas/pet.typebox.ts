/**
 * The pets-service's schemas, authored with TypeBox. The service reads them from
 * pet.schemas.json (schemas/pet.ts): run `npm run generate:schemas` after changing this file.
 */
import { Type } from 'typebox'
import { MAX_SAFE_ID, PET_STATUSES } from './petFields.ts'

export const PetStatus = Type.Enum([...PET_STATUSES], { description: 'Availability of the animal' })

const Id = Type.Integer({ minimum: 1, maximum: MAX_SAFE_ID })

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

export const Pet = Type.Object({
  id: Type.Integer(),
  name: Type.String(),
  categoryId: Type.Integer(),
  status: PetStatus,
})

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
