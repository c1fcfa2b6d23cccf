// `npm start` / `npm run demo`: the example internal API, the example action target and gatehouse
// itself with ./gateway.json5, in one terminal. Ctrl-C stops all three.
// Ports: DEMO_API_PORT (3000), DEMO_TARGET_PORT (4000), GATEHOUSE_PORT (8080),
// GATEHOUSE_WEBHOOKS_PORT (8081); gateway.json5 reads the same variables.
// Any failure (a port in use, gatehouse refusing to start) is one line and exit 1, with nothing
// left running: the example servers close and gatehouse is never left behind as an orphan.
import { spawn, spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createActionTarget } from './action-target.js';
import { createInternalApi } from './internal-api.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const apiPort = Number(process.env.DEMO_API_PORT || 3000);
const targetPort = Number(process.env.DEMO_TARGET_PORT || 4000);
const servers = [];
let gatehouse;

function fail(message) {
  process.stderr.write(`demo: ${message}\n`);
  stopAll();
  process.exitCode = 1;
}

function stopAll() {
  for (const server of servers) server.close();
  if (gatehouse && gatehouse.exitCode === null && gatehouse.signalCode === null) gatehouse.kill('SIGTERM');
}

/** Resolves once listening; a port in use is said in one line (the variable that moves it named). */
function listen(app, port, what, variable) {
  return new Promise((resolve, reject) => {
    const server = app.listen(port, '127.0.0.1');
    servers.push(server);
    server.once('listening', () => resolve(server));
    server.once('error', (err) =>
      reject(
        new Error(
          err.code === 'EADDRINUSE'
            ? `${what} cannot listen on 127.0.0.1:${port}: the port is already in use (set ${variable} to another port)`
            : `${what} cannot listen on 127.0.0.1:${port}: ${err.message}`,
        ),
      ),
    );
  });
}

/** The newest modification time under `dir` (files ending in `ext`), 0 when there are none. */
function newest(dir, ext) {
  let latest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (entry.isFile() && entry.name.endsWith(ext))
      latest = Math.max(latest, statSync(path.join(entry.parentPath ?? entry.path, entry.name)).mtimeMs);
  }
  return latest;
}

/** Builds dist/ only when a source file is newer than it (or it is missing). */
function buildIfStale() {
  let built = 0;
  try {
    built = statSync(path.join(root, 'dist/bin.js')).mtimeMs;
  } catch {
    // missing: build
  }
  if (built >= newest(path.join(root, 'src'), '.ts')) return true;
  console.log('dist/ is older than src/: building (npm run build)');
  const result = spawnSync('npm', ['run', '--silent', 'build'], { cwd: root, stdio: 'inherit' });
  return result.status === 0;
}

// Children never outlive the demo, however it ends.
process.on('exit', () => {
  if (gatehouse && gatehouse.exitCode === null && gatehouse.signalCode === null) gatehouse.kill('SIGTERM');
});

try {
  await listen(createInternalApi(), apiPort, 'the example internal API', 'DEMO_API_PORT');
  await listen(createActionTarget(), targetPort, 'the example action target', 'DEMO_TARGET_PORT');
} catch (err) {
  fail(err.message);
}
if (process.exitCode !== 1) {
  if (!buildIfStale()) fail('the build failed');
}
if (process.exitCode !== 1) {
  console.log(
    `example internal API on http://127.0.0.1:${apiPort}, example action target on http://127.0.0.1:${targetPort}`,
  );
  gatehouse = spawn(process.execPath, ['bin/gatehouse.js', 'start', '--config', process.argv[2] ?? 'gateway.json5'], {
    cwd: root,
    stdio: 'inherit',
    env: { ...process.env, DEMO_API_PORT: String(apiPort), DEMO_TARGET_PORT: String(targetPort) },
  });
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'])
    process.on(signal, () => gatehouse.kill(signal === 'SIGHUP' ? 'SIGHUP' : 'SIGTERM'));
  gatehouse.on('exit', (code, signal) => {
    for (const server of servers) server.close();
    // gatehouse has said why on stderr (e.g. "gateway.listen 127.0.0.1:8080 is already in use").
    process.exitCode = code ?? (signal === 'SIGTERM' || signal === 'SIGINT' ? 0 : 1);
  });
}
