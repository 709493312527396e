import { chmodSync, mkdtempSync, rmSync, statSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { afterEach, describe, expect, it } from 'vitest'
import { claimDataDirectory, ownerRecord, releaseDataDirectory } from '../../scripts/lib/embeddedDatabase.ts'

describe("npm start's data folder", () => {
  const made: string[] = []
  afterEach(() => {
    for (const directory of made.splice(0)) rmSync(directory, { recursive: true, force: true })
  })

  it('is made private to its user (0700) when it already exists open to others, as PGlite writes most files 0666', async () => {
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'aas-data-'))
    made.push(dataDir)
    chmodSync(dataDir, 0o755)
    await claimDataDirectory(dataDir, ownerRecord('postgres://postgres@127.0.0.1:1/postgres'))
    try {
      expect(statSync(dataDir).mode & 0o777).toBe(0o700)
    } finally {
      releaseDataDirectory(dataDir)
    }
  })
})
