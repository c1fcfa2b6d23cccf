import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { request } from '../helpers/http.js';
import { ROOT, runCli, startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// `--env-file`: the variables a config's ${VAR} references are read from a file at start and
// again at every reload, so a secret added to or rotated in that file takes effect on SIGHUP
// (issue 28: the process environment is fixed at start, so such a reload used to fail).

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-env-file-e2e-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const OLD_KEY = 'env-file-old-0123456789abcdefghijklmnopqrstu';
const NEW_KEY = 'env-file-new-0123456789abcdefghijklmnopqrstu';
const ROTATED = 'env-file-rot-0123456789abcdefghijklmnopqrstu';
/** ISO 8601 in UTC with milliseconds, as pino.stdTimeFunctions.isoTime writes it. */
const ISO_TIME = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

let upstream: RecordingServer;
before(async () => {
  upstream = await startRecordingUpstream();
});
after(() => upstream.close());

function write(name: string, text: string): string {
  const file = path.join(dir, name);
  writeFileSync(file, text);
  return file;
}

function config(name: string, apiKey: string, extra = ''): string {
  return write(
    name,
    `{ log: { format: "json" }, gateway: { listen: { port: 0 }, upstream: { target: "${upstream.url}" }, auth: { apiKey: "${apiKey}" }${extra} } }`,
  );
}

/** The upstream requests on `path`: what got through, not only the status the client saw. */
const reachedUpstream = (path: string) => upstream.received.filter((r) => r.url === path).length;

async function reload(server: ServerProcess, outcome: 'configuration reloaded' | 'reload rejected') {
  const seen = server.lines.filter((l) => l.msg?.startsWith(outcome)).length;
  server.child.kill('SIGHUP');
  await server.waitFor(() => server.lines.filter((l) => l.msg?.startsWith(outcome)).length > seen);
}

/** Every log line so far has a level name and an ISO 8601 time (log.format: "json"). */
function assertJsonLines(server: ServerProcess): void {
  assert.ok(server.lines.length > 3);
  for (const line of server.lines) {
    assert.ok(['trace', 'debug', 'info', 'warn', 'error', 'fatal'].includes(line.level), JSON.stringify(line));
    assert.match(line.time, ISO_TIME, JSON.stringify(line));
  }
}

describe('gatehouse start --env-file', () => {
  it('a secret added to the env file and referenced by the config is in force after SIGHUP; the removed one is refused', async () => {
    const envFile = write('added.env', `OLD_KEY=${OLD_KEY}\n`);
    const file = config('added.json5', '${OLD_KEY}');
    const server = startServerProcess(file, { command: ['start', '--no-watch', '--env-file', envFile] });
    try {
      const { url } = await server.waitFor((l) => l.msg === 'gateway listening');
      assert.equal((await request(url, '/api/before', { headers: { 'x-api-key': OLD_KEY } })).status, 200);
      assert.equal(reachedUpstream('/api/before'), 1);

      // The operator's edit: a new variable in the env file (the old one gone), the config naming it.
      write('added.env', `# rotated\nNEW_KEY=${NEW_KEY}\n`);
      config('added.json5', '${NEW_KEY}');
      // Checked with the same view first; without the file, the variable is not set.
      const checked = await runCli(['config', 'check', '--config', file, '--env-file', envFile]);
      assert.equal(checked.code, 0, checked.stderr);
      const unset = await runCli(['config', 'check', '--config', file]);
      assert.equal(unset.code, 1);
      assert.match(unset.stderr, /gateway\.auth\.apiKey: environment variable NEW_KEY is not set/);

      await reload(server, 'configuration reloaded');
      assert.equal((await request(url, '/api/new', { headers: { 'x-api-key': NEW_KEY } })).status, 200);
      assert.equal(reachedUpstream('/api/new'), 1, 'the request with the added key reached the upstream');
      assert.equal((await request(url, '/api/old', { headers: { 'x-api-key': OLD_KEY } })).status, 401);
      assert.equal(reachedUpstream('/api/old'), 0, 'the removed key reaches nothing');
      assertJsonLines(server);
      assert.ok(!server.lines.some((l) => JSON.stringify(l).includes(NEW_KEY)), 'the key is never logged');
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });

  it('a malformed env file at a reload is a rejected reload: logged with its line, the previous config stays', async () => {
    const envFile = write('malformed.env', `API_KEY=${OLD_KEY}\n`);
    const server = startServerProcess(config('malformed.json5', '${API_KEY}'), {
      command: ['start', '--no-watch', '--env-file', envFile],
    });
    try {
      const { url } = await server.waitFor((l) => l.msg === 'gateway listening');
      write('malformed.env', `API_KEY=${NEW_KEY}\nthis line is no assignment\n`);
      await reload(server, 'reload rejected');
      const rejected = server.lines.find((l) => l.msg?.startsWith('reload rejected'))!;
      assert.equal(rejected.level, 'error');
      assert.deepEqual(rejected.problems, [
        `env file ${envFile}: line 2: not NAME=value (a comment line starts with #)`,
      ]);
      assert.equal((await request(url, '/api/still-old', { headers: { 'x-api-key': OLD_KEY } })).status, 200);
      assert.equal(reachedUpstream('/api/still-old'), 1);
      assert.equal((await request(url, '/api/not-yet-new', { headers: { 'x-api-key': NEW_KEY } })).status, 401);
      assert.equal(reachedUpstream('/api/not-yet-new'), 0);
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });

  it('with gateway.workers: 2, a value rotated in the env file reaches every worker on SIGHUP', async () => {
    const envFile = write('workers.env', `API_KEY=${OLD_KEY}\n`);
    const server = startServerProcess(config('workers.json5', '${API_KEY}', ', workers: 2'), {
      command: ['start', '--no-watch', '--env-file', envFile],
      env: { NODE_CLUSTER_SCHED_POLICY: 'rr' },
    });
    try {
      const { url } = await server.waitFor((l) => l.msg === 'gateway workers listening');
      write('workers.env', `API_KEY='${ROTATED}'\n`);
      await reload(server, 'configuration reloaded');
      const from = server.lines.length;
      // New connections, handed out round robin: both workers answer.
      for (let i = 0; i < 4; i++)
        assert.equal((await request(url, '/api/rotated', { headers: { 'x-api-key': ROTATED } })).status, 200);
      assert.equal(reachedUpstream('/api/rotated'), 4);
      for (let i = 0; i < 2; i++)
        assert.equal((await request(url, '/api/previous', { headers: { 'x-api-key': OLD_KEY } })).status, 401);
      assert.equal(reachedUpstream('/api/previous'), 0, 'the rotated-out value reaches nothing, in either worker');
      await server.waitFor(
        () => server.lines.slice(from).filter((l) => l.msg === 'request' && l.path === '/api/rotated').length === 4,
      );
      const workers = server.lines
        .slice(from)
        .filter((l) => l.msg === 'request' && l.path === '/api/rotated')
        .map((l) => l.worker);
      assert.deepEqual(new Set(workers), new Set([1, 2]), `workers: ${workers.join(' ')}`);
      // The workers' own loggers write the same format (their request lines included).
      assertJsonLines(server);
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });

  it('a malformed env file at start is one line and exit 1, nothing listens', async () => {
    const envFile = write('bad-start.env', 'GOOD=1\nSECRET=abc#def\n');
    const result = await runCli(['start', '--config', config('bad-start.json5', '${SECRET}'), '--env-file', envFile]);
    assert.equal(result.code, 1);
    assert.equal(
      result.stderr,
      `gatehouse: env file ${envFile}: line 2: an unquoted value holding #: put the whole value in single quotes ('…')\n`,
    );
    assert.equal(result.stdout, '');
  });

  it("a missing env file at start is one line: gatehouse's own after `node --`; node's own otherwise (nodejs/node#54232)", async () => {
    const missing = path.join(dir, 'absent.env');
    const args = ['start', '--config', config('missing.json5', 'k-0123456789abcdefghijklmnop'), '--env-file', missing];
    // `--` ends node's options, so node leaves a later --env-file to the script (Node 20.20 and later).
    const child = spawn(process.execPath, ['--import', 'tsx', '--', `${ROOT}src/bin.ts`, ...args], {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d) => (stderr += d));
    const [code] = (await once(child, 'exit')) as [number];
    assert.equal(code, 1);
    assert.equal(stderr, `gatehouse: env file ${missing} does not exist\n`);
    // Without it, Node itself looks for --env-file anywhere on its command line and stops first.
    const plain = await runCli(args);
    assert.notEqual(plain.code, 0);
    assert.equal(plain.stderr.trim().split('\n').length, 1, plain.stderr);
    assert.ok(plain.stderr.includes(missing), plain.stderr);
  });
});

describe('gatehouse config check|print --env-file', () => {
  it('checks with the same view as start: a file over the process environment, a later file over an earlier one', async () => {
    const file = write(
      'view.json5',
      `{ gateway: { listen: { port: 0 }, upstream: { target: "\${UPSTREAM}" }, auth: { apiKey: "\${API_KEY}" } } }`,
    );
    const first = write('view-1.env', `UPSTREAM=http://first.internal:80\nAPI_KEY=${OLD_KEY}\n`);
    const second = write('view-2.env', 'UPSTREAM=http://second.internal:80\n');
    const env = { UPSTREAM: 'http://process.internal:80', API_KEY: undefined };
    const checked = await runCli(['config', 'check', '--config', file, '--env-file', first, '--env-file', second], {
      env,
    });
    assert.equal(checked.code, 0, checked.stderr);
    assert.match(checked.stdout, /-> http:\/\/second\.internal:80,/);
    const printed = await runCli(['config', 'print', '--config', file, '--env-file', first], { env });
    assert.equal(printed.code, 0, printed.stderr);
    assert.equal(JSON.parse(printed.stdout).gateway.upstream.target, 'http://first.internal:80');
    // --json: an env file's problem is still one line on stderr (it is not a problem of the config).
    const bad = await runCli(['config', 'check', '--json', '--config', file, '--env-file', write('bad.env', 'X\n')]);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /^gatehouse: env file .*bad\.env: line 1: not NAME=value/);
  });
});

describe('gatehouse storage|webhooks deliveries --env-file', () => {
  it('the storage a config names through ${VAR} is found with the env file, and is a missing variable without it', async () => {
    const file = write(
      'storage.json5',
      '{ storage: { path: "${DB_DIR}/events.db" }, gateway: { upstream: { target: "http://127.0.0.1:9" } } }',
    );
    const vars = write('storage.env', `DB_DIR=${dir}\n`);
    const migrated = await runCli(['storage', 'migrate', '--config', file, '--env-file', vars], {
      env: { DB_DIR: undefined },
    });
    assert.equal(migrated.code, 0, migrated.stderr);
    assert.match(
      migrated.stdout,
      new RegExp(`sqlite ${path.join(dir, 'events.db').replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}`),
    );
    const listed = await runCli(['webhooks', 'deliveries', 'list', '--json', '--config', file, '--env-file', vars], {
      env: { DB_DIR: undefined },
    });
    assert.equal(listed.code, 0, listed.stderr);
    assert.deepEqual(JSON.parse(listed.stdout), []);
    const without = await runCli(['storage', 'status', '--config', file], { env: { DB_DIR: undefined } });
    assert.equal(without.code, 1);
    assert.match(without.stderr, /storage\.path: .*DB_DIR/);
  });
});
