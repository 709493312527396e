import { readFileSync } from 'node:fs'
import { describe, expect, it } from 'vitest'
import { parseGatewayConfig, resolveGatewayConfig } from '../../gateway/src/config/loadConfig.ts'
import { shutdownAfterDrainMillis } from '../../gateway/src/proxy/upstreamProxy.ts'

const shipped = readFileSync('config/gateway.yaml', 'utf8')

describe("the gateway's shutdown deadline after its drain", () => {
  // A request let in at the drain's end may wait timeoutSeconds for its answer's headers and as
  // long again for its body: forced out at a fixed 15 s, it was cut off unanswered, exit 1.
  it('gives a request let in at the end of the drain both of its upstream bounds, then the closes: 25 s with the shipped 10 s', () => {
    const config = resolveGatewayConfig(parseGatewayConfig(shipped), {})
    expect(config.upstreams.pets.timeoutMillis).toBe(10_000)
    expect(shutdownAfterDrainMillis(config.upstreams)).toBe(25_000)
  })

  it('follows the slowest upstream, and is never under 15 s', () => {
    const upstream = (timeoutMillis: number) => ({ url: 'http://127.0.0.1:1', timeoutMillis, maxInFlight: 1 })
    expect(shutdownAfterDrainMillis({ pets: upstream(10_000), orders: upstream(60_000) })).toBe(125_000)
    expect(shutdownAfterDrainMillis({ pets: upstream(500) })).toBe(15_000)
  })
})
