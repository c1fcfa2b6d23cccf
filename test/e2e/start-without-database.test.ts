import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { request } from '../helpers/http.js';
import { postWebhook } from '../helpers/instances.js';
import { runCli, startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

// Issue 28: a deploy, OOM kill or reboot during a database outage must not take the /api/ edge
// down. A real cluster, stopped by the test before gatehouse starts, then started again.

const API_KEY = 'no-db-test-key-0123456789abcdefghijklmnopq';
const SECRET = 'no-db-hook-secret-0123456789';
const ENDPOINT = '/webhook/no-db';

const cluster = await startPostgres();
const skip = 'skip' in cluster ? cluster.skip : false;
const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-no-db-'));

describe('gatehouse start while PostgreSQL is down', { skip, timeout: 120_000 }, () => {
  let upstream: RecordingServer;
  let target: RecordingServer;
  let url: string;
  const servers: ServerProcess[] = [];

  const writeConfig = (name: string, storage: Record<string, unknown>, gatewayExtra: Record<string, unknown> = {}) => {
    const file = path.join(dir, `${name}.json5`);
    writeFileSync(
      file,
      JSON.stringify({
        storage: { driver: 'postgres', url, ...storage },
        gateway: {
          listen: { host: '127.0.0.1', port: 0 },
          upstream: { target: upstream.url },
          auth: { apiKey: API_KEY, failures: { max: 3, windowSeconds: 60, lockoutSeconds: 60 } },
          rateLimits: [{ by: 'ip', requests: 1000, per: '1m' }],
          ...gatewayExtra,
        },
        webhooks: {
          enabled: true,
          listen: { host: '127.0.0.1', port: 0 },
          endpoints: [{ path: ENDPOINT, secret: SECRET, action: 'system-event' }],
          targets: { 'system-event': { url: `${target.url}/deliver` } },
          delivery: { timeoutMs: 1_000, initialBackoffMs: 50, maxBackoffMs: 200 },
        },
        admin: { listen: { host: '127.0.0.1', port: 0 } },
      }),
    );
    return file;
  };

  before(async () => {
    upstream = await startRecordingUpstream();
    target = await startRecordingUpstream();
    url = await (cluster as PostgresCluster).createDatabase();
  });

  after(async () => {
    await Promise.all(servers.map((s) => s.stop('SIGKILL')));
    await upstream?.close();
    await target?.close();
    if (!('skip' in cluster)) await cluster.destroy();
    rmSync(dir, { recursive: true, force: true });
  });

  it('serves /api/, answers webhooks 503 and fails /readyz; once the database starts, accepts and delivers without a restart', async (t) => {
    const pgc = cluster as PostgresCluster;
    await pgc.stop();
    let up = false;
    t.after(async () => {
      if (!up) await pgc.start();
    });
    // Credentials in the URLs' query and userinfo are never logged (outside attack: the storage URL's ?password= was).
    const server = startServerProcess(
      writeConfig(
        'degraded',
        { url: `${url}?password=query-secret-123` },
        {
          upstream: { target: upstream.url.replace('http://', 'http://user:upstream-secret-456@') },
        },
      ),
    );
    servers.push(server);
    const gateway = (await server.waitFor((l) => l.msg === 'gateway listening')).url as string;
    const hooks = (await server.waitFor((l) => l.msg === 'webhook receiver listening')).url as string;
    const admin = (await server.waitFor((l) => l.msg?.startsWith('admin listener'))).url as string;
    await server.waitFor((l) => l.msg === 'gatehouse started (pid ' + server.child.pid + ')');

    // The reason, once: one line naming the database (no password) and what still works.
    const unreachable = await server.waitFor((l) => /postgres: cannot reach/.test(l.msg ?? ''));
    assert.equal(unreachable.level >= 40 || unreachable.level === 'warn', true);
    assert.match(unreachable.msg, /webhooks answer 503/);

    // /api/ serves: the upstream receives the request, without the key.
    const api = await request(gateway, '/api/ping', { headers: { 'x-api-key': API_KEY } });
    assert.equal(api.status, 200);
    const seen = upstream.received.at(-1)!;
    assert.equal(seen.url, '/api/ping');
    assert.equal(seen.headers['x-api-key'], undefined);
    // The lockout counts locally meanwhile: the 3rd wrong key locks the client out.
    const wrong = [];
    for (let i = 0; i < 4; i++)
      wrong.push((await request(gateway, '/api/ping', { headers: { 'x-api-key': `${API_KEY}-wrong` } })).status);
    assert.deepEqual(wrong, [401, 401, 401, 429]);

    // Webhooks: 503 store_unavailable with Retry-After, nothing delivered.
    const refused = await postWebhook(hooks, ENDPOINT, SECRET, { n: 0 });
    assert.equal(refused.status, 503);
    assert.equal(refused.json().error.code, 'store_unavailable');
    assert.ok(Number(refused.headers['retry-after']) > 0);
    const ready = await request(admin, '/readyz');
    assert.equal(ready.status, 503);
    assert.match(JSON.stringify(ready.json()), /store/);
    assert.match(ready.json().checks.store, /does not take writes/);
    // Queue gauges are absent while the store cannot be read: no false "no lag".
    const metrics = (await request(admin, '/metrics')).body;
    assert.doesNotMatch(metrics, /^gatehouse_queue_oldest_due_seconds/m);
    assert.doesNotMatch(metrics, /^gatehouse_queue_events\{/m);

    // A probe every second for the whole outage must not repeat one line (outside attack: 20 probes, 20 warnings).
    for (let i = 0; i < 3; i++) {
      assert.equal((await request(admin, '/readyz')).status, 503);
      await request(admin, '/metrics');
    }
    const saidTimes = (what: string) => server.lines.filter((l) => l.msg === what).length;
    await waitFor(() => saidTimes('readiness: the store does not take writes') > 0, { what: 'the readiness line' });
    // Said when the scrape's read fails, which may come after its answer (at load 5 it did).
    await waitFor(() => saidTimes('metrics: the queue could not be read') > 0, { what: 'the metrics line' });
    assert.equal(saidTimes('readiness: the store does not take writes'), 1);
    assert.equal(saidTimes('metrics: the queue could not be read'), 1);

    await pgc.start();
    up = true;
    await server.waitFor((l) => /postgres: reached .* schema current/.test(l.msg ?? ''), 60_000);
    const accepted = await waitFor(
      async () => {
        const reply = await postWebhook(hooks, ENDPOINT, SECRET, { n: 1 });
        return reply.status === 202 ? reply : undefined;
      },
      { timeoutMs: 30_000, what: 'a 202 once the database is up' },
    );
    const id = accepted.json().id as string;
    await waitFor(() => target.received.find((r) => r.body.includes(id)), {
      timeoutMs: 30_000,
      what: 'the accepted event delivered',
    });
    await waitFor(async () => (await request(admin, '/readyz')).status === 200, { timeoutMs: 15_000, what: 'ready' });
    await server.waitFor((l) => l.msg === 'readiness: the store takes writes again');
    // The outage said once, its end once: not a line per retry.
    assert.equal(server.lines.filter((l) => /postgres: cannot reach/.test(l.msg ?? '')).length, 1);
    assert.equal(server.lines.filter((l) => /postgres: reached/.test(l.msg ?? '')).length, 1);
    assert.equal(await server.stop(), 0);
    const logged = JSON.stringify(server.lines);
    assert.ok(
      !logged.includes('query-secret-123') && !logged.includes('upstream-secret-456'),
      'a credential was logged',
    );
    assert.match(logged, /password=\[redacted\]/);
  });

  it('with gateway.workers: 2 too: every worker serves /api/ while the database is down', async (t) => {
    const pgc = cluster as PostgresCluster;
    await pgc.stop();
    t.after(() => pgc.start());
    const server = startServerProcess(writeConfig('workers', {}, { workers: 2 }));
    servers.push(server);
    const gateway = (await server.waitFor((l) => l.msg === 'gateway listening', 60_000)).url as string;
    await server.waitFor((l) => l.msg?.startsWith('gatehouse started'), 60_000);
    const before = upstream.received.length;
    // Fresh connections: the kernel spreads them over both workers.
    const statuses = await Promise.all(
      Array.from({ length: 8 }, () =>
        request(gateway, '/api/workers', { headers: { 'x-api-key': API_KEY }, agent: false }),
      ),
    );
    assert.deepEqual(
      statuses.map((r) => r.status),
      Array(8).fill(200),
    );
    assert.equal(upstream.received.length - before, 8);
    assert.equal(server.child.exitCode, null);
  });

  it('storage.requireAtStart: true exits 1 with one line and no stack', async () => {
    const pgc = cluster as PostgresCluster;
    await pgc.stop();
    try {
      const result = await runCli(['start', '--config', writeConfig('strict', { requireAtStart: true })]);
      assert.equal(result.code, 1);
      const lines = result.stderr.trim().split('\n');
      assert.equal(lines.length, 1, result.stderr);
      assert.match(
        lines[0]!,
        /^gatehouse: postgres: cannot reach postgres:\/\/postgres@127\.0\.0\.1:\d+\/\w+ \(storage\.url\): /,
      );
      assert.doesNotMatch(result.stderr, /\n\s+at /);
    } finally {
      await pgc.start();
    }
  });

  it('a schema newer than this gatehouse: /api/ serves, webhooks 503, one error line; no crash', async () => {
    const newer = await (cluster as PostgresCluster).createDatabase();
    const client = new pg.Client({ connectionString: newer });
    await client.connect();
    await client.query('CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL)');
    await client.query("INSERT INTO schema_migrations VALUES (999, 'from the future')");
    await client.end();
    const previous = url;
    url = newer;
    const server = startServerProcess(writeConfig('newer', {}));
    url = previous;
    servers.push(server);
    const gateway = (await server.waitFor((l) => l.msg === 'gateway listening')).url as string;
    const hooks = (await server.waitFor((l) => l.msg === 'webhook receiver listening')).url as string;
    const line = await server.waitFor((l) => /version 999, newer/.test(l.msg ?? ''));
    assert.ok(line.level === 'error' || line.level === 50, JSON.stringify(line));
    assert.equal((await request(gateway, '/api/x', { headers: { 'x-api-key': API_KEY } })).status, 200);
    const refused = await postWebhook(hooks, ENDPOINT, SECRET, { n: 2 });
    assert.equal(refused.status, 503);
    assert.equal(refused.json().error.code, 'store_unavailable');
    assert.equal(server.child.exitCode, null);
  });
});
