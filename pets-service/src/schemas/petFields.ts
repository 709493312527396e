/** Rules of a pet's fields that both its schemas (pet.typebox.ts) and the code that checks a pet beyond them use. */

export const PET_STATUSES = ['available', 'pending', 'sold'] as const

/** Largest id or categoryId a JSON client can send and read back without rounding. */
export const MAX_SAFE_ID = Number.MAX_SAFE_INTEGER

export const NAME_MAX_LENGTH = 100
