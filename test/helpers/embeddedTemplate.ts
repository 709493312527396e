import { cp, mkdir, mkdtemp, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { PGLITE_FOLDER, ensureDatabaseCreated } from '../../scripts/lib/embeddedDatabase.ts'

let template: Promise<string> | undefined

/**
 * Gives `dataDir` the embedded database npm start's first start creates (PGlite's initdb, made
 * once per test file and copied): for the tests whose subject comes after that first start, each
 * of which would otherwise spend 5-7 s of CPU in initdb. The start that follows finds a database
 * without tables or keys, so it still migrates and issues the demo key. Tests of the first start
 * itself begin from a missing or empty folder instead.
 */
export async function seedEmbeddedDatabase(dataDir: string): Promise<void> {
  template ??= (async () => {
    const parent = await mkdtemp(path.join(os.tmpdir(), 'aas-pglite-template-'))
    try {
      await ensureDatabaseCreated(path.join(parent, PGLITE_FOLDER))
    } catch (error) {
      // removeEmbeddedTemplate finds no folder in a rejected template: removed here, or left behind.
      await rm(parent, { recursive: true, force: true })
      throw error
    }
    return parent
  })()
  const from = path.join(await template, PGLITE_FOLDER)
  await mkdir(dataDir, { recursive: true, mode: 0o700 })
  await cp(from, path.join(dataDir, PGLITE_FOLDER), { recursive: true })
}

/** Removes the copy's original, if this file made one (an afterAll). */
export async function removeEmbeddedTemplate(): Promise<void> {
  if (!template) return
  const parent = await template.catch(() => undefined)
  template = undefined
  if (parent) await rm(parent, { recursive: true, force: true })
}
