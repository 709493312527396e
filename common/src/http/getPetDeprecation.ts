/**
 * GET /pets/{petId} (getPet) is deprecated by the specification, to be removed on 5 December
 * 2030; its replacement is GET /pets with the status filter. Every answer of the operation says
 * so, whichever service gives it.
 */

/** RFC 9745 §2: Deprecation is a structured-field date (Unix seconds): 2026-01-01T00:00:00Z. */
const DEPRECATED_SINCE = '@1767225600'
/** RFC 8594: the spec's removal date, 5 December 2030. */
const SUNSET = 'Thu, 05 Dec 2030 00:00:00 GMT'

/** Deprecation, Sunset and the Link to the successor, `GET {publicPrefix}/pets`. */
export function getPetDeprecationHeaders(publicPrefix: string): { deprecation: string; sunset: string; link: string } {
  return { deprecation: DEPRECATED_SINCE, sunset: SUNSET, link: `<${publicPrefix}/pets>; rel="successor-version"` }
}
