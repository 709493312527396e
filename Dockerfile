# syntax=docker/dockerfile:1
# One image for both services. It runs the TypeScript sources through tsx (a production
# dependency), so there is no build step: the stages only keep npm and dev dependencies out.
#   gateway (default):  docker run --init … IMAGE
#   pets-service:       docker run --init … -e PETS_HOST=0.0.0.0 -e PETS_OPS_HOST=0.0.0.0 \
#                         -e HEALTHCHECK_URL=http://127.0.0.1:9465/readyz IMAGE \
#                         node --import tsx pets-service/src/main.ts
# HEALTHCHECK_URL names the ops port: set it too when GATEWAY_OPS_PORT or PETS_OPS_PORT changes.
# The healthchecks use node:http, not fetch, which refuses the ports browsers block (6666, 10080 …).
# node is PID 1's only child (run with --init, or compose's `init: true`) and receives SIGTERM
# and SIGHUP directly: no npm or shell in between.

FROM node:24-slim AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force

FROM node:24-slim AS runtime
ENV NODE_ENV=production \
    HEALTHCHECK_URL=http://127.0.0.1:9464/readyz
WORKDIR /app
# Owned by root and read-only to the service user; config/ is usually mounted over by compose.
COPY --from=deps /app/node_modules ./node_modules
COPY package.json package-lock.json tsconfig.json ./
COPY common ./common
COPY gateway ./gateway
COPY pets-service ./pets-service
COPY config ./config
USER node
EXPOSE 8080 9464 3001 9465
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["node", "-e", "require('node:http').get(process.env.HEALTHCHECK_URL, (r) => process.exit(r.statusCode === 200 ? 0 : 1)).on('error', () => process.exit(1))"]
CMD ["node", "--import", "tsx", "gateway/src/main.ts"]
