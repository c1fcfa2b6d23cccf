#!/usr/bin/env bash
# The release artifact as a user gets it: `npm pack` (prepack: a clean dist/), installed with
# `npm install -g <tarball> --omit=dev` into a temporary prefix, then run from there: --version,
# config check, and `start` in front of a local upstream and action target, one authenticated /api/
# request and one webhook through it, the web console's page, modules and sign-in on the admin
# listener (its files resolved in the installed package), SIGTERM, exit 0. The Dockerfile's install steps, outside a container.
#
# The tarball is packed from a copy of the tree (tracked and untracked, not ignored, files; the
# project's node_modules linked in for tsc), so the working tree's dist/ is never rebuilt under
# anything else running from it. Needs node, npm, the registry (the install resolves the
# dependencies) and, for better-sqlite3 when no prebuilt binary is at hand, python3, make and g++.
# Set KEEP=1 to keep the temporary directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
started=$SECONDS
work="$(mktemp -d "${TMPDIR:-/tmp}/gatehouse-release-check.XXXXXX")"
upstream_pid=''
gatehouse_pid=''

step() { printf 'release-check: %s\n' "$*"; }
fail() {
  printf 'release-check: FAILED: %s\n' "$*" >&2
  if [[ -s "$work/gatehouse.log" ]]; then printf -- '--- gatehouse log ---\n' >&2; tail -n 40 "$work/gatehouse.log" >&2; fi
  exit 1
}
cleanup() {
  local pid
  for pid in "$gatehouse_pid" "$upstream_pid"; do
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  if [[ "${KEEP:-}" == 1 ]]; then echo "release-check: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# --- 1. pack -----------------------------------------------------------------------------------
[[ -d "$root/node_modules/typescript" ]] || fail "run npm ci first (the build needs the devDependencies)"
step "packing from a copy of $root"
mkdir -p "$work/src"
if git -C "$root" rev-parse --git-dir > /dev/null 2>&1; then
  (cd "$root" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - --ignore-failed-read) | tar -xf - -C "$work/src"
else
  tar -C "$root" --exclude=./node_modules --exclude=./dist --exclude=./data --exclude=./.git -cf - . | tar -xf - -C "$work/src"
fi
ln -s "$root/node_modules" "$work/src/node_modules"
(cd "$work/src" && npm pack --pack-destination "$work" --loglevel=warn > "$work/pack.out") || fail "npm pack"
tgz="$work/$(tail -n 1 "$work/pack.out")"
[[ -f "$tgz" ]] || fail "npm pack printed no tarball name"
step "packed $(basename "$tgz") ($(du -k "$tgz" | cut -f1) kB)"

tar -tzf "$tgz" | sed 's|^package/||' | sort > "$work/contents"
for wanted in package.json README.md CHANGELOG.md docs/getting-started.md docs/configuration.md bin/gatehouse.js dist/bin.js dist/main.js gateway.json5 examples/gatehouse.service examples/gatehouse-purge.service examples/gatehouse-purge.timer examples/container.json5 examples/prometheus/alerts.yml console/index.html console/app.js console/style.css; do
  grep -qxF "$wanted" "$work/contents" || fail "the tarball lacks $wanted"
done
if unwanted="$(grep -E '^(src|test|bench|scripts|\.ci|node_modules)/|\.ts$|\.map$|^tsconfig|^Dockerfile|^compose' "$work/contents")"; then
  fail "the tarball holds files users do not need: $(echo "$unwanted" | head -n 5 | tr '\n' ' ')"
fi

# --- 2. install, as a user would: no devDependencies -----------------------------------------------
step "npm install -g --omit=dev (better-sqlite3 may compile from source: a few minutes)"
prefix="$work/prefix"
npm install -g --prefix "$prefix" --omit=dev --no-audit --no-fund --loglevel=error "$tgz" > "$work/install.log" 2>&1 \
  || { cat "$work/install.log" >&2; fail "npm install -g $tgz --omit=dev"; }
installed="$prefix/lib/node_modules/gatehouse"
[[ -x "$prefix/bin/gatehouse" ]] || fail "no $prefix/bin/gatehouse after the install"
# No devDependency in the installed tree, unless a production dependency needs it itself
# (http-proxy-middleware brings @types/node); the build tools (typescript, tsx, esbuild) not at all.
(cd "$installed" && npm ls --all --omit=dev --parseable 2> /dev/null || true) > "$work/reachable"
[[ -s "$work/reachable" ]] || fail "npm ls in $installed listed nothing"
node -e '
  const fs = require("node:fs"), path = require("node:path");
  const [pkg, installed, reachableFile] = process.argv.slice(1);
  const dev = Object.keys(JSON.parse(fs.readFileSync(pkg, "utf8")).devDependencies);
  const reachable = new Set(fs.readFileSync(reachableFile, "utf8").split("\n").filter(Boolean).map((p) => fs.realpathSync(p)));
  const problems = [];
  (function walk(modules) {
    if (!fs.existsSync(modules)) return;
    for (const entry of fs.readdirSync(modules)) {
      const names = entry.startsWith("@") ? fs.readdirSync(path.join(modules, entry)).map((n) => `${entry}/${n}`) : [entry];
      for (const name of names) {
        const dir = path.join(modules, name);
        if (["typescript", "tsx", "esbuild"].includes(name)) problems.push(`${name} at ${dir}`);
        else if (dev.includes(name) && !reachable.has(fs.realpathSync(dir))) problems.push(`devDependency ${name} at ${dir}`);
        walk(path.join(dir, "node_modules"));
      }
    }
  })(path.join(installed, "node_modules"));
  if (problems.length) { console.error(problems.join("\n")); process.exit(1); }' "$root/package.json" "$installed" "$work/reachable" \
  || fail "devDependencies were installed (see above)"
step "installed into $prefix: no devDependencies ($(wc -l < "$work/reachable") packages)"

# --- 3. run it from the prefix -------------------------------------------------------------------
export PATH="$prefix/bin:$PATH"
version_output="$(gatehouse --version)"
version="$(head -n 1 <<< "$version_output")"
expected="$(node -p 'require(process.argv[1]).version' "$root/package.json")"
[[ "$version" == "$expected" ]] || fail "gatehouse --version printed '$version', expected '$expected'"
[[ "$(sed -n 2p <<< "$version_output")" =~ ^storage\ schema\ versions:\ sqlite\ [0-9]+,\ postgres\ [0-9]+$ ]] \
  || fail "gatehouse --version's second line is not the storage schema versions: $version_output"
step "gatehouse --version: $version ($(sed -n 2p <<< "$version_output"))"

# A local upstream (the internal API and the action target in one): records every request it gets.
cat > "$work/upstream.mjs" <<'EOF'
import { appendFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';
const [record, portFile] = process.argv.slice(2);
const server = http.createServer((req, res) => {
  let body = '';
  req.on('data', (chunk) => (body += chunk));
  req.on('end', () => {
    appendFileSync(record, JSON.stringify({ method: req.method, url: req.url, headers: req.headers, body }) + '\n');
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ ok: true }));
  });
});
server.listen(0, '127.0.0.1', () => writeFileSync(portFile, String(server.address().port)));
process.on('SIGTERM', () => server.close(() => process.exit(0)));
EOF
node "$work/upstream.mjs" "$work/upstream.jsonl" "$work/upstream.port" &
upstream_pid=$!

