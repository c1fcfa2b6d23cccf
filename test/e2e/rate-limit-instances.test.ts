import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { hashApiKey } from '../../src/gateway/credentials/api-key.js';
import { request } from '../helpers/http.js';
import { startInstances, stopInstances, type Instance } from '../helpers/instances.js';
import { waitFor } from '../helpers/wait.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { startServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// Issue 16: a `by: "key"` rate limit shared by two real `gatehouse start` processes on one real
// PostgreSQL (README: Rate limits and their headers). Requests alternate between the instances,
// as a round-robin balancer sends them; with PostgreSQL stopped both keep serving, each counting
// alone.

const N = 20; // per minute: one token back every 3 s
const SHARED_KEY = 'ratelimit-shared-key-0123456789abcdefghijklm';
const OUTAGE_KEY = 'ratelimit-outage-key-0123456789abcdefghijklm';
/** One request every PACE_MS, alternating: each instance gets one every 2 × PACE_MS. */
const PACE_MS = 100;
const REQUESTS = 2 * N;
/** The allowed requests of one run, against N, the refill over `elapsedMs` and the documented overshoot at this pace. */
function assertWithinBound(allowed: number, elapsedMs: number, what: string): void {
  // The bound (README): N, plus the refill over the run, plus what the other process allowed in
  // the last two sync intervals (1 s) before it was heard of: at this pace, 1 s / (2 × PACE_MS),
  // with one more for a timer late on a loaded machine.
  const refill = Math.floor((elapsedMs / 60_000) * N) + 1;
  const overshoot = Math.ceil(1_000 / (2 * PACE_MS)) + 1;
  assert.ok(allowed >= N, `${what}: at least the limit is allowed: ${allowed}`);
  assert.ok(
    allowed <= N + refill + overshoot,
    `${what}: at most N + ${refill} refill + ${overshoot} overshoot: ${allowed}`,
  );
  assert.ok(allowed < 2 * N - 5, `${what}: clearly less than each process allowing N: ${allowed}`);
}

/** `count` requests, one every PACE_MS, the i-th through `send(i)`; the statuses and the time taken. */
async function paced(
  count: number,
  send: (i: number) => Promise<number>,
): Promise<{ statuses: number[]; elapsedMs: number }> {
  const startedAt = Date.now();
  const statuses: number[] = [];
  for (let i = 0; i < count; i++) {
    const next = startedAt + i * PACE_MS;
    if (next > Date.now()) await new Promise((r) => setTimeout(r, next - Date.now()));
    statuses.push(await send(i));
  }
  return { statuses, elapsedMs: Date.now() - startedAt };
}

const cluster = await startPostgres();
const skip = 'skip' in cluster ? cluster.skip : false;

