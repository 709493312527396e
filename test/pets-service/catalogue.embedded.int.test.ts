import { mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { startEmbeddedPostgres } from '../../common/src/database/embeddedPostgres.ts'
import { describeCatalogue } from './catalogue.suite.ts'

// The same suite on the `npm start` default: PGlite behind the Postgres wire protocol, on a Unix socket.
describeCatalogue('embedded PGlite', async () => {
  const socketDirectory = await mkdtemp(path.join(os.tmpdir(), 'aas-catalogue-'))
  const embedded = await startEmbeddedPostgres({ socketDirectory, port: 54329 })
  return {
    url: embedded.url,
    drop: async () => {
      await embedded.stop()
      await rm(socketDirectory, { recursive: true, force: true })
    },
  }
})
