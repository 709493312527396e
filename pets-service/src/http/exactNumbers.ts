const NUMBER = /-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/y

/**
 * The first number in a JSON text that is not an integer but that JSON.parse rounds to one
 * (`9007199254740990.5`, `1.0000000000000001`), or undefined. After parsing, such a number is
 * indistinguishable from the integer, so an integer schema alone would store a value the client
 * never sent. Integers written without fraction or exponent need no check here: the schema's
 * maximum (2^53 − 1) refuses every one that rounds.
 */
export function firstNumberRoundedToInteger(json: string): string | undefined {
  let inString = false
  for (let i = 0; i < json.length; i++) {
    const char = json.charCodeAt(i)
    if (inString) {
      if (char === 0x5c) i++ // backslash: the next character is escaped
      else if (char === 0x22) inString = false
      continue
    }
    if (char === 0x22) {
      inString = true
      continue
    }
    if (char !== 0x2d && (char < 0x30 || char > 0x39)) continue
    NUMBER.lastIndex = i
    const token = NUMBER.exec(json)?.[0]
    if (!token) continue
    i += token.length - 1
    if (/[.eE]/.test(token) && !isIntegerLiteral(token) && Number.isInteger(Number(token))) return token
  }
  return undefined
}

/** Whether a JSON number literal denotes an integer exactly (`7.0`, `1e3` do; `1.5`, `15e-1` not). */
function isIntegerLiteral(token: string): boolean {
  const [mantissa = '', exponent = '0'] = token.replace(/^-/, '').split(/[eE]/)
  const [whole = '', fraction = ''] = mantissa.split('.')
  const digits = whole + fraction
  // Counted by hand: /0+$/ backtracks over every run of zeros not at the end, which made a
  // 1 MiB literal like 1.000…0001 cost minutes of CPU (quadratic in the run's length).
  let significantEnd = digits.length
  while (significantEnd > 0 && digits.charCodeAt(significantEnd - 1) === 0x30) significantEnd--
  const significant = digits.slice(0, significantEnd)
  if (!/[1-9]/.test(significant)) return true // zero
  const trailingZeros = digits.length - significant.length
  return Number(exponent) - fraction.length + trailingZeros >= 0
}
