/**
 * `npm run bench:readme`: writes the last run's results (bench/results/latest.json) into README.md
 * between its bench:results markers (the Benchmark section), nothing else in the file changes.
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { REPO_ROOT } from '../lib/childServer.ts'
import { renderReadmeSection, replaceReadmeSection } from '../lib/readmeSection.ts'
import type { BenchReport } from '../lib/report.ts'

const resultsFile = path.join(REPO_ROOT, 'bench', 'results', 'latest.json')
// The full results are not committed (only latest.md and latest.svg): a fresh clone has none.
if (!existsSync(resultsFile)) {
  process.stderr.write('bench/results/latest.json not found: run `npm run bench` first; README.md left as it is\n')
  process.exit(1)
}
const report = JSON.parse(readFileSync(resultsFile, 'utf8')) as BenchReport
const readmeFile = path.join(REPO_ROOT, 'README.md')
writeFileSync(readmeFile, replaceReadmeSection(readFileSync(readmeFile, 'utf8'), renderReadmeSection(report)))
process.stderr.write(`README.md: Benchmark results from the run of ${report.startedAt}\n`)
