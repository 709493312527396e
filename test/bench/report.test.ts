import { describe, expect, it } from 'vitest'
import { renderCostTable, renderMarkdown, renderSweepTable, renderTable } from '../../bench/lib/report.ts'
import { benchReport, measuredRow, skippedRow } from './fixtures.ts'

const report = () =>
  benchReport([
    measuredRow('pets-service', 'pets-service', { 1: [900, 1000, 1100], 10: [2000, 2500, 3000], 100: [3000, 3200, 3400, 3600, 4000] }),
    skippedRow('nginx', 'nginx reverse proxy (C ceiling)', 'nginx is not installed'),
  ])

describe('the bench report', () => {
  it('has a throughput column per level of connections with its min–max spread, the targets’ level marked', () => {
    const lines = renderSweepTable(report()).split('\n')
    expect(lines[0]).toBe(
      '| Target | 1 conn req/s | min–max (spread) | p99 ms | 10 conn req/s | min–max (spread) | p99 ms | 100 conn req/s (targets) | min–max (spread) | p99 ms |',
    )
    expect(lines[2]).toBe('| pets-service | 1,000 | 900–1,100 (20 %) | 5 | 2,500 | 2,000–3,000 (40 %) | 5 | 3,400 | 3,000–4,000 (29.4 %) | 5 |')
  })

  it('lists a skipped row as skipped, with why, in the tables that show every row', () => {
    expect(renderSweepTable(report()).split('\n')[3]).toBe(
      '| nginx reverse proxy (C ceiling) | skipped: nginx is not installed | – | – | – | – | – | – | – | – |',
    )
    const main = renderTable(report()).split('\n')[3] ?? ''
    expect(main.startsWith('| nginx reverse proxy (C ceiling) | `GET /v1/pets?limit=20` | skipped: nginx is not installed |')).toBe(true)
    expect(main.split('|')).toHaveLength(renderTable(report()).split('\n')[0]?.split('|').length ?? 0)
    expect(renderCostTable(report())).not.toContain('nginx')
    const markdown = renderMarkdown(report())
    expect(markdown).toContain('- nginx reverse proxy (C ceiling): skipped (nginx is not installed)')
    expect(markdown).toContain('![Throughput per row and open-loop latency](latest.svg)')
    expect(markdown).toContain('- Parameters: closed loop at 1, 10, 100 connections (pipelining 1); 5 rounds × 5 s per target at 100 connections, 3 rounds × 2 s at the other levels')
  })
})
