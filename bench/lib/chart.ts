/**
 * bench/results/latest.svg: the run as a picture, hand-written SVG (no browser, no library).
 *
 * - Top: closed-loop throughput per row, one bar per level of connections (median req/s), a
 *   whisker from the slowest to the fastest round, the median printed at the bar's end. Skipped
 *   rows say why.
 * - Below: open-loop latency per offered load, one line per row from p50 to p99.9 on a log scale
 *   (coordinated-omission corrected, medians over the rounds).
 */
import type { BenchReport, OpenLoopReport, TargetReport } from './report.ts'

const WIDTH = 980
const MARGIN = 16
const LABEL_WIDTH = 360
const VALUE_ROOM = 70
const PLOT_LEFT = MARGIN + LABEL_WIDTH
const PLOT_WIDTH = WIDTH - PLOT_LEFT - MARGIN - VALUE_ROOM
const BAR_HEIGHT = 11
const ROW_GAP = 9
const FONT = 'font-family="Helvetica, Arial, sans-serif"'

/** Fill per level of connections, light to dark; more levels reuse the last colour. */
const LEVEL_COLOURS = ['#9ecae1', '#4292c6', '#08519c', '#08306b']
/** Marker colours for p50, p90, p99, p99.9. */
const PERCENTILES: Array<{ name: string; pick: (s: TargetReport['summary']) => number | undefined; colour: string }> = [
  { name: 'p50', pick: (s) => s.medianLatencyP50, colour: '#31a354' },
  { name: 'p90', pick: (s) => s.medianLatencyP90, colour: '#fdae6b' },
  { name: 'p99', pick: (s) => s.medianLatencyP99, colour: '#e6550d' },
  { name: 'p99.9', pick: (s) => s.medianLatencyP999, colour: '#a50f15' },
]

export function escapeXml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;' })[c] as string)
}

const integer = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 })
const round1 = (value: number) => Math.round(value * 10) / 10

/** A round upper bound for a linear axis and its tick step (1, 2, 5 × 10ⁿ). */
export function niceScale(max: number, ticks = 5): { max: number; step: number } {
  if (!(max > 0) || !Number.isFinite(max)) return { max: 1, step: 0.2 }
  const rough = max / ticks
  const power = 10 ** Math.floor(Math.log10(rough))
  const step = ([1, 2, 5, 10].find((factor) => factor * power >= rough) ?? 10) * power
  return { max: Math.ceil(max / step) * step, step }
}

/** Log-axis ticks (1, 2, 5 × 10ⁿ) covering [min, max]. */
export function logTicks(min: number, max: number): number[] {
  const ticks: number[] = []
  const low = Math.floor(Math.log10(Math.max(min, 1e-3)))
  const high = Math.ceil(Math.log10(Math.max(max, min, 1e-3)))
  for (let power = low; power <= high; power += 1) {
    for (const factor of [1, 2, 5]) {
      const value = factor * 10 ** power
      ticks.push(Number(value.toPrecision(3)))
    }
  }
  const first = ticks.findLastIndex((tick) => tick <= min)
  const last = ticks.findIndex((tick) => tick >= max)
  return ticks.slice(Math.max(0, first), last === -1 ? ticks.length : last + 1)
}

function text(x: number, y: number, content: string, attributes = ''): string {
  const font = attributes.includes('font-family=') ? '' : ` ${FONT}`
  return `<text x="${round1(x)}" y="${round1(y)}"${font} ${attributes}>${escapeXml(content)}</text>`
}

function tickLabel(value: number): string {
  return value >= 1000 ? integer.format(value) : String(Number(value.toPrecision(3)))
}

