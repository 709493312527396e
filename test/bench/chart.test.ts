import { execFileSync, spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { logTicks, niceScale, renderChart } from '../../bench/lib/chart.ts'
import { benchReport, measuredRow, openLoopPhase, skippedRow } from './fixtures.ts'

/** Tags balance, no attribute twice on one element, no raw `<` or stray `&` in text: what an XML parser insists on. */
function wellFormedProblems(svg: string): string[] {
  const problems: string[] = []
  const stack: string[] = []
  const tokens = svg.split(/(<[^>]*>)/)
  for (const token of tokens) {
    if (!token.startsWith('<')) {
      if (token.includes('<') || /&(?!(amp|lt|gt|quot|apos);)/.test(token)) problems.push(`bad text: ${token}`)
      continue
    }
    const name = /^<\/?([a-zA-Z]+)/.exec(token)?.[1]
    if (!name) {
      problems.push(`bad tag: ${token}`)
      continue
    }
    const attributes = [...token.matchAll(/\s([a-zA-Z:-]+)="[^"]*"/g)].map((match) => match[1])
    if (new Set(attributes).size !== attributes.length) problems.push(`duplicate attribute: ${token}`)
    if (token.startsWith('</')) {
      if (stack.pop() !== name) problems.push(`unbalanced </${name}>`)
    } else if (!token.endsWith('/>')) stack.push(name)
  }
  if (stack.length > 0) problems.push(`unclosed: ${stack.join(', ')}`)
  return problems
}

function report() {
  return benchReport(
    [
      measuredRow('pets-service', 'pets-service', { 1: [900, 1000, 1100], 10: [2000, 2500, 3000], 100: [3000, 3200, 3400, 3600, 4000] }),
      skippedRow('nginx', 'nginx reverse proxy (C ceiling)', 'nginx is not installed'),
      measuredRow('peer', 'peer: bearer <Map> & @fastify/rate-limit', { 1: [500, 600, 700], 10: [1200, 1300, 1400], 100: [1500, 1600, 1700, 1800, 1900] }),
    ],
    [
      openLoopPhase(0.25, 1000, [{ id: 'peer', label: 'peer: bearer <Map> & @fastify/rate-limit', p50: 0.8, p90: 1.5, p99: 4, p999: 12 }]),
      openLoopPhase(0.75, 3000, [{ id: 'peer', label: 'peer: bearer <Map> & @fastify/rate-limit', p50: 2, p90: 9, p99: 40, p999: 120 }]),
    ],
  )
}

function barsOf(svg: string): Array<{ width: number; title: string }> {
  return [...svg.matchAll(/<rect x="[\d.]+" y="[\d.]+" width="([\d.]+)" height="\d+" fill="#[0-9a-f]+"><title>([^<]*)<\/title>/g)].map((match) => ({
    width: Number(match[1]),
    title: match[2] as string,
  }))
}

describe('the bench chart (bench/results/latest.svg)', () => {
  it('is well-formed SVG with every label escaped', () => {
    const svg = renderChart(report())
    expect(svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).toBe(true)
    expect(wellFormedProblems(svg)).toEqual([])
    expect(svg).toContain('peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit')
  })

  it('draws one bar per row and level of connections, as long as its median, with a whisker from the slowest to the fastest round', () => {
    const svg = renderChart(report())
    const bars = barsOf(svg)
    expect(bars.map((bar) => bar.title)).toEqual([
      'pets-service, 1 connection: 1,000 req/s (900–1,100)',
      'pets-service, 10 connections: 2,500 req/s (2,000–3,000)',
      'pets-service, 100 connections: 3,400 req/s (3,000–4,000)',
      'peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit, 1 connection: 600 req/s (500–700)',
      'peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit, 10 connections: 1,300 req/s (1,200–1,400)',
      'peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit, 100 connections: 1,700 req/s (1,500–1,900)',
    ])
    const [petsAt100, peerAt100] = [bars[2]?.width ?? 0, bars[5]?.width ?? 0]
    expect(petsAt100 / peerAt100).toBeCloseTo(3400 / 1700, 2)
    // The whisker of pets-service at 100 connections: from 3,000 to 4,000 on the same scale as the bars.
    const whiskers = [...svg.matchAll(/<path d="M([\d.]+) [\d.]+H([\d.]+)/g)].map((match) => [Number(match[1]), Number(match[2])])
    expect(whiskers).toHaveLength(6)
    const [low, high] = whiskers[2] as [number, number]
    const left = Number(/<rect x="([\d.]+)" y="[\d.]+" width="[\d.]+" height="\d+" fill="#[0-9a-f]+"><title>/.exec(svg)?.[1])
    expect((high - left) / (low - left)).toBeCloseTo(4000 / 3000, 2)
    expect((high - left) / petsAt100).toBeCloseTo(4000 / 3400, 2)
  })

  it('names a skipped row and why, with no bar', () => {
    const svg = renderChart(report())
    expect(svg).toContain('nginx reverse proxy (C ceiling)</text>')
    expect(svg).toContain('skipped: nginx is not installed')
    expect(barsOf(svg).some((bar) => bar.title.startsWith('nginx'))).toBe(false)
  })

  it('plots p50, p90, p99 and p99.9 per open-loop row and load on a log axis covering them all', () => {
    const svg = renderChart(report())
    const points = [...svg.matchAll(/<circle cx="([\d.]+)" cy="[\d.]+" r="4.5" fill="#[0-9a-f]+"><title>([^<]*)<\/title>/g)].map((match) => ({
      x: Number(match[1]),
      title: match[2],
    }))
    expect(points.map((point) => point.title)).toEqual([
      'peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit, p50: 0.8 ms',
      'peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit, p90: 1.5 ms',
      'peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit, p99: 4 ms',
      'peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit, p99.9: 12 ms',
      'peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit, p50: 2 ms',
      'peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit, p90: 9 ms',
      'peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit, p99: 40 ms',
      'peer: bearer &lt;Map&gt; &amp; @fastify/rate-limit, p99.9: 120 ms',
    ])
    // Log scale: 4 → 40 ms is as far as 12 → 120 ms.
    const x = points.map((point) => point.x)
    expect((x[6] as number) - (x[2] as number)).toBeCloseTo((x[7] as number) - (x[3] as number), 0)
    expect(svg).toContain('25 % of http-proxy’s saturation rate: 1,000 req/s offered')
    expect(svg).toContain('75 % of http-proxy’s saturation rate: 3,000 req/s offered')
  })

  it('says so when the run had no open-loop phase', () => {
    const svg = renderChart({ ...report(), openLoop: [] })
    expect(svg).toContain('(no open-loop phase in this run)')
    expect(wellFormedProblems(svg)).toEqual([])
  })

  it('picks round axis ticks', () => {
    expect(niceScale(13_876)).toEqual({ max: 15_000, step: 5_000 })
    expect(niceScale(4_000)).toEqual({ max: 4_000, step: 1_000 })
    expect(niceScale(0)).toEqual({ max: 1, step: 0.2 })
    expect(logTicks(0.8, 120)).toEqual([0.5, 1, 2, 5, 10, 20, 50, 100, 200])
    expect(logTicks(1, 10)).toEqual([1, 2, 5, 10])
  })

  const rsvg = spawnSync('rsvg-convert', ['--version']).status === 0
  it.skipIf(!rsvg)('renders to a PNG with librsvg (skipped when rsvg-convert is not installed)', () => {
    const directory = mkdtempSync(path.join(os.tmpdir(), 'aas-bench-chart-'))
    try {
      const svgFile = path.join(directory, 'chart.svg')
      writeFileSync(svgFile, renderChart(report()))
      execFileSync('rsvg-convert', ['-o', path.join(directory, 'chart.png'), svgFile], { stdio: 'pipe' })
      const png = readFileSync(path.join(directory, 'chart.png'))
      expect(png.subarray(1, 4).toString()).toBe('PNG')
      expect(png.readUInt32BE(16)).toBe(980) // width from the IHDR chunk
    } finally {
      rmSync(directory, { recursive: true, force: true })
    }
  })
})
