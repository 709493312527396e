/*
 * Characters that make text show other than it is stored: what a name given by one party and
 * shown to another (a pet's name to API clients, an API key's name to an operator's terminal) may
 * not hold, and what is escaped wherever such text is printed.
 */

/** Unicode's control characters (category Cc): C0, DEL and C1 (C1 includes CSI and OSC, which terminals obey). */
// eslint-disable-next-line no-control-regex -- matching control characters is the point
export const CONTROL_CHARACTER = /[\u0000-\u001f\u007f-\u009f]/

/**
 * The bidirectional embeddings, overrides and isolates: text holding one shows in another order
 * than it is stored ("Trojan Source", CVE-2021-42574).
 */
export const BIDI_CONTROL = /[\u202a-\u202e\u2066-\u2069]/

/**
 * Unicode's line and paragraph separators (U+2028, U+2029): no control characters, but line
 * breaks wherever text is laid out (a list of names shows one on two lines), as a newline is.
 */
export const LINE_SEPARATOR = /[\u2028\u2029]/

// eslint-disable-next-line no-control-regex -- matching control characters is the point
const NOT_SHOWN_AS_IS = /[\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069\u2028\u2029]/g

/** `text` with every control, bidi control and line separator written as a \u escape, for a terminal or a log. */
export function escapeForDisplay(text: string): string {
  return text.replace(NOT_SHOWN_AS_IS, (character) => `\\u${character.charCodeAt(0).toString(16).padStart(4, '0')}`)
}