function throughputPanel(report: BenchReport, top: number): { svg: string[]; height: number } {
  const rows = report.targets
  const levels = [...new Set(rows.flatMap((row) => (row.sweep ?? []).map((level) => level.connections)))].sort((a, b) => a - b)
  // Older reports (no sweep): the goal-level summary only.
  const levelsOf = (row: TargetReport) =>
    row.sweep && row.sweep.length > 0 ? row.sweep : row.rounds.length > 0 ? [{ connections: report.config.connections, summary: row.summary }] : []
  const shownLevels = levels.length > 0 ? levels : [report.config.connections]
  const maxRate = Math.max(0, ...rows.flatMap((row) => levelsOf(row).map((level) => level.summary.maxRequestsPerSecond)).filter(Number.isFinite))
  const scale = niceScale(maxRate)
  const x = (value: number) => PLOT_LEFT + (Math.max(0, value) / scale.max) * PLOT_WIDTH
  const svg: string[] = []
  svg.push(text(MARGIN, top + 16, 'Closed-loop throughput, req/s (median of the rounds; whisker: slowest–fastest round)', 'font-size="15" font-weight="bold"'))
  const legendY = top + 34
  let legendX = MARGIN
  for (const [index, connections] of shownLevels.entries()) {
    const colour = LEVEL_COLOURS[Math.min(index, LEVEL_COLOURS.length - 1)] as string
    const goal = connections === report.config.connections ? ' (targets)' : ''
    svg.push(`<rect x="${legendX}" y="${legendY - 9}" width="12" height="10" fill="${colour}"/>`)
    const label = `${connections} connection${connections === 1 ? '' : 's'}${goal}`
    svg.push(text(legendX + 16, legendY, label, 'font-size="12"'))
    legendX += 16 + label.length * 6.6 + 18
  }
  const plotTop = legendY + 14
  const rowHeight = Math.max(1, shownLevels.length) * BAR_HEIGHT + ROW_GAP
  const plotHeight = rows.length * rowHeight
  // Grid and axis labels.
  for (let tick = 0; tick <= scale.max + 1e-9; tick += scale.step) {
    const tx = x(tick)
    svg.push(`<line x1="${round1(tx)}" y1="${plotTop}" x2="${round1(tx)}" y2="${plotTop + plotHeight}" stroke="#e0e0e0"/>`)
    svg.push(text(tx, plotTop + plotHeight + 14, tickLabel(tick), 'font-size="11" text-anchor="middle" fill="#555"'))
  }
  for (const [rowIndex, row] of rows.entries()) {
    const rowTop = plotTop + rowIndex * rowHeight + ROW_GAP / 2
    const middle = rowTop + (shownLevels.length * BAR_HEIGHT) / 2 + 4
    svg.push(text(PLOT_LEFT - 8, middle, row.label, 'font-size="12" text-anchor="end"'))
    if (row.skipped !== undefined) {
      svg.push(text(PLOT_LEFT + 6, middle, `skipped: ${row.skipped}`, 'font-size="12" fill="#888" font-style="italic"'))
      continue
    }
    const byLevel = new Map(levelsOf(row).map((level) => [level.connections, level.summary]))
    for (const [index, connections] of shownLevels.entries()) {
      const summary = byLevel.get(connections)
      const y = rowTop + index * BAR_HEIGHT
      if (!summary || !Number.isFinite(summary.medianRequestsPerSecond)) continue
      const colour = LEVEL_COLOURS[Math.min(index, LEVEL_COLOURS.length - 1)] as string
      const end = x(summary.medianRequestsPerSecond)
      svg.push(
        `<rect x="${PLOT_LEFT}" y="${round1(y + 1)}" width="${round1(end - PLOT_LEFT)}" height="${BAR_HEIGHT - 2}" fill="${colour}">` +
          `<title>${escapeXml(`${row.label}, ${connections} connection${connections === 1 ? '' : 's'}: ${integer.format(summary.medianRequestsPerSecond)} req/s (${integer.format(summary.minRequestsPerSecond)}–${integer.format(summary.maxRequestsPerSecond)})`)}</title></rect>`,
      )
      const [low, high] = [x(summary.minRequestsPerSecond), x(summary.maxRequestsPerSecond)]
      const whiskerY = round1(y + BAR_HEIGHT / 2)
      svg.push(
        `<path d="M${round1(low)} ${whiskerY}H${round1(high)}M${round1(low)} ${whiskerY - 3}V${whiskerY + 3}M${round1(high)} ${whiskerY - 3}V${whiskerY + 3}" stroke="#222" stroke-width="1" fill="none"/>`,
      )
      svg.push(text(Math.max(end, high) + 4, y + BAR_HEIGHT - 2, integer.format(summary.medianRequestsPerSecond), 'font-size="10" fill="#333"'))
    }
  }
  svg.push(`<line x1="${PLOT_LEFT}" y1="${plotTop}" x2="${PLOT_LEFT}" y2="${plotTop + plotHeight}" stroke="#333"/>`)
  return { svg, height: plotTop + plotHeight + 24 - top }
}

