/**
 * Summarises a V8 .cpuprofile (from BENCH_NODE_ARGS="--cpu-prof --cpu-prof-dir=DIR"):
 * self time by package, top functions by self time, and inclusive time of the heaviest
 * frames. The profile covers the whole process (start-up included); with --requests N (the
 * responses that process served, from bench/results/latest.json) times are also shown per request.
 *
 * Usage: tsx bench/tools/summarizeProfile.ts FILE.cpuprofile [--top 25] [--requests N] [--match TEXT] [--skip S]
 *          [--timeline] [--group 'logging=pino|sonic-boom' --group 'pg=/pg(-pool|-protocol)?/' …]
 */
import { readFileSync } from 'node:fs'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { REPO_ROOT } from '../lib/childServer.ts'

interface CallFrame {
  functionName: string
  url: string
  lineNumber: number
}
interface ProfileNode {
  id: number
  callFrame: CallFrame
  children?: number[]
}
interface Profile {
  nodes: ProfileNode[]
  samples: number[]
  timeDeltas: number[]
  startTime: number
  endTime: number
}

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    top: { type: 'string', default: '25' },
    requests: { type: 'string' },
    match: { type: 'string' },
    /** Ignore the first S seconds of the profile (start-up: module loading, migrations). */
    skip: { type: 'string', default: '0' },
    /** Print busy time per half second first (to see where start-up ends and load begins). */
    timeline: { type: 'boolean', default: false },
    /**
     * "label=regex", repeatable: each busy sample goes to the first group whose regex matches any
     * frame of its stack ("name file:line"), else to "other". Order the groups by precedence.
     */
    group: { type: 'string', multiple: true, default: [] },
  },
})
const file = positionals[0]
if (!file) {
  console.error(
    'usage: tsx bench/tools/summarizeProfile.ts FILE.cpuprofile [--top 25] [--requests N] [--match TEXT] [--skip S]',
  )
  process.exit(2)
}
const top = Number(values.top)
const requests = values.requests === undefined ? undefined : Number(values.requests)
const filter = values.match
const skipMicros = Number(values.skip) * 1e6
const profile = JSON.parse(readFileSync(file, 'utf8')) as Profile

const byId = new Map(profile.nodes.map((node) => [node.id, node]))
const parent = new Map<number, number>()
for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id)

function packageOf(frame: CallFrame): string {
  const { url, functionName } = frame
  if (!url) return functionName.startsWith('(') ? functionName : '(native)'
  const modules = url.lastIndexOf('/node_modules/')
  if (modules >= 0) {
    const rest = url.slice(modules + '/node_modules/'.length).split('/')
    return rest[0]?.startsWith('@') ? `${rest[0]}/${rest[1]}` : (rest[0] ?? url)
  }
  if (url.startsWith('node:')) return 'node:internal'
  return url.startsWith(repoUrl) ? url.slice(repoUrl.length).split('/').slice(0, 2).join('/') : url
}

const repoUrl = `${pathToFileURL(REPO_ROOT).href}/`
const shortUrl = (url: string) => url.replace(/^.*\/node_modules\//, '').replace(repoUrl, '')
const label = (frame: CallFrame) =>
  `${frame.functionName || '(anonymous)'} ${shortUrl(frame.url)}:${frame.lineNumber + 1}`

const groups = (values.group ?? []).map((spec) => {
  const at = spec.indexOf('=')
  if (at <= 0) throw new Error(`--group wants label=regex, got ${spec}`)
  return { label: spec.slice(0, at), pattern: new RegExp(spec.slice(at + 1)) }
})
const byGroup = new Map<string, number>(groups.map((group) => [group.label, 0]))

const selfByPackage = new Map<string, number>()
const selfByFunction = new Map<string, number>()
const inclusive = new Map<string, number>()
let total = 0
let idle = 0
let elapsed = 0
profile.samples.forEach((id, index) => {
  const delta = profile.timeDeltas[index] ?? 0
  elapsed += delta
  const node = byId.get(id)
  if (!node || elapsed < skipMicros) return
  total += delta
  if (node.callFrame.functionName === '(idle)') {
    idle += delta
    return
  }
  const pkg = packageOf(node.callFrame)
  selfByPackage.set(pkg, (selfByPackage.get(pkg) ?? 0) + delta)
  const name = label(node.callFrame)
  selfByFunction.set(name, (selfByFunction.get(name) ?? 0) + delta)
  const seen = new Set<string>()
  for (let current: number | undefined = id; current !== undefined; current = parent.get(current)) {
    const frame = byId.get(current)?.callFrame
    if (!frame) break
    const key = label(frame)
    if (seen.has(key)) continue
    seen.add(key)
    inclusive.set(key, (inclusive.get(key) ?? 0) + delta)
  }
  if (groups.length > 0) {
    const stack = [...seen]
    const group = groups.find(({ pattern }) => stack.some((frame) => pattern.test(frame)))?.label ?? 'other'
    byGroup.set(group, (byGroup.get(group) ?? 0) + delta)
  }
})

if (values.timeline) {
  const buckets: number[] = []
  let at = 0
  profile.samples.forEach((id, index) => {
    at += profile.timeDeltas[index] ?? 0
    const bucket = Math.floor(at / 500_000)
    buckets[bucket] ??= 0
    if (byId.get(id)?.callFrame.functionName !== '(idle)') buckets[bucket] += profile.timeDeltas[index] ?? 0
  })
  console.log('busy per 0.5 s:')
  console.log(
    Array.from(buckets, (micros, index) => `${(index / 2).toFixed(1)}s:${Math.round((micros ?? 0) / 5000)}%`).join(' '),
  )
}

const busy = total - idle
const ms = (micros: number) => `${(micros / 1000).toFixed(0).padStart(7)} ms`
const pct = (micros: number) =>
  `${((micros / busy) * 100).toFixed(1).padStart(5)} %` +
  (requests ? `${(micros / requests).toFixed(1).padStart(8)} µs/req` : '')
const print = (title: string, entries: Map<string, number>, count: number) => {
  console.log(`\n${title}`)
  ;[...entries]
    .filter(([name]) => !filter || name.includes(filter))
    .sort((a, b) => b[1] - a[1])
    .slice(0, count)
    .forEach(([name, micros]) => console.log(`${ms(micros)} ${pct(micros)}  ${name}`))
}

console.log(`${file}\nprofiled ${ms(total)}, busy (not idle) ${ms(busy)} ${pct(busy)}; percentages are of busy time`)
if (groups.length > 0) print('Busy time by group (first matching group wins)', byGroup, groups.length + 1)
print('Self time by package', selfByPackage, top)
print('Self time by function', selfByFunction, top)
print('Inclusive time by function', inclusive, top * 2)