# `wait_for <seconds> <command…>`: polls the command until it succeeds.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    (( SECONDS < deadline )) || return 1
    sleep 0.2
  done
}
wait_for 10 test -s "$work/upstream.port" || fail "the local upstream did not start"
upstream="http://127.0.0.1:$(cat "$work/upstream.port")"

key_json="$(gatehouse gateway api-key generate --id release-check --json)"
key="$(node -p 'JSON.parse(process.argv[1]).key' "$key_json")"
entry="$(node -p 'JSON.stringify(JSON.parse(process.argv[1]).entry)' "$key_json")"
hook_secret="release-check-$RANDOM$RANDOM-secret"
admin_token="release-check-admin-$RANDOM$RANDOM-token"
mkdir -p "$work/etc"
cat > "$work/etc/gateway.json5" <<EOF
// Written by scripts/release-check.sh. Ports 0: the listeners pick free ports and log them.
{
  storage: { path: "./data/gatehouse.db" },
  gateway: {
    listen: { host: "127.0.0.1", port: 0 },
    upstream: { target: "$upstream" },
    auth: { apiKeys: [$entry] },
  },
  webhooks: {
    enabled: true,
    listen: { host: "127.0.0.1", port: 0 },
    endpoints: [{ path: "/webhook/release-check", secret: "$hook_secret", action: "system-event" }],
    targets: { "system-event": { url: "$upstream/events" } },
    delivery: { initialBackoffMs: 200 },
  },
  admin: { listen: { host: "127.0.0.1", port: 0 }, token: "$admin_token" },
}
EOF
check="$(gatehouse config check --config "$work/etc/gateway.json5")" || fail "gatehouse config check"
step "gatehouse config check: $check"
# The configs the tarball ships are valid as installed (container.json5 with its variables set).
gatehouse config check --config "$installed/gateway.json5" > /dev/null || fail "config check of the shipped gateway.json5"
DATABASE_URL=postgres://gatehouse:secret@127.0.0.1:5432/gatehouse UPSTREAM_URL=http://127.0.0.1:3000 \
  GATEHOUSE_API_KEY_HASH="$(node -p 'JSON.parse(process.argv[1]).entry.hash' "$key_json")" \
  DEPLOY_HOOK_SECRET="$hook_secret" ACTION_TARGET_URL=http://127.0.0.1:3000/events ADMIN_TOKEN=release-check-admin-token \
  gatehouse config check --config "$installed/examples/container.json5" > /dev/null || fail "config check of the shipped examples/container.json5"
