import { accessSync, constants, readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'

/** Where nginx is looked for after BENCH_NGINX and PATH (Debian and Ubuntu put it in /usr/sbin). */
export const NGINX_FALLBACK_PATHS = ['/usr/sbin/nginx', '/usr/local/sbin/nginx', '/usr/local/nginx/sbin/nginx']

function executable(file: string): boolean {
  try {
    accessSync(file, constants.X_OK)
    return true
  } catch {
    return false
  }
}

/**
 * The nginx binary to run: BENCH_NGINX when set (an empty or missing file means none), else the
 * first `nginx` on PATH, else the usual sbin locations (not on a normal user's PATH). Undefined
 * when nginx is not installed: the row is then reported as skipped.
 */
export function findNginx(env: NodeJS.ProcessEnv = process.env, isExecutable: (file: string) => boolean = executable): string | undefined {
  if (env.BENCH_NGINX !== undefined && env.BENCH_NGINX !== '') return isExecutable(env.BENCH_NGINX) ? env.BENCH_NGINX : undefined
  const fromPath = (env.PATH ?? '')
    .split(path.delimiter)
    .filter(Boolean)
    .map((directory) => path.join(directory, 'nginx'))
  return [...fromPath, ...NGINX_FALLBACK_PATHS].find((file) => isExecutable(file))
}

export interface NginxConfigOptions {
  /** A private folder: pid file, error log, temp paths. */
  directory: string
  listenPort: number
  /** host:port of the upstream. */
  upstream: string
  /** Public path prefix mapped onto the upstream's root, like the gateway's /v1/pets → /pets. */
  prefix: string
  /** Idle keep-alive connections kept to the upstream (per worker). */
  upstreamKeepalive: number
}

/**
 * nginx as a plain reverse proxy, the C ceiling for the proxy rows: one worker, no access log,
 * HTTP/1.1 with keep-alive to the upstream, `prefix` → `/` like the other rows' mapping, client
 * keep-alive long enough that no run reconnects. Everything it writes stays in `directory`; it
 * runs in the foreground (`daemon off`) so the harness owns the process.
 */
export function nginxConfig(options: NginxConfigOptions): string {
  const dir = options.directory
  const prefix = options.prefix.endsWith('/') ? options.prefix : `${options.prefix}/`
  return `# Written by bench/lib/nginx.ts for one benchmark run.
daemon off;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;

events {
    worker_connections 4096;
}

http {
    access_log off;
    client_body_temp_path ${dir}/client_body;
    proxy_temp_path ${dir}/proxy;
    fastcgi_temp_path ${dir}/fastcgi;
    uwsgi_temp_path ${dir}/uwsgi;
    scgi_temp_path ${dir}/scgi;
    keepalive_timeout 75s;
    keepalive_requests 1000000;

    upstream bench_upstream {
        server ${options.upstream};
        keepalive ${options.upstreamKeepalive};
        keepalive_requests 1000000;
    }

    server {
        listen 127.0.0.1:${options.listenPort};

        location ${prefix} {
            proxy_pass http://bench_upstream/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
`
}

/** Pids of the processes whose parent is `parent` (nginx's workers under its master), from /proc. */
export function childPids(parent: number): number[] {
  const children: number[] = []
  let entries: string[]
  try {
    entries = readdirSync('/proc')
  } catch {
    return children
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8')
      const parentPid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
      if (parentPid === parent) children.push(Number(entry))
    } catch {
      // Gone meanwhile.
    }
  }
  return children
}
