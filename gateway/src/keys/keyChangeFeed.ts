import pg from 'pg'
import type { Logger } from 'pino'
import type { KeyChange, KeyRepository } from './keyRepository.ts'

export interface KeyChangeFeedOptions {
  repository: Pick<KeyRepository, 'latestChangeId' | 'changesSince'>
  /** For the LISTEN connection; when LISTEN is unavailable the periodic read still works. */
  connectionString: string
  onChange: (change: KeyChange) => void
  logger: Logger
  /** Catch-up period: the bound on propagation when notifications are lost. */
  pollMillis?: number
}

export const KEY_CHANGES_CHANNEL = 'gateway_api_key_changes'

/**
 * Follows gateway.api_key_changes so a revocation or plan change reaches this gateway's key
 * cache within a second: NOTIFY wakes it at once, and a periodic read of the log catches what
 * a notification could miss (a dropped LISTEN connection, PGlite, a transaction pooler).
 */
export async function startKeyChangeFeed(options: KeyChangeFeedOptions): Promise<{ stop(): Promise<void> }> {
  const { repository, logger } = options
  let lastId = await repository.latestChangeId()
  let stopped = false
  let reading: Promise<void> | undefined
  let again = false

  const catchUp = async (): Promise<void> => {
    if (reading) {
      again = true
      return reading
    }
    reading = (async () => {
      do {
        again = false
        try {
          for (const change of await repository.changesSince(lastId)) {
            options.onChange(change)
            lastId = change.id
          }
        } catch (error) {
          logger.warn({ err: error }, 'reading API key changes failed; cached keys stay until their TTL')
        }
      } while (again && !stopped)
    })().finally(() => {
      reading = undefined
    })
    return reading
  }

  const timer = setInterval(() => void catchUp(), options.pollMillis ?? 1_000)
  timer.unref()

  let listener: pg.Client | undefined
  const listen = async () => {
    if (stopped) return
    const client = new pg.Client({ connectionString: options.connectionString, connectionTimeoutMillis: 2_000 })
    client.on('notification', () => void catchUp())
    client.on('error', (error) => {
      logger.warn({ err: error }, 'API key change notifications lost; relying on the periodic read')
      listener = undefined
      client.end().catch(() => undefined)
      setTimeout(() => void listen(), 5_000).unref()
    })
    try {
      await client.connect()
      await client.query(`LISTEN ${KEY_CHANGES_CHANNEL}`)
      listener = client
    } catch (error) {
      logger.debug({ err: error }, 'LISTEN unavailable; relying on the periodic read')
      await client.end().catch(() => undefined)
    }
  }
  await listen()

  return {
    async stop() {
      stopped = true
      clearInterval(timer)
      await reading
      await listener?.end().catch(() => undefined)
    },
  }
}