if command -v promtool > /dev/null; then
  promtool check rules "$installed/examples/prometheus/alerts.yml" > /dev/null || fail "promtool check rules of the shipped examples/prometheus/alerts.yml"
fi

gatehouse start --config "$work/etc/gateway.json5" > "$work/gatehouse.log" 2>&1 &
gatehouse_pid=$!
# `log_url <message>`: the url field of the first JSON log line with that message.
log_url() {
  node -e '
    const [file, msg] = process.argv.slice(1);
    for (const text of require("node:fs").readFileSync(file, "utf8").split("\n")) {
      try { const line = JSON.parse(text); if (line.msg === msg && line.url) { console.log(line.url); process.exit(0); } } catch {}
    }
    process.exit(1);' "$work/gatehouse.log" "$1"
}
wait_for 30 grep -q '"msg":"gatehouse started' "$work/gatehouse.log" || fail "gatehouse start did not log 'gatehouse started'"
gateway_url="$(log_url 'gateway listening')" || fail "no 'gateway listening' line"
webhooks_url="$(log_url 'webhook receiver listening')" || fail "no 'webhook receiver listening' line"
admin_url="$(log_url 'admin listener on /metrics, /readyz, /healthz')" || fail "no 'admin listener' line"
step "gatehouse start: pid $gatehouse_pid, gateway $gateway_url, webhooks $webhooks_url, admin $admin_url"

# `request <method> <url> [header] [body]`: prints the status code.
request() {
  node -e '
    const [method, url, header, body] = process.argv.slice(1);
    const headers = {};
    if (header) { const i = header.indexOf(":"); headers[header.slice(0, i)] = header.slice(i + 1).trim(); }
    if (body) headers["content-type"] = "application/json";
    fetch(url, { method, headers, body: body || undefined, signal: AbortSignal.timeout(10000) })
      .then(async (res) => { await res.text(); console.log(res.status); }, (err) => { console.error(String(err)); process.exit(1); });' "$@"
}
upstream_got() { grep -q "$1" "$work/upstream.jsonl" 2>/dev/null; }

