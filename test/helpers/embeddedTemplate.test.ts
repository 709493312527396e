import { existsSync, readdirSync } from 'node:fs'
import { rm } from 'node:fs/promises'
import type * as OsModule from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it, vi } from 'vitest'

// A temp folder of its own, to see what the helper leaves in it.
const tmp = vi.hoisted(() => {
  const fs = process.getBuiltinModule('node:fs')
  const os = process.getBuiltinModule('node:os')
  return fs.mkdtempSync(`${os.tmpdir()}/aas-template-test-`)
})
vi.mock('node:os', async (original) => {
  const actual = await original<typeof OsModule>()
  return { ...actual, default: { ...actual, tmpdir: () => tmp } }
})
vi.mock('../../scripts/lib/embeddedDatabase.ts', () => ({
  PGLITE_FOLDER: 'pglite',
  ensureDatabaseCreated: async () => {
    throw new Error('initdb failed')
  },
}))
const { removeEmbeddedTemplate, seedEmbeddedDatabase } = await import('./embeddedTemplate.ts')

afterAll(() => rm(tmp, { recursive: true, force: true }))

describe('seedEmbeddedDatabase', () => {
  it('leaves no template folder behind when the template could not be made', async () => {
    await expect(seedEmbeddedDatabase(path.join(tmp, 'data'))).rejects.toThrow('initdb failed')
    await removeEmbeddedTemplate()
    expect(existsSync(tmp) && readdirSync(tmp).filter((name) => name.startsWith('aas-pglite-template-'))).toEqual([])
  })
})
