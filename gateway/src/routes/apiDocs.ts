import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { gzipSync } from 'node:zlib'
import type { FastifyInstance, FastifyReply, FastifyRequest, preParsingHookHandler } from 'fastify'
import { hasNoMediaType, sendApiError } from '../../../common/src/http/errorHandler.ts'
import type { GatewayConfig } from '../config/loadConfig.ts'
import { gatewayErrors } from '../errors.ts'
import { loadOpenApiDocument, withOrdersUpstream, withServers } from '../openapi/document.ts'

const PAGE_DIRECTORY = fileURLToPath(new URL('../../openapi/docs/', import.meta.url))
const SWAGGER_UI = dirname(createRequire(import.meta.url).resolve('swagger-ui-dist/package.json'))

interface Asset {
  type: string
  body: Buffer
  gzipped?: Buffer
}

/** The docs page's files, read once: the page and its script from the repo, Swagger UI from npm. */
function readAssets(): Record<string, Asset> {
  const page = (name: string, type: string): Asset => ({ type, body: readFileSync(join(PAGE_DIRECTORY, name)) })
  const swaggerUi = (name: string, type: string): Asset => ({ type, body: readFileSync(join(SWAGGER_UI, name)) })
  return {
    '/docs': page('index.html', 'text/html; charset=utf-8'),
    '/docs/docs.js': page('docs.js', 'text/javascript; charset=utf-8'),
    '/docs/swagger-ui.css': swaggerUi('swagger-ui.css', 'text/css; charset=utf-8'),
    '/docs/swagger-ui-bundle.js': swaggerUi('swagger-ui-bundle.js', 'text/javascript; charset=utf-8'),
    '/docs/favicon-32x32.png': swaggerUi('favicon-32x32.png', 'image/png'),
  }
}

/**
 * Whether the client takes gzip (RFC 9110 §12.5.3): named with a weight above 0, or covered by
 * `*` when not named; `gzip;q=0` refuses it, whatever else the header says.
 */
function acceptsGzip(header: string | undefined): boolean {
  if (!header) return false
  let wildcard = false
  for (const entry of header.split(',')) {
    const [coding = '', ...parameters] = entry.split(';').map((part) => part.trim().toLowerCase())
    const weight = parameters.find((parameter) => parameter.startsWith('q='))
    const accepted = weight === undefined || Number(weight.slice(2)) > 0
    if (coding === 'gzip' || coding === 'x-gzip') return accepted
    if (coding === '*') wildcard = accepted
  }
  return wildcard
}

/**
 * The page may run only the gateway's own scripts and styles and may call only the gateway
 * ("Try it out" goes to the gateway serving the page): nothing comes from a CDN, even if a
 * dependency tried. The document's other servers would need CORS, which the API does not offer
 * (its keys are secrets, for servers, not for pages).
 */
const CONTENT_SECURITY_POLICY = [
  "default-src 'none'",
  "script-src 'self'",
  // Swagger UI sets style attributes on its elements.
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ')

/** What `GET /` answers: no operation lives there, but the way to them does. */
export const ROOT_MESSAGE =
  'No route matches this path. The API is under /v1 (GET /v1/pets, with "Authorization: Bearer <key>"); ' +
  'its documentation is at /docs, its OpenAPI document at /v1/openapi.json.'

/**
 * The API's own description, without a key (`public: true`: the authentication stage skips these
 * routes, and the rate-limit stage limits them per client IP like any request without a key):
 *   GET /v1/openapi.json  gateway/openapi/openapi.yaml as JSON, naming the configured servers;
 *   GET /docs             Swagger UI on that document, every file served from here;
 *   /                     404 with the Error body, naming /v1, /docs and /v1/openapi.json.
 */
export async function apiDocs(app: FastifyInstance, options: { config: () => GatewayConfig; ordersUpstream: boolean }): Promise<void> {
  const source = options.ordersUpstream ? withOrdersUpstream(loadOpenApiDocument()) : loadOpenApiDocument()
  let served: { servers: GatewayConfig['openapi']['servers']; json: string } | undefined
  // The servers follow config reloads; the JSON is rebuilt only when they change.
  const documentFor = (servers: GatewayConfig['openapi']['servers']) => {
    if (served?.servers !== servers) served = { servers, json: JSON.stringify(withServers(source, servers)) }
    return served.json
  }

  app.get('/v1/openapi.json', { config: { public: true } }, async (_request, reply) =>
    reply
      .type('application/json; charset=utf-8')
      .header('cache-control', 'private, no-cache')
      .send(documentFor(options.config().openapi.servers)),
  )

  // Where a browser or a bare `curl <host>:8080` lands first: told where the API and its docs are
  // rather than to send a key for a path that has no operation anyway. Every method: a 405 would
  // name GET as answered here.
  // Whatever body comes with it: one whose Content-Type is no media type at all, which Fastify
  // would refuse with 415 as it started to read it, gets the same answer, before it is read.
  const rootNotFound = () => gatewayErrors.create('not_found', ROOT_MESSAGE)
  const notReadingTheBody: preParsingHookHandler = (request, reply, payload, done) => {
    if (hasNoMediaType(request)) return sendApiError(reply, rootNotFound())
    done(null, payload)
  }
  app.all('/', { config: { public: true }, preParsing: notReadingTheBody }, async () => {
    throw rootNotFound()
  })

  const assets = readAssets()
  // The page's files are addressed relative to /docs, so /docs/ would break them.
  app.get('/docs/', { config: { public: true } }, async (_request, reply) => reply.redirect('/docs', 301))
  const send = (asset: Asset, request: FastifyRequest, reply: FastifyReply) => {
    void reply.type(asset.type).header('x-content-type-options', 'nosniff').header('vary', 'accept-encoding')
    // Swagger UI is 1.5 MB of JavaScript: compressed once, on first use.
    if (asset.body.length > 1_024 && acceptsGzip(request.headers['accept-encoding'])) {
      asset.gzipped ??= gzipSync(asset.body)
      return reply.header('content-encoding', 'gzip').send(asset.gzipped)
    }
    return reply.send(asset.body)
  }
  for (const [path, asset] of Object.entries(assets)) {
    app.get(path, { config: { public: true } }, async (request, reply) => {
      if (path === '/docs') {
        void reply
          .header('content-security-policy', CONTENT_SECURITY_POLICY)
          .header('referrer-policy', 'no-referrer')
          .header('cache-control', 'private, no-cache')
      } else {
        // A browser keeps the files an hour; a shared cache none: every answer carries its
        // client's per-IP quota and request id, which a CDN would hand to everyone else.
        void reply.header('cache-control', 'private, max-age=3600')
      }
      return send(asset, request, reply)
    })
  }
}