describe('a rate limit shared by two instances on one PostgreSQL', { skip, timeout: 90_000 }, () => {
  let upstream: RecordingServer;
  let instances: Instance[] = [];
  let url: string;

  before(async () => {
    url = await (cluster as PostgresCluster).createDatabase();
    upstream = await startRecordingUpstream();
    instances = await startInstances(2, url, () => ({
      log: { level: 'info' },
      gateway: {
        listen: { host: '127.0.0.1', port: 0 },
        upstream: { target: upstream.url },
        rateLimits: [{ by: 'key', requests: N, per: '1m' }],
        auth: {
          apiKeys: [
            { id: 'shared', hash: hashApiKey(SHARED_KEY) },
            { id: 'outage', hash: hashApiKey(OUTAGE_KEY) },
          ],
        },
      },
      webhooks: {
        enabled: true,
        listen: { host: '127.0.0.1', port: 0 },
        endpoints: [{ path: '/webhook/unused', secret: 'unused-secret-0123456789abcdef', action: 'system-event' }],
        targets: { 'system-event': { url: `${upstream.url}/unused` } },
      },
    }));
  });

  after(async () => {
    await stopInstances(instances);
    await upstream?.close();
    if (!('skip' in cluster)) await cluster.destroy();
  });

  const call = (instance: Instance, key: string) =>
    request(instance.gatewayUrl, '/api/limited', { headers: { 'x-api-key': key } });

  it(`${REQUESTS} requests alternating over both: about ${N} allowed in total, within the documented bound, then 429 on both`, async (t) => {
    const before = upstream.received.length;
    const allowed = [0, 0];
    const { statuses, elapsedMs } = await paced(REQUESTS, async (i) => {
      const reply = await call(instances[i % 2]!, SHARED_KEY);
      assert.ok(reply.status === 200 || reply.status === 429, `request ${i}: ${reply.status} ${reply.body}`);
      if (reply.status === 200) allowed[i % 2]!++;
      else assert.equal(reply.json().error.code, 'rate_limited');
      return reply.status;
    });
    const total = allowed[0]! + allowed[1]!;
    t.diagnostic(
      `allowed ${total} (${allowed.join(' + ')}) of ${REQUESTS} in ${elapsedMs} ms; statuses ${statuses.join(' ')}`,
    );
    assertWithinBound(total, elapsedMs, 'two instances');
    assert.ok(allowed[0]! > 0 && allowed[1]! > 0, 'both instances served the client');
    assert.equal(upstream.received.length - before, total, 'the upstream received exactly the allowed requests');
    assert.deepEqual(statuses.slice(-4), [429, 429, 429, 429], 'the last requests are refused, on both');

    // After a sync each instance knows the whole spend: refused on both, with a Retry-After.
    // A fixed wait: the sync is periodic (1 s), and polling with requests would spend what is checked.
    await new Promise((r) => setTimeout(r, 1_000));
    for (const instance of instances) {
      const reply = await call(instance, SHARED_KEY);
      assert.equal(reply.status, 429, `${instance.name} refuses`);
      assert.ok(
        Number(reply.headers['retry-after']) >= 1,
        `${instance.name}: Retry-After ${reply.headers['retry-after']}`,
      );
    }
    assert.equal(upstream.received.length - before, total);
  });

  it('gateway.workers: 2 on PostgreSQL: each worker holds whole buckets and shares them', async (t) => {
    const file = path.join(mkdtempSync(path.join(tmpdir(), 'gatehouse-ratelimit-pg-workers-')), 'workers.json5');
    writeFileSync(
      file,
      JSON.stringify({
        gateway: {
          listen: { host: '127.0.0.1', port: 0 },
          workers: 2,
          upstream: { target: upstream.url },
          rateLimits: [{ by: 'key', requests: N, per: '1m' }],
          auth: {
            apiKeys: [
              { id: 'one-connection', hash: hashApiKey(SHARED_KEY) },
              { id: 'spread', hash: hashApiKey(OUTAGE_KEY) },
            ],
          },
        },
        storage: { driver: 'postgres', url },
      }),
    );
    const server = startServerProcess(file, { env: { NODE_CLUSTER_SCHED_POLICY: 'rr' } });
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const { url: gatewayUrl } = await server.waitFor((l) => l.msg === 'gateway workers listening', 45_000);
      // One keep-alive connection: one worker serves it all, with the whole limit (1/N of it on SQLite).
      const single: number[] = [];
      for (let i = 0; i < N + 10; i++)
        single.push(
          (await request(gatewayUrl, '/api/limited', { headers: { 'x-api-key': SHARED_KEY }, agent })).status,
        );
      const singleAllowed = single.filter((s) => s === 200).length;
      assert.ok(
        singleAllowed >= N && singleAllowed <= N + 1,
        `one connection, one worker: the whole limit: ${single.join(' ')}`,
      );
      // A connection per request: the primary hands them to the workers in turn, which share the bucket.
      const { statuses, elapsedMs } = await paced(
        REQUESTS,
        async () => (await request(gatewayUrl, '/api/limited', { headers: { 'x-api-key': OUTAGE_KEY } })).status,
      );
      const allowed = statuses.filter((s) => s === 200).length;
      t.diagnostic(
        `workers: one connection ${singleAllowed} of ${N + 10}; spread ${allowed} of ${REQUESTS} in ${elapsedMs} ms; ${statuses.join(' ')}`,
      );
      assert.ok(
        statuses.every((s) => s === 200 || s === 429),
        statuses.join(' '),
      );
      assertWithinBound(allowed, elapsedMs, 'two workers');
      assert.deepEqual(statuses.slice(-4), [429, 429, 429, 429]);
    } finally {
      agent.destroy();
      await server.stop();
    }
  });

  it('PostgreSQL stopped: both keep serving with their own local limits, no 5xx; shared again once it is back', async (t) => {
    const pgc = cluster as PostgresCluster;
    await pgc.stop();
    let restarted = false;
    t.after(async () => {
      if (!restarted) await pgc.start();
    });
    // Each instance's first failed sync makes it count alone; sent fast, alternating, a fresh key.
    const allowed = [0, 0];
    const statuses: number[] = [];
    for (let i = 0; i < 3 * N; i++) {
      const reply = await call(instances[i % 2]!, OUTAGE_KEY);
      statuses.push(reply.status);
      if (reply.status === 200) allowed[i % 2]!++;
      if (i % 8 === 7) await new Promise((r) => setTimeout(r, 200)); // let failed syncs happen meanwhile
    }
    t.diagnostic(`while down: allowed ${allowed.join(' + ')} of ${3 * N}; statuses ${statuses.join(' ')}`);
    assert.ok(
      statuses.every((s) => s === 200 || s === 429),
      `only 200 and 429 while PostgreSQL is down: ${statuses.join(' ')}`,
    );
    // Each instance alone: its whole bucket (plus at most a token or two of refill over the run).
    for (const [i, n] of allowed.entries()) assert.ok(n >= N && n <= N + 2, `instance ${i} allowed its own ${N}: ${n}`);
    for (const instance of instances) {
      await instance.process.waitFor(
        (l) => l.msg === 'postgres unreachable: rate limits are counted by this process alone until it is back',
        5_000,
      );
      assert.equal(
        instance.process.lines.filter(
          (l) => l.msg === 'postgres unreachable: rate limits are counted by this process alone until it is back',
        ).length,
        1,
        `${instance.name} logged it once`,
      );
    }

    await pgc.start();
    restarted = true;
    // Sharing resumes at the next sync with a spend: a request on each (a token has come back meanwhile, or a 429).
    await waitFor(
      async () => {
        for (const instance of instances) {
          const reply = await call(instance, SHARED_KEY);
          assert.ok(reply.status === 200 || reply.status === 429, `${instance.name}: ${reply.status}`);
        }
        return instances.every((i) =>
          i.process.lines.some((l) => l.msg === 'postgres reachable again: rate limits are shared again'),
        );
      },
      { timeoutMs: 20_000, intervalMs: 50, what: 'every instance to log that PostgreSQL is back' },
    ); // each check spends tokens: not too often
  });
});
