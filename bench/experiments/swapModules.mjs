// node --import ./bench/experiments/swapModules.mjs …: with BENCH_MODULE_SWAPS="a.ts=b.ts,…" (paths
// from the repository root), every import of a.ts loads b.ts instead. Used by the experiment rows
// (bench/targets/gateway.ts) to run the gateway with one module replaced, nothing else changed.
import { register } from 'node:module'
import process from 'node:process'

register('./swapModulesHooks.mjs', import.meta.url, { data: process.env.BENCH_MODULE_SWAPS ?? '' })
