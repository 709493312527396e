import { describe, expect, it } from 'vitest'
import { firstNumberRoundedToInteger, firstRepeatedMember, instancePathAt } from '../../pets-service/src/http/exactNumbers.ts'

describe('numbers JSON.parse would round to an integer', () => {
  it.each([
    ['{"name":"Rex","categoryId":9007199254740990.5}', '9007199254740990.5'],
    ['{"name":"Rex","categoryId":9007199254740991.4}', '9007199254740991.4'],
    ['{"name":"Rex","categoryId":1.0000000000000001}', '1.0000000000000001'],
    ['{"categoryId":-2.00000000000000001}', '-2.00000000000000001'],
    ['{"categoryId":1000000000000000000000.5}', '1000000000000000000000.5'],
    ['{"categoryId":1.00000000000000000001e5}', '1.00000000000000000001e5'],
    ['[1, 2.5, 3.0000000000000000001]', '3.0000000000000000001'],
  ])('finds the rounded number in %s', (json, token) => {
    expect(firstNumberRoundedToInteger(json)).toEqual({ token, index: json.indexOf(token) })
  })

  it.each([
    '{"name":"Rex","categoryId":9007199254740991}',
    '{"name":"Rex","categoryId":7.0}',
    '{"name":"Rex","categoryId":1e3}',
    '{"name":"Rex","categoryId":1.5e1}',
    '{"name":"Rex","categoryId":0.0}',
    // Not an integer after parsing either: the schema refuses these by itself.
    '{"name":"Rex","categoryId":1.5}',
    '{"name":"Rex","categoryId":15e-1}',
    // Inside strings, digits are text.
    '{"name":"1.0000000000000001 \\" 9007199254740990.5","categoryId":3}',
  ])('finds none in %s', (json) => {
    expect(firstNumberRoundedToInteger(json)).toBeUndefined()
  })

  // The old check took time quadratic in a run of zeros: about 16 s of blocked event loop for
  // this literal (past vitest's 5 s timeout), and half an hour for one filling a 1 MiB body.
  it('reads a long literal of zeros in passing, as it reads anything else', () => {
    const zeros = '0'.repeat(100_000)
    expect(firstNumberRoundedToInteger(`{"categoryId":1.${zeros}1}`)?.token).toBe(`1.${zeros}1`)
    expect(firstNumberRoundedToInteger(`{"categoryId":1${zeros}.5}`)).toBeUndefined()
  })
})

describe('the field a number in a JSON text belongs to', () => {
  it.each([
    ['{"name":"Rex","categoryId":9007199254740990.5}', '9007199254740990.5', '/categoryId'],
    ['{ "name" : "Rex" ,\n  "categoryId" :\t1.0000000000000001 }', '1.0000000000000001', '/categoryId'],
    ['1.0000000000000001', '1.0000000000000001', ''],
    ['[1, 2, 3.0000000000000000001]', '3.0000000000000000001', '/2'],
    ['{"a":{"b":[{"c":1},{"d":[7, 2.0000000000000001]}]}}', '2.0000000000000001', '/a/b/1/d/1'],
    // Brackets, commas, colons and quotes inside strings are text; a value string is not a key.
    ['{"x":"{[,:\\"]}","y":["a,b",{"z":"]"}],"categoryId":1.0000000000000001}', '1.0000000000000001', '/categoryId'],
    // Keys as Ajv writes them in an instancePath: decoded, with ~ and / escaped (RFC 6901).
    ['{"a/b":{"c~d":{"\\u0065":1.0000000000000001}}}', '1.0000000000000001', '/a~1b/c~0d/e'],
  ])('finds %s at its pointer', (json, token, pointer) => {
    expect(instancePathAt(json, json.indexOf(token))).toBe(pointer)
  })
})

describe('members given twice in one object', () => {
  it.each([
    ['{"name":"A","categoryId":"x","categoryId":2}', 'categoryId', '2'],
    ['{"name":"A", "n\\u0061me" :\t"B"}', 'name', '"B"'],
    ['{"a":{"b":1},"c":[{"d":1,"d":[3]}]}', 'd', '[3]'],
  ])('finds the second member of %s', (json, name, value) => {
    expect(firstRepeatedMember(json)).toEqual({ name, valueIndex: json.lastIndexOf(value) })
  })

  it.each([
    '{"name":"A","categoryId":2}',
    // The same name in different objects, and names as values or inside strings, are not repeats.
    '{"a":{"x":1},"b":{"x":1}}',
    '{"name":"name","categoryId":2,"status":"{\\"name\\":1}"}',
    '[{"a":1},{"a":1}]',
    '{"a":"b","b":"a"}',
  ])('finds none in %s', (json) => {
    expect(firstRepeatedMember(json)).toBeUndefined()
  })
})
