import { defineConfig } from 'vitest/config'

// Unit tests need nothing running; integration tests talk to real Postgres (and later Redis)
// through the throwaway databases that test/helpers/postgres.ts creates and drops.
// CI asks for a JSON report beside the console one, to print a plain closing line.
const jsonReport = process.env.VITEST_JSON

// Unit test files that call vi.mock.
const mockingModules = ['test/helpers/embeddedTemplate.test.ts']

export default defineConfig({
  test: {
    reporters: jsonReport ? ['default', 'json'] : ['default'],
    outputFile: jsonReport ? { json: jsonReport } : undefined,
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/**/*.test.ts'],
          exclude: ['test/**/*.int.test.ts', ...mockingModules],
          // Unit files share one module graph per worker: loading it again for each of 50 files
          // cost more than all their tests. A file that replaces a module (vi.mock) gets its own.
          isolate: false,
          sequence: { groupOrder: 0 },
        },
      },
      {
        test: {
          name: 'unit-mocking',
          include: mockingModules,
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
          // One process per worker for all its files (each file still makes its own databases,
          // servers and processes, and stops them): starting a process and importing the
          // gateway's graph anew for each of 67 files left the workers idle for about a sixth of
          // the run.
          isolate: false,
          sequence: { groupOrder: 1 },
          // Three files at a time on two cores: most of an integration file's time is spent
          // waiting (timeouts the tests hold the services to, signals, restarts), and two left the
          // CPU idle for over half the run. The suite passes with a third process spinning on a
          // core beside it; on a slower machine, INTEGRATION_WORKERS=2 npm test.
          maxWorkers: Number(process.env.INTEGRATION_WORKERS) || 3,
        },
      },
    ],
  },
})
