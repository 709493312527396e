/* global URL */
// Module resolve hook for swapModules.mjs: resolved file URL of a swapped module → its replacement.
const root = new URL('../../', import.meta.url)
const swaps = new Map()

export function initialize(data) {
  for (const pair of String(data).split(',').filter(Boolean)) {
    const [from, to] = pair.split('=')
    swaps.set(new URL(from, root).href, new URL(to, root).href)
  }
}

export async function resolve(specifier, context, nextResolve) {
  const resolved = await nextResolve(specifier, context)
  const replacement = swaps.get(resolved.url)
  return replacement === undefined ? resolved : { ...resolved, url: replacement }
}