status="$(request GET "$gateway_url/api/release-check-anonymous")"
[[ "$status" == 401 ]] || fail "an /api/ request without a key answered $status, expected 401"
status="$(request GET "$gateway_url/api/release-check?n=1" "X-API-Key: $key")"
[[ "$status" == 200 ]] || fail "an /api/ request with the key answered $status, expected 200"
node -e '
  const lines = require("node:fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => JSON.parse(l));
  const api = lines.filter((l) => l.url.startsWith("/api/"));
  if (api.length !== 1 || api[0].url !== "/api/release-check?n=1") throw new Error("upstream got " + JSON.stringify(api.map((l) => l.url)));
  if (api[0].headers["x-gatehouse-key-id"] !== "release-check") throw new Error("no x-gatehouse-key-id: release-check header upstream");
  if ("x-api-key" in api[0].headers) throw new Error("the API key reached the upstream");' "$work/upstream.jsonl" \
  || fail "the upstream did not get the authenticated request (and only it) as expected"
step "/api/: 401 without a key (not forwarded), 200 with it; the upstream got it with x-gatehouse-key-id"

status="$(request POST "$webhooks_url/webhook/release-check" "X-Webhook-Secret: $hook_secret" '{"hello":"release-check"}')"
[[ "$status" == 202 ]] || fail "the webhook answered $status, expected 202"
wait_for 20 upstream_got '"url":"/events"' || fail "the webhook was accepted but never delivered to the target"
step "webhook: 202, stored (SQLite via better-sqlite3) and delivered to the target"

# The console from the installed package: its page and every module it loads, each with the
# strict CSP; a sign-in with the admin token gets the session cookie.
node -e '
  const [base, token] = process.argv.slice(1);
  const get = async (path) => {
    const res = await fetch(base + path, { signal: AbortSignal.timeout(10000) });
    if (res.status !== 200) throw new Error(`GET ${path}: ${res.status}`);
    if (!/script-src .self.;/.test(res.headers.get("content-security-policy") ?? "")) throw new Error(`GET ${path}: no CSP`);
    return res.text();
  };
  (async () => {
    if (!(await get("/console/")).includes("src=\"app.js\"")) throw new Error("/console/ is not the console page");
    const seen = new Set(), queue = ["app.js", "style.css"];
    while (queue.length) {
      const name = queue.shift();
      if (seen.has(name)) continue;
      seen.add(name);
      for (const m of (await get("/console/" + name)).matchAll(/^import [^;]*? from .\.\/([a-z0-9-]+\.js).;$/gm)) queue.push(m[1]);
    }
    const res = await fetch(base + "/console/session", {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ token }),
      signal: AbortSignal.timeout(10000),
    });
    if (res.status !== 200 || !/HttpOnly; SameSite=Strict/.test(res.headers.get("set-cookie") ?? ""))
      throw new Error(`sign-in: ${res.status} ${res.headers.get("set-cookie")}`);
    console.log(seen.size);
  })().catch((err) => { console.error(String(err)); process.exit(1); });' "$admin_url" "$admin_token" > "$work/console.out" \
  || fail "the console is not served from the installed package (see above)"
step "console: /console/ and $(cat "$work/console.out") files, each with the CSP, from the installed package; sign-in sets the cookie"

kill -TERM "$gatehouse_pid"
code=0
wait "$gatehouse_pid" || code=$?
gatehouse_pid=''
[[ "$code" == 0 ]] || fail "gatehouse exited $code after SIGTERM, expected 0"
step "SIGTERM: gatehouse drained and exited 0"
kill -TERM "$upstream_pid" 2>/dev/null || true
wait "$upstream_pid" 2>/dev/null || true
upstream_pid=''

step "ok in $((SECONDS - started)) s"
