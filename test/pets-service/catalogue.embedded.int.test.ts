import { startEmbeddedPostgres } from '../../common/src/database/embeddedPostgres.ts'
import { describeCatalogue } from './catalogue.suite.ts'

// The same suite on the `npm start` default: PGlite behind the Postgres wire protocol.
describeCatalogue('embedded PGlite', async () => {
  const embedded = await startEmbeddedPostgres()
  return { url: embedded.url, drop: () => embedded.stop() }
})
