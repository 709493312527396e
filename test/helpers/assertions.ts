import { expect } from 'vitest'

/** Asserts the spec's Error body: exactly code, message and status, status equal to the HTTP one. */
export async function expectErrorResponse(response: Response, status: number, code: string) {
  const text = await response.text()
  expect(response.status, text).toBe(status)
  expect(response.headers.get('content-type')).toMatch(/^application\/json/)
  const body = JSON.parse(text) as Record<string, unknown>
  expect(body).toEqual({ code, message: expect.any(String), status })
  expect(body.message).not.toMatch(/\bat .+:\d+:\d+|SELECT|INSERT|pets\.pets/)
  return body
}
