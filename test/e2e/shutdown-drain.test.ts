import assert from 'node:assert/strict';
import { once } from 'node:events';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { request } from '../helpers/http.js';
import { DRAIN_START, startServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

// Drain without refusing (issue 28): on SIGTERM /readyz turns 503 at once while the gateway and
// the webhook receiver keep accepting new connections for shutdown.acceptGrace, each answer saying
// `Connection: close`; then they refuse, and the process exits 0 once what was in flight is answered.
// A real `gatehouse start`, real sockets, a client opening a new connection every 20 ms throughout.

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-drain-'));
const KEY = 'drain-test-key-0123456789abcdefghijklmnopqrs';
const HOOK_SECRET = 'drain-hook-secret-0123456789';
const ACCEPT_GRACE_MS = 1_500;
/** The in-flight request outlives the grace by this much: the listeners refuse while it is answered. */
const SLOW_MS = ACCEPT_GRACE_MS + 2_000;
/**
 * Probes this close to the end of the grace (as the test measures it, from its kill) may meet either
 * side of it. On a starved machine (load 12 on 2 cores) gatehouse's event loop ran 700 ms late:
 * connections the kernel had completed but gatehouse not yet accepted were reset with the listening
 * socket. Never refused, though: refusals are checked up to the end of the grace.
 */
const EDGE_MS = 900;

let upstream: RecordingServer;
let target: RecordingServer;
before(async () => {
  upstream = await startRecordingUpstream((req, res) => {
    const answer = () => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(req.url.endsWith('/slow') ? 'late' : 'ok');
    };
    if (req.url.endsWith('/slow')) setTimeout(answer, SLOW_MS);
    else answer();
  });
  target = await startRecordingUpstream();
});
after(async () => {
  await Promise.all([upstream.close(), target.close()]);
});

function writeConfig(name: string, workers: number): string {
  const file = path.join(dir, name);
  writeFileSync(
    file,
    `{
    gateway: { listen: { port: 0 }, workers: ${workers}, upstream: { target: "${upstream.url}" }, auth: { apiKey: "${KEY}" } },
    webhooks: { enabled: true, listen: { port: 0 },
      endpoints: [{ path: "/webhook/deploys", secret: "${HOOK_SECRET}", action: "message" }],
      targets: { message: { url: "${target.url}/hook" } } },
    storage: { path: "${path.join(dir, name + '.db')}" },
    admin: { listen: { port: 0 } },
    shutdown: { acceptGrace: "${ACCEPT_GRACE_MS}ms", timeout: "10s" },
  }`,
  );
  return file;
}

interface Probe {
  /** When it started (ms since the epoch); after `stop`, ms after the test sent SIGTERM (negative: before). */
  at: number;
  /** When it ended, on the same clock. */
  done: number;
  status?: number;
  connection?: string;
  /** The error's code (ECONNREFUSED, ECONNRESET, …) when no answer came. */
  error?: string;
}

/**
 * One request on a new connection that would stay open (a keep-alive agent of its own, as a load
 * balancer's pool): the answer's Connection header is the server's choice, not an echo of ours.
 */
async function probe(send: (agent: http.Agent) => Promise<{ status: number; connection?: string }>): Promise<Probe> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const at = Date.now();
  try {
    const reply = await send(agent);
    return { at, done: Date.now(), ...reply };
  } catch (err) {
    return { at, done: Date.now(), error: (err as NodeJS.ErrnoException).code ?? (err as Error).message };
  } finally {
    agent.destroy();
  }
}

/** A new connection every 20 ms until `stop()`; each probe's outcome, in the order they started. */
function probeContinuously(send: (agent: http.Agent) => Promise<{ status: number; connection?: string }>) {
  const probes: Promise<Probe>[] = [];
  let running = true;
  const loop = (async () => {
    while (running) {
      probes.push(probe(send));
      await sleep(20);
    }
  })();
  const probing = {
    /** Stops probing; the outcomes, timed from `t0`. */
    async stop(t0: number): Promise<Probe[]> {
      running = false;
      await loop;
      return (await Promise.all(probes)).map((p) => ({ ...p, at: p.at - t0, done: p.done - t0 }));
    },
  };
  return probing;
}

const describeProbes = (probes: Probe[]) =>
  probes.map((p) => `${p.at}ms:${p.error ?? `${p.status}/${p.connection}`}`).join(' ');

