import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { chromium, type BrowserContext } from 'playwright-core'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startGateway } from '../helpers/gateway.ts'
import { startPetsService } from '../helpers/petsService.ts'
import { suiteService } from '../helpers/suiteService.ts'
import { suiteDatabase } from '../helpers/testDatabase.ts'

/** Debian's chromium; .ci/run installs it when missing. */
const CHROMIUM = '/usr/bin/chromium'
const SCREENSHOT = 'test-results/docs-page.png'
const available = existsSync(CHROMIUM)
const title = available
  ? 'renders the three operations offline in headless Chromium, and Try it out reaches the gateway'
  : `SKIPPED: ${CHROMIUM} not found (apt-get install -y --no-install-recommends chromium; .ci/run does it)`
if (!available) console.warn(`docs page test skipped: ${CHROMIUM} not found`)

describe.skipIf(!available)('the /docs page in a browser', () => {
  const database = suiteDatabase()
  const pets = suiteService(() => startPetsService(database.url))
  const gateway = suiteService(() => startGateway({ databaseUrl: database.url, petsUrl: pets.url }))
  let profile: string
  let browser: BrowserContext | undefined

  beforeAll(async () => {
    profile = mkdtempSync(path.join(tmpdir(), 'aas-chromium-'))
    browser = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
    })
  })
  afterAll(async () => {
    await browser?.close()
    if (profile) rmSync(profile, { recursive: true, force: true })
  })

  it(title, async () => {
    const origin = new URL(gateway.url).origin
    // The page must need nothing but the gateway: any other request is refused and remembered.
    const elsewhere: string[] = []
    await browser!.route('**/*', async (route) => {
      const url = route.request().url()
      if (url.startsWith(`${origin}/`) || url.startsWith('data:')) return route.continue()
      elsewhere.push(url)
      return route.abort('blockedbyclient')
    })
    const page = await browser!.newPage()
    const problems: string[] = []
    page.on('console', (message) => {
      if (message.type() === 'error') problems.push(message.text())
    })
    page.on('pageerror', (error) => problems.push(error.message))

    await page.goto(`${gateway.url}/docs`)
    for (const operationId of ['listPets', 'createPet', 'getPet']) {
      await page.locator(`#operations-animals-${operationId}`).waitFor({ state: 'visible', timeout: 15_000 })
    }
    await expect(page.locator('#operations-animals-getPet.opblock-deprecated').count()).resolves.toBe(1)
    await expect(page.locator('.info .title').innerText()).resolves.toContain('Animal Adoption Store API')

    mkdirSync(path.dirname(SCREENSHOT), { recursive: true })
    await page.screenshot({ path: SCREENSHOT, fullPage: true })

    // Interactive: with a key, "Try it out" on listPets calls this gateway and shows its answer.
    const { key } = await gateway.createKey()
    await page.evaluate(
      (value) => (globalThis as unknown as { ui: { preauthorizeApiKey(name: string, value: string): void } }).ui.preauthorizeApiKey('bearerAuth', value),
      key,
    )
    await page.locator('#operations-animals-listPets .opblock-summary-control').click()
    await page.locator('#operations-animals-listPets .try-out__btn').click()
    await page.locator('#operations-animals-listPets .execute').click()
    const status = page.locator('#operations-animals-listPets .live-responses-table tbody .response-col_status').first()
    await status.waitFor({ timeout: 10_000 })
    await expect(status.innerText()).resolves.toContain('200')

    expect(elsewhere).toEqual([])
    expect(problems).toEqual([])
  })
})
