import http from 'node:http'
import net from 'node:net'
import { afterEach, expect, it } from 'vitest'
import { cutStalledConnections } from '../../common/src/http/stalledConnections.ts'

const servers: http.Server[] = []
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.closeAllConnections()
    await new Promise((resolve) => server.close(resolve))
  }
})

it('closes a quiet connection whose writing side ended under an answer still owed, which can never be sent', async () => {
  // A refusal written after a request's time ran out ends the connection; an answer Node then
  // gave it for a request read meanwhile is never written nor finished. Judged "being answered",
  // such a connection was left open for good.
  const server = http.createServer((request, response) => {
    request.socket.end()
    response.writeHead(200).write('never sent')
  })
  servers.push(server)
  server.timeout = 200
  cutStalledConnections(server)
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  // The client keeps its side open, as a client still sending would.
  const client = net.connect({ port: (server.address() as net.AddressInfo).port, host: '127.0.0.1', allowHalfOpen: true })
  client.on('error', () => undefined)
  client.resume()
  client.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n')
  const connections = () => new Promise<number>((resolve, reject) => server.getConnections((error, count) => (error ? reject(error) : resolve(count))))
  await new Promise((resolve) => setTimeout(resolve, 100))
  expect(await connections()).toBe(1)
  // Past the timeout (and Node's first one, which it lets pass).
  await new Promise((resolve) => setTimeout(resolve, 1_000))
  expect(await connections()).toBe(0)
  client.destroy()
})