async function drainsWithoutRefusing(workers: number) {
  const probing: { stop(t0: number): Promise<Probe[]> }[] = [];
  const server = startServerProcess(writeConfig(`drain-${workers}.json5`, workers), {
    env: workers > 1 ? { NODE_CLUSTER_SCHED_POLICY: 'rr' } : {},
  });
  try {
    const adminLine = await server.waitFor((l) => l.msg?.startsWith('admin listener'), 40_000);
    const gatewayUrl = server.lines.find((l) => l.msg === 'gateway listening' || l.msg === 'gateway workers listening')!
      .url as string;
    const webhooksUrl = server.lines.find((l) => l.msg === 'webhook receiver listening')!.url as string;
    const adminUrl = adminLine.url as string;
    assert.equal((await request(adminUrl, '/readyz')).status, 200);

    let hooks = 0;
    const gateway = probeContinuously(async (agent) => {
      const reply = await request(gatewayUrl, '/api/fast', { headers: { 'x-api-key': KEY }, agent });
      return { status: reply.status, connection: reply.headers.connection };
    });
    const webhooks = probeContinuously(async (agent) => {
      const reply = await request(webhooksUrl, '/webhook/deploys', {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'x-webhook-secret': HOOK_SECRET,
          'idempotency-key': `h-${hooks++}`,
        },
        body: '{"ref":"main"}',
        agent,
      });
      return { status: reply.status, connection: reply.headers.connection };
    });
    const readyz = probeContinuously(async (agent) => {
      const reply = await request(adminUrl, '/readyz', { agent });
      return { status: reply.status };
    });
    probing.push(gateway, webhooks, readyz);

    // In flight before the signal: the upstream holds it past the end of the grace.
    const slowBefore = upstream.received.filter((r) => r.url.endsWith('/slow')).length;
    const slow = request(gatewayUrl, '/api/slow', { headers: { 'x-api-key': KEY } }).then(
      (reply) => ({ reply, at: Date.now() }),
      (error: Error) => ({ error, at: Date.now() }),
    );
    await waitFor(() => upstream.received.filter((r) => r.url.endsWith('/slow')).length > slowBefore, {
      what: 'the slow request reached the upstream',
    });
    await sleep(200); // a few probes before the signal: kept alive, as any answer
    const t0 = Date.now();
    server.child.kill('SIGTERM');
    const [code] = (await once(server.child, 'exit')) as [number | null];
    const exitedAt = Date.now() - t0;
    const [gatewayProbes, webhookProbes, readyzProbes] = await Promise.all([
      gateway.stop(t0),
      webhooks.stop(t0),
      readyz.stop(t0),
    ]);
    const readiness = readyzProbes.map((p) => ({ at: p.at, status: p.status ?? p.error }));
    const slowOutcome = await slow;
    const slowDoneAt = slowOutcome.at;
    assert.ok(
      'reply' in slowOutcome,
      `the request in flight at SIGTERM is answered, not cut (${'error' in slowOutcome && slowOutcome.error.message}); ` +
        `log: ${JSON.stringify(server.lines.filter((l) => l.msg !== 'request' || String(l.path).endsWith('/slow')))}`,
    );
    const slowReply = slowOutcome.reply;

    assert.equal(code, 0, 'exits 0 once drained');
    assert.equal(slowReply.status, 200, 'the request in flight at SIGTERM is answered');
    assert.equal(slowReply.body, 'late');
    assert.ok(exitedAt >= slowDoneAt - t0 - 50, `exited (${exitedAt} ms) only after the slow answer`);
    assert.ok(server.lines.some((l) => l.msg === DRAIN_START));

    // /readyz: 503 from the first moment, never 200 again.
    const first503 = readiness.find((r) => r.at >= 0 && r.status === 503);
    assert.ok(first503 && first503.at < 1_000, `readyz turned 503 at once: ${JSON.stringify(readiness)}`);
    assert.ok(
      readiness.filter((r) => r.at >= first503.at).every((r) => r.status !== 200),
      `no 200 after the first 503: ${JSON.stringify(readiness)}`,
    );

    for (const [name, probes, okStatus] of [
      ['gateway', gatewayProbes, 200],
      ['webhooks', webhookProbes, 202],
    ] as const) {
      const all = describeProbes(probes);
      const before = probes.filter((p) => p.done < 0);
      assert.ok(before.length > 0, `${name}: probes before the signal: ${all}`);
      assert.ok(
        before.every((p) => p.status === okStatus && p.connection === 'keep-alive'),
        `${name}: kept alive before the signal: ${all}`,
      );
      // The grace: every new connection accepted and answered, each answer closing its connection.
      assert.deepEqual(
        probes.filter((p) => p.at >= 0 && p.at < ACCEPT_GRACE_MS - 100 && p.error === 'ECONNREFUSED'),
        [],
        `${name}: no connection refused during the grace: ${all}`,
      );
      const inGrace = probes.filter((p) => p.at >= 0 && p.at < ACCEPT_GRACE_MS - EDGE_MS);
      assert.ok(inGrace.length >= 10, `${name}: probes throughout the grace: ${all}`);
      assert.deepEqual(
        inGrace.filter((p) => p.error !== undefined),
        [],
        `${name}: no connection failed during the grace: ${all}`,
      );
      assert.ok(
        inGrace.every((p) => p.status === okStatus),
        `${name}: every request in the grace answered ${okStatus}: ${all}`,
      );
      assert.ok(
        inGrace.filter((p) => p.at >= first503.at + 200).every((p) => p.connection === 'close'),
        `${name}: every answer once draining says Connection: close: ${all}`,
      );
      // After it: refused, while the slow request is still being answered.
      const refusedWhileDraining = probes.filter(
        (p) => p.at >= ACCEPT_GRACE_MS + EDGE_MS && p.at < slowDoneAt - t0 && p.error === 'ECONNREFUSED',
      );
      assert.ok(refusedWhileDraining.length >= 3, `${name}: refused after the grace, while draining: ${all}`);
      assert.ok(
        probes.filter((p) => p.at >= ACCEPT_GRACE_MS + EDGE_MS).every((p) => p.error !== undefined),
        `${name}: nothing answered after the grace: ${all}`,
      );
    }
  } finally {
    await Promise.all(probing.map((p) => p.stop(0)));
    await server.stop('SIGKILL');
  }
}

describe('shutdown: drain without refusing', () => {
  it('one process: the gateway and the webhook receiver accept through shutdown.acceptGrace with Connection: close, then refuse; the request in flight finishes; exit 0', async () => {
    await drainsWithoutRefusing(1);
  });

  it('gateway.workers: 2: the workers accept through the grace too', async () => {
    await drainsWithoutRefusing(2);
  });
});
