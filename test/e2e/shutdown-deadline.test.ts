import assert from 'node:assert/strict';
import type http from 'node:http';
import { after, before, describe, it } from 'node:test';
import { SHUTDOWN_CLOSE_MS } from '../../src/cli/start.js';
import { postWebhook, startInstances, stopInstances, type Instance } from '../helpers/instances.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

// SIGTERM while PostgreSQL has stalled (SIGSTOP: connections open, nothing answered) and delivery
// attempts hang on their target: the drain ends at its deadline whatever is still pending, and
// what was accepted is delivered by the next instance.

const API_KEY = 'deadline-test-key-0123456789abcdefghijklmnop';
const SECRET = 'deadline-hook-secret-0123456789';
const ENDPOINT = '/webhook/deadline';
const TIMEOUT_S = 1;
/** What closing gets after the drain, and slack for a loaded machine (the signal, the log, the exit). */
const CLOSE_BOUND_MS = SHUTDOWN_CLOSE_MS + 5_000;

const cluster = await startPostgres();
const skip = 'skip' in cluster ? cluster.skip : false;

describe('shutdown: a hard deadline after the drain', { skip, timeout: 120_000 }, () => {
  let upstream: RecordingServer;
  let target: RecordingServer;
  let url: string;
  let hanging = true;
  const held: http.ServerResponse[] = [];
  const started: Instance[] = [];

  before(async () => {
    url = await (cluster as PostgresCluster).createDatabase();
    upstream = await startRecordingUpstream();
    // Hangs every delivery while `hanging`; answers 200 after.
    target = await startRecordingUpstream((_req, res) => {
      if (hanging) held.push(res);
      else res.end('ok');
    });
  });
  after(async () => {
    await stopInstances(started);
    for (const res of held) res.destroy();
    await upstream?.close();
    await target?.close();
    if (!('skip' in cluster)) await cluster.destroy();
  });

  const start = async () => {
    const [instance] = await startInstances(1, url, () => ({
      log: { level: 'info' },
      gateway: {
        listen: { host: '127.0.0.1', port: 0 },
        upstream: { target: upstream.url },
        auth: { apiKey: API_KEY },
      },
      webhooks: {
        enabled: true,
        listen: { host: '127.0.0.1', port: 0 },
        endpoints: [{ path: ENDPOINT, secret: SECRET, action: 'message' }],
        targets: { message: { url: `${target.url}/hook` } },
        delivery: { concurrency: 2, timeoutMs: 1_000, initialBackoffMs: 50, maxBackoffMs: 200 },
      },
      shutdown: { acceptGrace: 0, timeout: `${TIMEOUT_S}s` },
    }));
    started.push(instance!);
    return instance!;
  };

  it('SIGTERM with PostgreSQL stalled and attempts in flight: the process exits within acceptGrace + 2 × timeout + a bound; a restarted instance delivers every accepted event', async () => {
    const pgc = cluster as PostgresCluster;
    const first = await start();
    const accepted: string[] = [];
    for (let i = 0; i < 6; i++) {
      const reply = await postWebhook(first.hooksUrl, ENDPOINT, SECRET, { n: i });
      assert.equal(reply.status, 202);
      accepted.push((JSON.parse(reply.body) as { id: string }).id);
    }
    await waitFor(() => held.length === 2, { what: 'two attempts hanging on the target' });
    await pgc.freeze();
    try {
      const signalled = Date.now();
      const exited = first.process.stop('SIGTERM');
      const bound = 2 * TIMEOUT_S * 1_000 + CLOSE_BOUND_MS;
      let giveUp: NodeJS.Timeout | undefined;
      const code = await Promise.race([
        exited,
        new Promise((r) => (giveUp = setTimeout(r, bound + 20_000, 'running'))),
      ]);
      clearTimeout(giveUp);
      const took = Date.now() - signalled;
      assert.notEqual(code, 'running', `still running ${took} ms after SIGTERM`);
      assert.ok(took <= bound, `exited ${took} ms after SIGTERM; the bound is ${bound} ms`);
      assert.equal(code, 1, 'a shutdown cut at its deadline exits 1');
      assert.ok(
        first.process.lines.some((l) => l.msg?.startsWith('shutdown deadline passed')),
        'what was left is logged',
      );
    } finally {
      await pgc.thaw();
    }
    hanging = false;
    for (const res of held.splice(0)) res.destroy(); // the old instance's attempts, answered by no one
    const next = await start();
    const delivered = () =>
      new Set(target.received.filter((r) => r.url === '/hook').map((r) => (JSON.parse(r.body) as { id: string }).id));
    await waitFor(() => accepted.every((id) => delivered().has(id)), {
      timeoutMs: 60_000,
      what: () => `every accepted event delivered (${[...delivered()].length} of ${accepted.length})`,
    });
    await next.process.stop('SIGTERM');
  });
});
