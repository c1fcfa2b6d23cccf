import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { request } from '../helpers/http.js';
import { startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// gateway.workers: the /api/ edge in several processes (node:cluster) behind one port.

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-workers-'));
const KEY = 'workers-key-0123456789abcdefghijklmnopqrstuv';
const NEW_KEY = 'workers-new-0123456789abcdefghijklmnopqrstuv';
const WRONG = 'workers-bad-0123456789abcdefghijklmnopqrstuv';

let upstream: RecordingServer;
before(async () => {
  upstream = await startRecordingUpstream();
});
after(() => upstream.close());

function writeConfig(name: string, apiKey: string, extra = ''): string {
  const file = path.join(dir, name);
  writeFileSync(
    file,
    `{ gateway: { listen: { port: 0 }, workers: 2, upstream: { target: "${upstream.url}" },
    auth: { apiKey: "${apiKey}", failures: { max: 4, windowSeconds: 60, lockoutSeconds: 60 } } }${extra} }`,
  );
  return file;
}

/**
 * Sends wrong keys on new connections (round robin: alternately to each worker) until the client
 * is locked out everywhere. Each worker checks at most its share of max 4 (2), so exactly 4 are
 * evaluated in total, and the primary, having counted 4, locks the client out of every worker.
 */
async function lockOut(server: ServerProcess, url: string): Promise<void> {
  const statuses: number[] = [];
  for (let i = 0; i < 8; i++)
    statuses.push((await request(url, '/api/guess', { headers: { 'x-api-key': WRONG } })).status);
  assert.equal(statuses.filter((s) => s === 401).length, 4, `statuses: ${statuses.join(' ')}`);
  assert.equal(statuses.filter((s) => s === 429).length, 4, `statuses: ${statuses.join(' ')}`);
  await server.waitFor(() => server.lines.filter((l) => l.error === 'invalid_api_key').length === 4);
  // The primary's verdict reaches the workers over IPC: give it a moment.
  await new Promise((r) => setTimeout(r, 200));
}

async function startCluster(file: string): Promise<{ server: ServerProcess; url: string; pids: number[] }> {
  const server = startServerProcess(file, { env: { NODE_CLUSTER_SCHED_POLICY: 'rr' } });
  const ready = await server.waitFor((l) => l.msg === 'gateway workers listening');
  return { server, url: ready.url, pids: ready.pids };
}

/** The worker numbers that logged a request line, for requests made since `from` lines. */
function servingWorkers(server: ServerProcess, from: number): Set<number> {
  return new Set(
    server.lines
      .slice(from)
      .filter((l) => l.msg === 'request')
      .map((l) => l.worker),
  );
}

const isAlive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('gateway.workers: 2', () => {
  it('serves /api/ from two processes on one port; SIGTERM stops them all', async () => {
    const { server, url, pids } = await startCluster(writeConfig('two.json5', KEY));
    assert.equal(pids.length, 2);
    const from = server.lines.length;
    const before = upstream.received.length;
    for (let i = 0; i < 8; i++) {
      const reply = await request(url, `/api/n${i}`, { headers: { 'x-api-key': KEY } }); // a new connection each
      assert.equal(reply.status, 200);
    }
    assert.equal(upstream.received.length - before, 8);
    // Request lines are flushed every 250 ms; wait for all eight.
    await server.waitFor(() => server.lines.slice(from).filter((l) => l.msg === 'request').length >= 8);
    assert.deepEqual([...servingWorkers(server, from)].sort(), [1, 2]);

    assert.equal(await server.stop('SIGTERM'), 0);
    assert.deepEqual(pids.filter(isAlive), [], 'no worker outlives the primary');
  });

  it('counts failed credentials across workers: max 4 in total locks the client out of every worker', async () => {
    const { server, url } = await startCluster(writeConfig('lockout.json5', KEY));
    try {
      await lockOut(server, url);
      const before = upstream.received.length;
      for (let i = 0; i < 4; i++) {
        const reply = await request(url, '/api/after-lockout', { headers: { 'x-api-key': KEY } });
        assert.equal(reply.status, 429, `request ${i} on a new connection`);
        assert.equal(reply.json().error.code, 'too_many_failures');
      }
      assert.equal(upstream.received.length, before, 'the upstream received nothing once locked out');
      // Logged as one process logs it: one line for the lockout (not one per worker's share, nor none).
      const locked = (l: Record<string, any>) => l.msg === 'client locked out after repeated authentication failures';
      await server.waitFor(locked);
      // A worker's own line would be written as it learnt the verdict, before it refused the four
      // requests above: once their request lines are in, so is any such line.
      await server.waitFor(
        () => server.lines.filter((l) => l.msg === 'request' && l.path === '/api/after-lockout').length === 4,
      );
      assert.deepEqual(
        server.lines.filter(locked).map((l) => [l.ip, l.seconds, l.level]),
        [['127.0.0.1', 60, 'warn']],
      );
    } finally {
      await server.stop();
    }
  });

  it('SIGHUP puts a new config in force in every worker', async () => {
    const file = writeConfig('reload.json5', KEY);
    const { server, url } = await startCluster(file);
    try {
      writeConfig('reload.json5', NEW_KEY);
      server.child.kill('SIGHUP');
      await server.waitFor((l) => l.msg === 'configuration reloaded');
      // Alternating connections reach both workers; two refusals stay under a worker's share (2) of max 4.
      for (let i = 0; i < 4; i++)
        assert.equal((await request(url, '/api/r', { headers: { 'x-api-key': NEW_KEY } })).status, 200);
      for (let i = 0; i < 2; i++)
        assert.equal((await request(url, '/api/r', { headers: { 'x-api-key': KEY } })).status, 401);
    } finally {
      await server.stop();
    }
  });

  it('a SIGHUP while the workers are still starting does not end gatehouse: the reload is made once started (found by an outside attack: exit 129, no log line)', async () => {
    const server = startServerProcess(writeConfig('early-hup.json5', KEY), {
      env: { NODE_CLUSTER_SCHED_POLICY: 'rr' },
    });
    try {
      // Before the workers are up (they take a second or more to start).
      await server.waitFor((l) => l.msg?.startsWith('gatehouse starting'));
      server.child.kill('SIGHUP');
      await server.waitFor((l) => l.msg === 'configuration reloaded');
      const ready = server.lines.find((l) => l.msg === 'gateway workers listening')!;
      assert.equal((await request(ready.url, '/api/after-early-hup', { headers: { 'x-api-key': KEY } })).status, 200);
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });

  it('a worker that dies is replaced and the port keeps serving', async () => {
    const { server, url, pids } = await startCluster(writeConfig('crash.json5', KEY));
    try {
      process.kill(pids[0]!, 'SIGKILL');
      const died = await server.waitFor((l) => l.msg === 'gateway worker died: starting a new one');
      assert.equal(died.pid, pids[0]);
      await server.waitFor((l) => l.msg === 'gateway listening' && l.worker === 3);
      for (let i = 0; i < 4; i++) {
        assert.equal((await request(url, '/api/alive', { headers: { 'x-api-key': KEY } })).status, 200);
      }
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });

  it('a replacement worker learns the lockouts already in force', async () => {
    const { server, url, pids } = await startCluster(writeConfig('relock.json5', KEY));
    try {
      await lockOut(server, url);
      process.kill(pids[0]!, 'SIGKILL');
      await server.waitFor((l) => l.msg === 'gateway listening' && l.worker === 3);
      const before = upstream.received.length;
      for (let i = 0; i < 4; i++) {
        assert.equal(
          (await request(url, '/api/after-restart', { headers: { 'x-api-key': KEY } })).status,
          429,
          `request ${i}`,
        );
      }
      assert.equal(upstream.received.length, before);
    } finally {
      await server.stop();
    }
  });

  it('a port already in use fails the start with exit 1', async () => {
    const taken = upstream.url.split(':').pop();
    const file = path.join(dir, 'taken.json5');
    writeFileSync(
      file,
      `{ gateway: { listen: { port: ${taken} }, workers: 2, upstream: { target: "${upstream.url}" }, auth: { apiKey: "${KEY}" } } }`,
    );
    const server = startServerProcess(file);
    assert.equal(await server.stop('SIGCONT'), 1); // stop() waits for the exit; SIGCONT is harmless
  });
});
