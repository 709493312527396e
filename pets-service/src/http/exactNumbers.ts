const NUMBER = /-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/y

/** A number literal as written in a JSON text, and where it begins. */
export interface NumberLiteral {
  token: string
  index: number
}

/**
 * The first number in a JSON text that is not an integer but that JSON.parse rounds to one
 * (`9007199254740990.5`, `1.0000000000000001`), or undefined. After parsing, such a number is
 * indistinguishable from the integer, so an integer schema alone would store a value the client
 * never sent. Integers written without fraction or exponent need no check here: the schema's
 * maximum (2^53 − 1) refuses every one that rounds.
 */
export function firstNumberRoundedToInteger(json: string): NumberLiteral | undefined {
  for (let i = 0; i < json.length; i++) {
    const char = json.charCodeAt(i)
    if (char === 0x22) {
      i = stringEnd(json, i)
      continue
    }
    if (char !== 0x2d && (char < 0x30 || char > 0x39)) continue
    NUMBER.lastIndex = i
    const token = NUMBER.exec(json)?.[0]
    if (!token) continue
    if (/[.eE]/.test(token) && !isIntegerLiteral(token) && Number.isInteger(Number(token))) return { token, index: i }
    i += token.length - 1
  }
  return undefined
}

/**
 * The first member of an object in a JSON text JSON.parse has accepted whose name an earlier
 * member of the same object already has, and where its value begins; or undefined. JSON.parse
 * keeps the last of them silently, so `{"categoryId":"x","categoryId":2}` would pass the schema
 * although the client sent a value it refuses (RFC 8259 §4: names SHOULD be unique).
 */
export function firstRepeatedMember(json: string): { name: string; valueIndex: number } | undefined {
  // One entry per container open: the names met so far in an object, null in an array.
  const open: (Set<string> | null)[] = []
  for (let i = 0; i < json.length; i++) {
    const char = json.charCodeAt(i)
    if (char === 0x7b) open.push(new Set())
    else if (char === 0x5b) open.push(null)
    else if (char === 0x7d || char === 0x5d) open.pop()
    else if (char === 0x22) {
      const start = i
      i = stringEnd(json, i)
      const names = open.at(-1)
      if (!names) continue
      const colon = indexAfterWhitespace(json, i + 1)
      // A string in an object followed by a colon is a name; the value after a name is not.
      if (json.charCodeAt(colon) !== 0x3a) continue
      const written = json.slice(start + 1, i)
      const name = written.includes('\\') ? (JSON.parse(json.slice(start, i + 1)) as string) : written
      if (names.has(name)) return { name, valueIndex: indexAfterWhitespace(json, colon + 1) }
      names.add(name)
    }
  }
  return undefined
}

/**
 * The JSON Pointer (RFC 6901, as Ajv writes an error's instancePath: `/categoryId`, `/pets/0`) of
 * the value that begins at `index` of a JSON text JSON.parse has accepted. Read by hand, not by a
 * second parse: the text holds no value but as written, and only the keys on the way are decoded.
 */
export function instancePathAt(json: string, index: number): string {
  // One entry a container open at `index`: the key or the array position being read in it.
  const path: (string | number)[] = []
  const inArray: boolean[] = []
  for (let i = 0; i < index; i++) {
    const char = json.charCodeAt(i)
    if (char === 0x7b || char === 0x5b) {
      // { or [
      inArray.push(char === 0x5b)
      path.push(char === 0x5b ? 0 : '')
    } else if (char === 0x7d || char === 0x5d) {
      // } or ]
      inArray.pop()
      path.pop()
    } else if (char === 0x2c && inArray.at(-1)) {
      // a comma between array elements
      path[path.length - 1] = (path.at(-1) as number) + 1
    } else if (char === 0x22) {
      const start = i
      i = stringEnd(json, i)
      // A string in an object where a value is not expected next is a key: a value follows its colon.
      if (inArray.at(-1) === false && nextNonWhitespace(json, i + 1) === 0x3a) {
        path[path.length - 1] = JSON.parse(json.slice(start, i + 1)) as string
      }
    }
  }
  return path.map((segment) => `/${String(segment).replaceAll('~', '~0').replaceAll('/', '~1')}`).join('')
}

/** Where the string that opens at `start` ends (its closing quote; the text's end if it has none): escapes are skipped. */
function stringEnd(json: string, start: number): number {
  let i = start + 1
  while (i < json.length && json.charCodeAt(i) !== 0x22) i += json.charCodeAt(i) === 0x5c ? 2 : 1
  return i
}

function nextNonWhitespace(json: string, from: number): number {
  return json.charCodeAt(indexAfterWhitespace(json, from))
}

function indexAfterWhitespace(json: string, from: number): number {
  let i = from
  while (json.charCodeAt(i) === 0x20 || json.charCodeAt(i) === 0x09 || json.charCodeAt(i) === 0x0a || json.charCodeAt(i) === 0x0d) i++
  return i
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
