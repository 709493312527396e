import type { FastifyPluginAsync } from 'fastify'

/**
 * GET /auth-check: 204 and nothing else. Like every route it sits behind internalAuth, so a 204
 * proves the caller's internal credential is accepted and a wrong one gets the usual 401. The
 * gateway's /readyz asks it; it touches no database (the pets-service's own /readyz covers that).
 */
export const authCheckRoute: FastifyPluginAsync = async (app) => {
  app.get('/auth-check', async (_request, reply) => reply.code(204).send())
}
