/**
 * The upstream every proxy row forwards to: plain node:http, one fixed answer for any request
 * (method and path alike), a JSON array of 20 pets shaped like the pets-service's first page.
 * No framework, no database, no logging: whatever a proxy row costs beyond the direct row is the
 * proxy's. Run by bench/targets/staticUpstream.ts as its own process, shared by every proxy row.
 *
 * Env: PORT, HOST (default 127.0.0.1), BUSY_MICROS (default 0: the experiment rows' fixed amount of
 * busy-waiting per request, a stand-in for a server's own work).
 */
import http from 'node:http'

const STATUSES = ['available', 'pending', 'sold'] as const
// Same rows the bench database seeds (pets 1..20), so checkFirstPetsPage accepts the answer.
const pets = Array.from({ length: 20 }, (_, index) => {
  const id = index + 1
  return { id, name: `pet ${id}`, categoryId: 1 + (id % 12), status: STATUSES[id % 3] }
})
const body = Buffer.from(JSON.stringify(pets))
const headers = { 'content-type': 'application/json; charset=utf-8', 'content-length': String(body.length) }

const busyMillis = Number(process.env.BUSY_MICROS ?? 0) / 1_000

const server = http.createServer((request, response) => {
  if (busyMillis > 0) {
    const until = performance.now() + busyMillis
    while (performance.now() < until);
  }
  // A request body (none in the benchmark) is read and dropped so the connection stays usable.
  request.resume()
  response.writeHead(200, headers)
  response.end(body)
})
// Longer than any client's idle time in a run, so no row pays for reconnects.
server.keepAliveTimeout = 75_000
server.headersTimeout = 76_000

server.listen(Number(process.env.PORT ?? 3300), process.env.HOST || '127.0.0.1')

function shutdown(): void {
  server.close(() => process.exit(0))
  server.closeAllConnections()
}
process.on('SIGTERM', shutdown)
process.on('SIGINT', shutdown)
