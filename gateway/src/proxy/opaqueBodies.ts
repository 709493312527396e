import type { FastifyInstance } from 'fastify'

/** The largest request body the gateway reads (413 past it, before any upstream is contacted). */
export const BODY_LIMIT_BYTES = 1_048_576

/**
 * Bodies are bytes to forward, never parsed here: read whole (at most 1 MiB, else 413) whatever
 * their type. The gateway's own routes ignore them, so a POST of broken JSON to a path that does
 * not exist is a 404 (or a 405), not a JSON parse error.
 */
export function acceptOpaqueBodies(app: FastifyInstance): void {
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: BODY_LIMIT_BYTES }, (_request, body, done) => done(null, body))
}
