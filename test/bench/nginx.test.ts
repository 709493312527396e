import { describe, expect, it } from 'vitest'
import { findNginx, nginxConfig, NGINX_FALLBACK_PATHS } from '../../bench/lib/nginx.ts'

const options = { directory: '/tmp/aas-bench-x/nginx', listenPort: 40123, upstream: '127.0.0.1:40124', prefix: '/v1/', upstreamKeepalive: 128 }

describe('the nginx row of the bench', () => {
  it('runs one foreground worker, no access log, everything it writes in its own folder', () => {
    const config = nginxConfig(options)
    expect(config).toMatch(/^daemon off;$/m)
    expect(config).toMatch(/^worker_processes 1;$/m)
    expect(config).toMatch(/^\s*access_log off;$/m)
    expect(config).toMatch(/^\s*listen 127\.0\.0\.1:40123;$/m)
    for (const line of config.split('\n').filter((candidate) => /(^pid|_log|_temp_path) /.test(candidate.trim()))) {
      if (line.includes('access_log off')) continue
      expect(line).toContain('/tmp/aas-bench-x/nginx/')
    }
  })

  it('keeps HTTP/1.1 connections to the upstream alive and maps /v1/ onto its root like the other proxy rows', () => {
    const config = nginxConfig({ ...options, prefix: '/v1' })
    expect(config).toMatch(/upstream bench_upstream \{\s+server 127\.0\.0\.1:40124;\s+keepalive 128;/)
    expect(config).toMatch(/location \/v1\/ \{\s+proxy_pass http:\/\/bench_upstream\/;\s+proxy_http_version 1\.1;\s+proxy_set_header Connection "";/)
  })

  it('is found through BENCH_NGINX, then PATH, then /usr/sbin; none means the row is skipped', () => {
    const installed = (files: string[]) => (file: string) => files.includes(file)
    expect(findNginx({ PATH: '/usr/bin:/opt/nginx/bin' }, installed(['/opt/nginx/bin/nginx', '/usr/sbin/nginx']))).toBe('/opt/nginx/bin/nginx')
    expect(findNginx({ PATH: '/usr/bin:/bin' }, installed(['/usr/sbin/nginx']))).toBe('/usr/sbin/nginx')
    expect(findNginx({ PATH: '/usr/bin', BENCH_NGINX: '/custom/nginx' }, installed(['/custom/nginx', '/usr/sbin/nginx']))).toBe('/custom/nginx')
    expect(findNginx({ PATH: '/usr/bin', BENCH_NGINX: '/missing/nginx' }, installed(['/usr/sbin/nginx']))).toBeUndefined()
    expect(findNginx({ PATH: '/usr/bin' }, installed([]))).toBeUndefined()
    expect(NGINX_FALLBACK_PATHS).toContain('/usr/sbin/nginx')
  })
})
