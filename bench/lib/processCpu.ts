import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'

let ticksPerSecond: number | undefined

function clockTicks(): number {
  if (ticksPerSecond === undefined) {
    try {
      ticksPerSecond = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100
    } catch {
      ticksPerSecond = 100
    }
  }
  return ticksPerSecond
}

/**
 * User + system CPU seconds a process has used so far (Linux /proc), or undefined elsewhere.
 * CPU per request is steadier than req/s on a shared or busy machine.
 */
export function processCpuSeconds(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // Fields after "(comm)": state is field 3, utime 14, stime 15.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    const utime = Number(fields[11])
    const stime = Number(fields[12])
    if (!Number.isFinite(utime) || !Number.isFinite(stime)) return undefined
    return (utime + stime) / clockTicks()
  } catch {
    return undefined
  }
}

/** Sum over the processes; undefined when any of them cannot be read. */
export function totalCpuSeconds(pids: number[]): number | undefined {
  let total = 0
  for (const pid of pids) {
    const seconds = processCpuSeconds(pid)
    if (seconds === undefined) return undefined
    total += seconds
  }
  return pids.length > 0 ? total : undefined
}

/**
 * Busy CPU seconds of the whole machine so far, summed over cores (Linux /proc/stat: user, nice,
 * system, irq, softirq, steal), or undefined elsewhere. Against the benchmark's own processes it
 * shows how much of the machine something else (or the kernel's softirq work) was using.
 */
export function machineBusyCpuSeconds(): number | undefined {
  try {
    const line = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0] ?? ''
    const [label, user, nice, system, , , irq, softirq, steal] = line.trim().split(/\s+/)
    if (label !== 'cpu') return undefined
    const busy = [user, nice, system, irq, softirq, steal].reduce((sum, field) => sum + Number(field ?? 0), 0)
    return Number.isFinite(busy) ? busy / clockTicks() : undefined
  } catch {
    return undefined
  }
}
