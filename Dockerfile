# syntax=docker/dockerfile:1
# gatehouse as a container: the release tarball (`npm pack`), installed as a user installs it
# (`npm install -g <tarball> --omit=dev`), run by an unprivileged user. scripts/release-check.sh runs
# the same pack and install steps outside a container (CI has no container daemon).
#   docker build -t gatehouse .
#   docker run --rm -p 8080:8080 -p 8081:8081 \
#     -v /srv/gatehouse/gateway.json5:/etc/gatehouse/gateway.json5:ro -v gatehouse-data:/var/lib/gatehouse gatehouse
# The config must listen on 0.0.0.0 inside the container (examples/container.json5; compose.yaml).
# Node 22: maintained LTS, tested in CI (20 is past end of life; 24 not yet with better-sqlite3 12, see README).
ARG NODE_IMAGE=node:22-bookworm-slim

# 1. Build: every dependency, tsc, then `npm pack` (its prepack builds a clean dist/).
FROM ${NODE_IMAGE} AS build
WORKDIR /build
COPY package.json package-lock.json ./
# --ignore-scripts: tsc is all the build needs (better-sqlite3's native build happens in the install stage).
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY . .
RUN npm pack --loglevel=warn && mv gatehouse-*.tgz /gatehouse.tgz

# 2. Install the tarball without devDependencies. better-sqlite3 takes a prebuilt binary when one can
#    be downloaded and compiles otherwise, hence python3, make and g++ here (not in the final image).
FROM ${NODE_IMAGE} AS install
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /gatehouse.tgz /tmp/gatehouse.tgz
RUN npm install -g --omit=dev --no-audit --no-fund /tmp/gatehouse.tgz \
 && npm cache clean --force

# 3. Runtime: the installed package on the same base image (same glibc and Node ABI), no compilers.
FROM ${NODE_IMAGE}
ENV NODE_ENV=production \
    HEALTHCHECK_URL=http://127.0.0.1:8080/healthz
COPY --from=install /usr/local/lib/node_modules/gatehouse /usr/local/lib/node_modules/gatehouse
RUN ln -s ../lib/node_modules/gatehouse/bin/gatehouse.js /usr/local/bin/gatehouse \
 && mkdir -p /etc/gatehouse /var/lib/gatehouse \
 && chown node:node /var/lib/gatehouse
# The SQLite store (storage: { path: "/var/lib/gatehouse/gatehouse.db" }); with PostgreSQL it stays
# empty: webhook events, Gmail and channel state and the lockout all live in the database.
VOLUME ["/var/lib/gatehouse"]
WORKDIR /var/lib/gatehouse
# The image's unprivileged `node` user (uid 1000): a bind-mounted data dir must be writable by it.
USER node
# The gateway, the webhook receiver, the admin listener (examples/container.json5's ports).
EXPOSE 8080 8081 9090
# Liveness by default: /healthz answers 200 on every listener without auth while the process answers;
# curl is not in the image, node is. Set HEALTHCHECK_URL when the gateway listens elsewhere (another
# port, or TLS: https://…), or to the admin listener's /readyz where an unhealthy container is taken
# out of rotation rather than restarted (compose.yaml; docs/operations/containers.md).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["node", "-e", "fetch(process.env.HEALTHCHECK_URL, { signal: AbortSignal.timeout(4000) }).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# SIGTERM drains (up to 10 s of requests, then 10 s of deliveries): give `docker stop -t 30`
# (compose.yaml: stop_grace_period). Exec form: node is PID 1 and gets the signal itself;
# gatehouse handles SIGTERM, SIGINT and SIGHUP (reload: `docker kill -s HUP <container>`).
STOPSIGNAL SIGTERM
ENTRYPOINT ["node", "/usr/local/lib/node_modules/gatehouse/bin/gatehouse.js"]
CMD ["start", "--config", "/etc/gatehouse/gateway.json5"]