function latencyPanel(report: BenchReport, top: number): { svg: string[]; height: number } {
  const phases: OpenLoopReport[] = report.openLoop ?? []
  const svg: string[] = []
  svg.push(
    text(MARGIN, top + 16, 'Open-loop latency (ms, log scale) at a fixed offered rate, coordinated-omission corrected', 'font-size="15" font-weight="bold"'),
  )
  if (phases.length === 0) {
    svg.push(text(MARGIN, top + 40, '(no open-loop phase in this run)', 'font-size="12" fill="#888"'))
    return { svg, height: 52 }
  }
  const legendY = top + 34
  let legendX = MARGIN
  for (const percentile of PERCENTILES) {
    svg.push(`<circle cx="${legendX + 5}" cy="${legendY - 4}" r="4.5" fill="${percentile.colour}"/>`)
    svg.push(text(legendX + 14, legendY, percentile.name, 'font-size="12"'))
    legendX += 14 + percentile.name.length * 7 + 18
  }
  const values = phases.flatMap((phase) =>
    phase.targets.flatMap((entry) => PERCENTILES.map((p) => p.pick(entry.summary)).filter((v): v is number => v !== undefined && Number.isFinite(v) && v > 0)),
  )
  const ticks = logTicks(Math.min(...values, 1), Math.max(...values, 1))
  const [lowTick, highTick] = [ticks[0] as number, ticks.at(-1) as number]
  const x = (value: number) =>
    PLOT_LEFT + ((Math.log10(Math.max(value, lowTick)) - Math.log10(lowTick)) / (Math.log10(highTick) - Math.log10(lowTick) || 1)) * PLOT_WIDTH
  const rowHeight = 18
  let y = legendY + 16
  const plotTop = y
  const rowsSvg: string[] = []
  for (const phase of phases) {
    rowsSvg.push(
      text(
        MARGIN,
        y + 12,
        `${Math.round(phase.load * 100)} % of ${labelOf(report, phase.baseline)}’s saturation rate: ${integer.format(phase.offeredRate)} req/s offered`,
        'font-size="12" font-weight="bold" fill="#333"',
      ),
    )
    y += 18
    for (const entry of phase.targets) {
      const middle = y + rowHeight / 2
      rowsSvg.push(text(PLOT_LEFT - 8, middle + 4, entry.label, 'font-size="12" text-anchor="end"'))
      const points = PERCENTILES.flatMap((p) => {
        const value = p.pick(entry.summary)
        return value === undefined || !Number.isFinite(value) ? [] : [{ ...p, value }]
      })
      if (points.length > 1) {
        rowsSvg.push(
          `<line x1="${round1(x((points[0] as { value: number }).value))}" y1="${middle}" x2="${round1(x((points.at(-1) as { value: number }).value))}" y2="${middle}" stroke="#999" stroke-width="2"/>`,
        )
      }
      for (const point of points) {
        rowsSvg.push(
          `<circle cx="${round1(x(point.value))}" cy="${middle}" r="4.5" fill="${point.colour}"><title>${escapeXml(`${entry.label}, ${point.name}: ${round1(point.value)} ms`)}</title></circle>`,
        )
      }
      const last = points.at(-1)
      if (last) rowsSvg.push(text(x(last.value) + 8, middle + 4, `p99 ${round1(entry.summary.medianLatencyP99)} ms`, 'font-size="10" fill="#333"'))
      y += rowHeight
    }
    y += 6
  }
  for (const tick of ticks) {
    const tx = round1(x(tick))
    svg.push(`<line x1="${tx}" y1="${plotTop}" x2="${tx}" y2="${y}" stroke="#e0e0e0"/>`)
    svg.push(text(tx, y + 14, tickLabel(tick), 'font-size="11" text-anchor="middle" fill="#555"'))
  }
  svg.push(...rowsSvg)
  return { svg, height: y + 24 - top }
}

function clip(content: string, length: number): string {
  return content.length > length ? `${content.slice(0, length - 1)}…` : content
}

function labelOf(report: BenchReport, id: string): string {
  return report.targets.find((target) => target.id === id)?.label ?? id
}

export function renderChart(report: BenchReport): string {
  const header = [
    text(MARGIN, 24, 'npm run bench', 'font-size="18" font-weight="bold"'),
    text(
      MARGIN,
      42,
      `${report.startedAt.slice(0, 16).replace('T', ' ')} UTC · ${report.environment.cpuModel}, ${report.environment.cores} cores, ` +
        `${report.environment.memoryGiB} GiB · Node ${report.environment.node} · load average ${report.environment.loadAverageAtStart} at start`,
      'font-size="11" fill="#555"',
    ),
    text(MARGIN, 57, clip(report.command, 140), 'font-size="11" fill="#555" font-family="monospace"'),
  ]
  const throughput = throughputPanel(report, 66)
  const latency = latencyPanel(report, 66 + throughput.height + 12)
  const height = Math.ceil(66 + throughput.height + 12 + latency.height + MARGIN)
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" viewBox="0 0 ${WIDTH} ${height}">`,
    `<rect width="${WIDTH}" height="${height}" fill="#fff"/>`,
    ...header,
    ...throughput.svg,
    ...latency.svg,
    '</svg>',
    '',
  ].join('\n')
}
