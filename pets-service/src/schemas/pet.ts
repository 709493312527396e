import type { Static } from 'typebox'
import { generatedSchemas } from '../../../common/src/schemas/generatedSchemas.ts'
import type * as Authored from './pet.typebox.ts'

export { MAX_SAFE_ID, NAME_MAX_LENGTH, PET_STATUSES } from './petFields.ts'

// The schemas of pet.typebox.ts, as `npm run generate:schemas` wrote them.
export const { PetStatus, NewPet, Pet, PetList, ListPetsQuery, NoQuery, PetIdParams, IdempotencyHeaders } = generatedSchemas<typeof Authored>(
  import.meta.url,
  './pet.schemas.json',
)
export type NewPet = Static<typeof NewPet>
export type Pet = Static<typeof Pet>
export type PetStatus = Pet['status']
