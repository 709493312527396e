import type { FastifyRequest } from 'fastify'

const PREFIX = /^(\/[A-Za-z0-9._~-]+)+$/
const CONSUMER = /^[A-Za-z0-9._:-]{1,128}$/

/**
 * The public path prefix the gateway serves this service under (`/v1`), so Location and Link
 * headers point where the client can follow them. Only the gateway can reach this service,
 * so the header is trusted once it is well-formed.
 */
export function publicPrefix(request: FastifyRequest): string {
  const prefix = request.headers['x-forwarded-prefix']
  return typeof prefix === 'string' && PREFIX.test(prefix) ? prefix : ''
}

/** The caller's identity as the gateway forwards it (the API key id), scoping idempotency keys. */
export function consumerId(request: FastifyRequest): string {
  const consumer = request.headers['x-consumer-id']
  return typeof consumer === 'string' && CONSUMER.test(consumer) ? consumer : 'anonymous'
}
