import type { ResponseSample } from './types.ts'

/** The request both pets rows measure: the first page of the catalogue, 20 rows. */
export const FIRST_PAGE_PATH = '/pets?limit=20'
export const FIRST_PAGE_REQUEST = `GET ${FIRST_PAGE_PATH}`
export const FIRST_PAGE_SIZE = 20

/** Same payload from every pets target: 200 and pets 1..20 with numeric ids. */
export function checkFirstPetsPage(response: ResponseSample): string | undefined {
  if (response.status !== 200) return `status ${response.status}: ${response.body.slice(0, 200)}`
  let pets: unknown
  try {
    pets = JSON.parse(response.body)
  } catch {
    return `body is not JSON: ${response.body.slice(0, 200)}`
  }
  if (!Array.isArray(pets) || pets.length !== FIRST_PAGE_SIZE) {
    return `expected an array of ${FIRST_PAGE_SIZE} pets, got ${response.body.slice(0, 200)}`
  }
  const wellFormed = pets.every(
    (pet: unknown, index) =>
      typeof pet === 'object' &&
      pet !== null &&
      (pet as { id?: unknown }).id === index + 1 &&
      typeof (pet as { name?: unknown }).name === 'string' &&
      typeof (pet as { categoryId?: unknown }).categoryId === 'number' &&
      typeof (pet as { status?: unknown }).status === 'string',
  )
  return wellFormed ? undefined : `unexpected pets: ${response.body.slice(0, 200)}`
}
