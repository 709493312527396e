import { defineConfig } from 'vitest/config'

// Unit tests need nothing running; integration tests talk to real Postgres (and later Redis)
// through the throwaway databases that test/helpers/postgres.ts creates and drops.
// CI asks for a JSON report beside the console one, to print a plain closing line.
const jsonReport = process.env.VITEST_JSON

export default defineConfig({
  test: {
    reporters: jsonReport ? ['default', 'json'] : ['default'],
    outputFile: jsonReport ? { json: jsonReport } : undefined,
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/**/*.test.ts'],
          exclude: ['test/**/*.int.test.ts'],
          sequence: { groupOrder: 0 },
        },
      },
      {
        test: {
          name: 'integration',
          include: ['test/**/*.int.test.ts'],
          globalSetup: ['test/helpers/globalSetup.ts'],
          testTimeout: 30_000,
          hookTimeout: 60_000,
          pool: 'forks',
          sequence: { groupOrder: 1 },
          maxWorkers: 2,
        },
      },
    ],
  },
})
