/**
 * `npm run bench:readme`: writes the last run's results (bench/results/latest.json) into README.md
 * between its bench:results markers (the Benchmark section), nothing else in the file changes.
 */
import { readFileSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { REPO_ROOT } from '../lib/childServer.ts'
import { renderReadmeSection, replaceReadmeSection } from '../lib/readmeSection.ts'
import type { BenchReport } from '../lib/report.ts'

const report = JSON.parse(readFileSync(path.join(REPO_ROOT, 'bench', 'results', 'latest.json'), 'utf8')) as BenchReport
const readmeFile = path.join(REPO_ROOT, 'README.md')
writeFileSync(readmeFile, replaceReadmeSection(readFileSync(readmeFile, 'utf8'), renderReadmeSection(report)))
process.stderr.write(`README.md: Benchmark results from the run of ${report.startedAt}\n`)
