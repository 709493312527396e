import { readFileSync } from 'node:fs'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { README_END, README_START, renderReadmeSection, replaceReadmeSection } from '../../bench/lib/readmeSection.ts'
import { benchReport, measuredRow, openLoopPhase, skippedRow } from './fixtures.ts'

const report = () => ({
  ...benchReport(
    [
      measuredRow('http-proxy', 'bare @fastify/http-proxy', { 1: [900, 1000, 1100], 10: [2000, 2500, 3000], 100: [3000, 3200, 3400, 3600, 4000] }),
      skippedRow('nginx', 'nginx reverse proxy (C ceiling)', 'nginx is not installed'),
      measuredRow('gateway', 'gateway, admitted', { 1: [500, 600, 700], 10: [1200, 1300, 1400], 100: [1500, 1600, 1700, 1800, 1900] }),
    ],
    [openLoopPhase(0.5, 1700, [{ id: 'http-proxy', label: 'bare @fastify/http-proxy', p50: 1.24, p90: 2, p99: 4.56, p999: 9 }])],
  ),
  goals: [
    { kind: 'throughput' as const, subject: 'gateway', baseline: 'http-proxy', minRatio: 0.9, ratio: 0.5, met: false, cpuRatio: 0.95, metByCpu: true, noisy: [] },
    { kind: 'throughput' as const, subject: 'gateway', baseline: 'http-proxy', minRatio: 1.5, ratio: 0.5, met: false, cpuRatio: 0.6, metByCpu: false, noisy: [] },
  ],
})

describe('the README benchmark results', () => {
  it('name the command, the machine and the date, show the chart, and give req/s at every level of connections', () => {
    const section = renderReadmeSection(report())
    expect(section).not.toContain('short run')
    expect(section).toContain('Last run: `npm run bench`, 2026-11-22 05:00 UTC, Node 20.20.2, 2 × Test CPU, 8 GiB, commit abc1234.')
    expect(section).toContain('![Throughput per row at 1, 10 and 100 connections, and open-loop latency per offered load](bench/results/latest.svg)')
    expect(section).toContain('| row | req/s at 1 / 10 / 100 connections | spread at 100 | server CPU µs/req | Redis commands/req |')
    expect(section).toContain('| bare @fastify/http-proxy | 1,000 / 2,500 / 3,400 | 29 % | 200 | – |')
    expect(section).toContain('| nginx reverse proxy (C ceiling) | skipped: nginx is not installed | – | – | – |')
    expect(section).toContain('| bare @fastify/http-proxy | 1.2 / 4.6 |')
  })

  it('say so when the run was shorter than a full one', () => {
    const quick = report()
    quick.config = { ...quick.config, rounds: 2, durationSeconds: 2 }
    expect(renderReadmeSection(quick)).toContain('**This was a short run**')
  })

  it('split the targets into met (by req/s or by CPU per request) and missed', () => {
    const section = renderReadmeSection(report())
    const [metPart, missedPart] = section.split('**Targets missed:**')
    expect(metPart).toContain('- gateway, admitted ≥ 0.9× bare @fastify/http-proxy: 0.50× by req/s, 0.95× by server CPU per request')
    expect(missedPart).toContain('- gateway, admitted ≥ 1.5× bare @fastify/http-proxy: 0.50× by req/s, 0.60× by server CPU per request')
  })

  it('replace only the text between the markers, and the repository README has them', () => {
    const readme = `# Title\n\n## Benchmark\n\nintro\n\n${README_START}\nold table\n${README_END}\n\nafter\n`
    expect(replaceReadmeSection(readme, 'new table')).toBe(`# Title\n\n## Benchmark\n\nintro\n\n${README_START}\nnew table\n${README_END}\n\nafter\n`)
    expect(() => replaceReadmeSection('# no markers', 'x')).toThrow(/markers/)
    const repositoryReadme = readFileSync(path.resolve(import.meta.dirname, '../../README.md'), 'utf8')
    expect(() => replaceReadmeSection(repositoryReadme, 'x')).not.toThrow()
  })
})
