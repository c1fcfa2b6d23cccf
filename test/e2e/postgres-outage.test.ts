import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { request } from '../helpers/http.js';
import { postWebhook, startInstances, stopInstances, type Instance } from '../helpers/instances.js';
import { waitFor } from '../helpers/wait.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// Issue 13: PostgreSQL restarted (pg_ctl stop -m fast, then start on the same port) under a burst
// of webhooks to two real `gatehouse start` processes. During the outage a webhook gets 202 only
// if it is committed, else 503 store_unavailable; every 202 is delivered afterwards; the same
// processes take webhooks again once Postgres is back; /api/ answers throughout.

const API_KEY = 'outage-test-key-0123456789abcdefghijklmnopq';
const SECRET = 'outage-hook-secret-0123456789';
const ENDPOINT = '/webhook/outage';
const CONCURRENCY = 24;
const OUTAGE_MS = 3_000;

const cluster = await startPostgres();
const skip = 'skip' in cluster ? cluster.skip : false;

describe('PostgreSQL restarted mid-burst', { skip, timeout: 90_000 }, () => {
  let upstream: RecordingServer;
  let target: RecordingServer;
  let instances: Instance[] = [];
  let url: string;

  before(async () => {
    url = await (cluster as PostgresCluster).createDatabase();
    upstream = await startRecordingUpstream();
    target = await startRecordingUpstream();
    instances = await startInstances(2, url, (i) => ({
      log: { level: 'info' },
      gateway: {
        listen: { host: '127.0.0.1', port: 0 },
        upstream: { target: upstream.url },
        auth: { apiKey: API_KEY },
      },
      webhooks: {
        enabled: true,
        listen: { host: '127.0.0.1', port: 0 },
        endpoints: [{ path: ENDPOINT, secret: SECRET, action: 'system-event' }],
        targets: { 'system-event': { url: `${target.url}/deliver/i${i}` } },
        delivery: { timeoutMs: 1_000, initialBackoffMs: 50, maxBackoffMs: 200 },
      },
    }));
  });

  after(async () => {
    await stopInstances(instances);
    await upstream?.close();
    await target?.close();
    if (!('skip' in cluster)) await cluster.destroy();
  });

  it('only 503 store_unavailable while it is down, every 202 delivered after, no gatehouse restart, /api/ serving throughout', async (t) => {
    const pgc = cluster as PostgresCluster;
    type Phase = 'before' | 'down' | 'after';
    let phase: Phase = 'before';
    const agents = instances.map(() => new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY }));
    t.after(() => agents.forEach((a) => a.destroy()));

    const accepted = new Map<number, string>(); // seq → event id (202)
    const counts: Record<Phase, Record<string, number>> = { before: {}, down: {}, after: {} };
    const apiStatuses: Record<Phase, number[]> = { before: [], down: [], after: [] };
    let seq = 0;
    let sending = true;

    // The burst: CONCURRENCY senders round-robin over the instances, each post a fresh event.
    const burst = Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (sending) {
          const n = seq++;
          const i = n % instances.length;
          const sentIn = phase;
          let reply;
          try {
            reply = await postWebhook(instances[i]!.hooksUrl, ENDPOINT, SECRET, { seq: n }, undefined, agents[i]);
          } catch (err) {
            // A kept-alive connection closed by the server as it was reused (its idle timeout, on a
            // loaded machine): no answer, so no promise either way. The processes are checked alive below.
            const code = (err as NodeJS.ErrnoException).code ?? String(err);
            assert.ok(code === 'ECONNRESET' || code === 'EPIPE', `seq ${n}: ${code}`);
            counts[sentIn]['no answer (connection reset)'] = (counts[sentIn]['no answer (connection reset)'] ?? 0) + 1;
            continue;
          }
          // A post sent before the stop may be answered after it, and the other way round: filed by the phase it was sent in.
          const key = reply.status === 503 ? `503 ${reply.json().error.code}` : String(reply.status);
          counts[sentIn][key] = (counts[sentIn][key] ?? 0) + 1;
          // Sent after Postgres had stopped and answered before it was started again: nothing can have
          // committed, so nothing may be 2xx. (One sent before the stop may commit and be answered after
          // it: on a loaded machine such a 202 arrived once the stop had returned, and a check by the
          // phase at answer time alone failed on it.)
          if (sentIn === 'down' && phase === 'down')
            assert.equal(reply.status, 503, `seq ${n} sent and answered while Postgres was down: ${reply.status}`);
          if (reply.status === 202) accepted.set(n, reply.json().id);
          else assert.equal(reply.status, 503, `seq ${n}: ${reply.status} ${reply.body}`);
          if (reply.status === 503) {
            assert.equal(reply.json().error.code, 'store_unavailable');
            assert.ok(reply.headers['retry-after'], '503 says when to retry');
            await new Promise((r) => setTimeout(r, 20)); // a sender backs off a little
          }
        }
      }),
    );
    // /api/ requests all along, alternating instances.
    const api = (async () => {
      let n = 0;
      while (sending) {
        const sentIn = phase;
        const reply = await request(instances[n++ % instances.length]!.gatewayUrl, '/api/ping', {
          headers: { 'x-api-key': API_KEY },
        });
        apiStatuses[sentIn].push(reply.status);
        await new Promise((r) => setTimeout(r, 25));
      }
    })();

    await waitFor(() => accepted.size >= 300, {
      timeoutMs: 20_000,
      what: () => `300 accepted before the outage; only ${accepted.size}`,
    });
    const acceptedBefore = accepted.size;
    await pgc.stop();
    phase = 'down';
    const downAt = Date.now();
    await new Promise((r) => setTimeout(r, OUTAGE_MS));
    const acceptedWhileDown = accepted.size;
    phase = 'after';
    await pgc.start();
    const upAt = Date.now();
    // Service resumes in the same processes: 202s again.
    await waitFor(() => (counts.after['202'] ?? 0) >= 200, {
      timeoutMs: 20_000,
      what: () => `200 202s after the restart: ${JSON.stringify(counts.after)}`,
    });
    const resumeMs = Date.now() - upAt;
    sending = false;
    await Promise.all([burst, api]);

    for (const instance of instances)
      assert.equal(instance.process.child.exitCode, null, `${instance.name} is still the same running process`);
    assert.ok(
      (counts.down['503 store_unavailable'] ?? 0) > 0,
      `posts were refused during the outage: ${JSON.stringify(counts.down)}`,
    );
    assert.ok(
      apiStatuses.down.length > 0 && apiStatuses.down.every((s) => s === 200),
      `/api/ served during the outage: ${apiStatuses.down}`,
    );
    assert.ok([...apiStatuses.before, ...apiStatuses.after].every((s) => s === 200));

    // No 202 lost: every one reaches the target, with the body posted for it; and the store agrees.
    const delivered = () =>
      new Map(target.received.map((r) => [JSON.parse(r.body).id as string, JSON.parse(r.body).payload.seq as number]));
    const drainStarted = Date.now();
    await waitFor(
      () => {
        const got = delivered();
        return [...accepted.values()].every((id) => got.has(id));
      },
      {
        timeoutMs: 20_000,
        what: () => {
          const got = delivered();
          return `every accepted event delivered; ${[...accepted.values()].filter((id) => !got.has(id)).length} of ${accepted.size} never were`;
        },
      },
    );
    const drainMs = Date.now() - drainStarted;
    const got = delivered();
    for (const [n, id] of accepted) assert.equal(got.get(id), n, `${id} carries seq ${n}`);
    const db = new pg.Client({ connectionString: url });
    await db.connect();
    try {
      // The target may have its request before the outcome is committed (outcomes are settled in
      // batches; one whose write failed in the outage is redelivered after its lease): wait for the store.
      let rows: { id: string; status: string }[] = [];
      const notDelivered = () =>
        [...accepted.values()].filter((id) => rows.find((r) => r.id === id)?.status !== 'delivered');
      await waitFor(
        async () => {
          rows = (await db.query<{ id: string; status: string }>('SELECT id, status FROM events')).rows;
          return notDelivered().length === 0;
        },
        {
          timeoutMs: 20_000,
          what: () =>
            `every accepted event stored as delivered; ${notDelivered().length} are not, e.g. ${notDelivered()[0]}`,
        },
      );
      // An event stored but answered 503 (COMMIT done, the answer lost with the connection) is possible; more would mean false 503s.
      t.diagnostic(
        `store: ${rows.length} events for ${accepted.size} 202s (${rows.length - accepted.size} committed as the connection died yet answered 503: a sender's retry with its delivery id is deduplicated)`,
      );
    } finally {
      await db.end();
    }
    t.diagnostic(
      `posts sent before the stop: ${JSON.stringify(counts.before)}; during the ${OUTAGE_MS} ms outage: ${JSON.stringify(counts.down)}; after: ${JSON.stringify(counts.after)}`,
    );
    t.diagnostic(
      `202s: ${acceptedBefore} before the stop, ${acceptedWhileDown - acceptedBefore} answered while pg_ctl stop ran (committed before the shutdown), ${accepted.size} in all; /api/ during the outage: ${apiStatuses.down.length} × 200`,
    );
    t.diagnostic(
      `timings: outage ${upAt - downAt} ms, 200 more 202s ${resumeMs} ms after the start, every 202 delivered ${drainMs} ms later`,
    );
  });
});
