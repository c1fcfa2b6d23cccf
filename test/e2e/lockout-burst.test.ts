import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { sign as githubSign } from '@octokit/webhooks-methods';
import { SignJWT } from 'jose';
import { startTestGatehouse, testConfig, type TestGatehouse } from '../helpers/gatehouse.js';
import { request } from '../helpers/http.js';
import { startServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// The failure lockout's bound under load: at most `max` bad credentials of one client are
// evaluated per window however concurrent its requests (many connections, pipelining, several
// worker processes), and provider-signed webhook endpoints can be neither counted nor locked.
// Every credential below is checked from outside: what a client could observe (401 = evaluated
// and wrong, 429 = refused unevaluated) and what the upstream or the store did not receive.

const MAX = 10;
const SECRET = 'burst-jwt-secret-0123456789abcdefghijklmnopqrstuvwxyz';
const WRONG_SECRET = 'not-the-jwt-secret-0123456789abcdefghijklmnopqrstu';

function hs256(secret: string, sub: string): Promise<string> {
  return new SignJWT({ sub })
    .setProtectedHeader({ alg: 'HS256' })
    .setExpirationTime('5m')
    .sign(new TextEncoder().encode(secret));
}

/** How many replies had each status, e.g. { 401: 10, 429: 240 }. */
function tally(replies: { status: number }[] | number[]): Record<number, number> {
  const counts: Record<number, number> = {};
  for (const r of replies) {
    const status = typeof r === 'number' ? r : r.status;
    counts[status] = (counts[status] ?? 0) + 1;
  }
  return counts;
}

/**
 * Opens one connection per request from `localAddress`, then writes every request in the same
 * tick, so all of them reach gatehouse before any is answered; the status and head of each answer.
 */
async function burst(
  baseUrl: string,
  requests: string[],
  localAddress: string,
): Promise<{ status: number; head: string }[]> {
  const url = new URL(baseUrl);
  const sockets = await Promise.all(
    requests.map(
      () =>
        new Promise<net.Socket>((resolve, reject) => {
          const socket = net.connect({ host: url.hostname, port: Number(url.port), localAddress }, () =>
            resolve(socket),
          );
          socket.once('error', reject);
        }),
    ),
  );
  const answers = sockets.map(
    (socket) =>
      new Promise<{ status: number; head: string }>((resolve, reject) => {
        let raw = '';
        socket.setEncoding('latin1');
        socket.on('data', (d: string) => {
          raw += d;
          const end = raw.indexOf('\r\n\r\n');
          if (end === -1) return;
          resolve({ status: Number(/^HTTP\/1\.1 (\d{3}) /.exec(raw)?.[1] ?? 0), head: raw.slice(0, end) });
          socket.destroy();
        });
        socket.on('error', reject);
        socket.on('close', () => reject(new Error('connection closed without an answer')));
      }),
  );
  sockets.forEach((socket, i) => socket.write(requests[i]!));
  return Promise.all(answers);
}

/** `count` identical requests written back to back on one connection; the statuses in order. */
function pipelined(baseUrl: string, requestText: string, count: number, localAddress: string): Promise<number[]> {
  const url = new URL(baseUrl);
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: url.hostname, port: Number(url.port), localAddress });
    let raw = '';
    const statuses = () => [...raw.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`pipelined: ${statuses().length} of ${count} answers within 15 s`));
    }, 15_000);
    const finish = () => {
      clearTimeout(timer);
      socket.destroy();
      resolve(statuses());
    };
    socket.setEncoding('latin1');
    socket.on('data', (d: string) => {
      raw += d;
      if (statuses().length >= count) finish();
    });
    socket.on('close', finish);
    socket.on('error', reject);
    socket.write(requestText.repeat(count));
  });
}

describe('lockout burst: concurrent bad bearer tokens (HS256) on one gatehouse', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  before(async () => {
    upstream = await startRecordingUpstream();
    const config = testConfig(upstream.url, {
      gateway: {
        auth: { bearer: { jwt: { secret: SECRET } }, failures: { max: MAX, windowSeconds: 60, lockoutSeconds: 60 } },
      },
    });
    delete config.gateway.auth.apiKey;
    gatehouse = await startTestGatehouse(config);
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  it("250 concurrent bad tokens from one address: at most max are evaluated (401), the rest refused (429); another address's concurrent good tokens all get in", async () => {
    // Distinct tokens, each on its own connection, all sent before any answer comes back.
    const host = new URL(gatehouse.url).host;
    const tokens = await Promise.all(Array.from({ length: 250 }, (_, i) => hs256(WRONG_SECRET, `attacker-${i}`)));
    const replies = await burst(
      gatehouse.url,
      tokens.map((token) => `GET /api/burst HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${token}\r\n\r\n`),
      '127.0.0.1',
    );
    const counts = tally(replies);
    assert.ok((counts[401] ?? 0) <= MAX, `bad tokens evaluated: ${JSON.stringify(counts)} (max ${MAX})`);
    assert.equal((counts[401] ?? 0) + (counts[429] ?? 0), 250, `every other answer is 429: ${JSON.stringify(counts)}`);
    assert.equal(counts[401], MAX, 'the client was not refused before it had used its max');
    for (const reply of replies.filter((r) => r.status === 429))
      assert.match(reply.head, /\r\nretry-after: [1-9]\d*\r\n/i);
    assert.equal(upstream.received.length, 0, 'the upstream received nothing');

    // A busy legitimate client: concurrency alone never refuses it (requests wait for a slot).
    const good = await Promise.all(Array.from({ length: 60 }, (_, i) => hs256(SECRET, `user-${i}`)));
    const served = await burst(
      gatehouse.url,
      good.map((token) => `GET /api/after-burst HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${token}\r\n\r\n`),
      '127.0.0.2',
    );
    assert.deepEqual(tally(served), { 200: 60 });
    assert.equal(upstream.received.length, 60);
    assert.equal(new Set(upstream.received.map((r) => r.headers['x-gatehouse-subject'])).size, 60);
  });

  // 16: as many as a connection may have waiting behind the one being served (src/http/listener.ts).
  it('16 bad tokens pipelined on one connection: at most max are evaluated', async () => {
    const token = await hs256(WRONG_SECRET, 'pipeliner');
    const host = new URL(gatehouse.url).host;
    const statuses = await pipelined(
      gatehouse.url,
      `GET /api/pipelined HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${token}\r\n\r\n`,
      16,
      '127.0.0.3',
    );
    const counts = tally(statuses);
    assert.ok(statuses.length > MAX, `answers: ${JSON.stringify(counts)}`);
    assert.ok((counts[401] ?? 0) <= MAX, `bad tokens evaluated: ${JSON.stringify(counts)} (max ${MAX})`);
    assert.deepEqual(Object.keys(counts).sort(), ['401', '429']);
    assert.equal(upstream.received.filter((r) => r.url === '/api/pipelined').length, 0);
  });
});

describe('lockout burst: gateway.workers 2 share one budget', () => {
  const KEY = 'burst-workers-key-0123456789abcdefghijklmnop';
  const WRONG = 'burst-workers-bad-0123456789abcdefghijklmnop';
  const WORKERS_MAX = 4;
  let upstream: RecordingServer;
  before(async () => {
    upstream = await startRecordingUpstream();
  });
  after(() => upstream.close());

  it('200 concurrent bad API keys reach both workers: at most max are evaluated in total', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-burst-'));
    const file = path.join(dir, 'workers.json5');
    writeFileSync(
      file,
      `{ gateway: { listen: { port: 0 }, workers: 2, upstream: { target: "${upstream.url}" },
      auth: { apiKey: "${KEY}", failures: { max: ${WORKERS_MAX}, windowSeconds: 60, lockoutSeconds: 60 } } } }`,
    );
    const server = startServerProcess(file, { env: { NODE_CLUSTER_SCHED_POLICY: 'rr' } });
    try {
      const { url } = await server.waitFor((l) => l.msg === 'gateway workers listening');
      // Both workers serve (round robin), so each one's share is what bounds the total.
      const replies = await Promise.all(
        Array.from({ length: 200 }, () => request(url, '/api/guess', { headers: { 'x-api-key': WRONG } })),
      );
      const counts = tally(replies);
      assert.ok(
        (counts[401] ?? 0) <= WORKERS_MAX,
        `bad keys evaluated across workers: ${JSON.stringify(counts)} (max ${WORKERS_MAX})`,
      );
      assert.ok((counts[401] ?? 0) >= 1, 'some were evaluated');
      assert.equal((counts[401] ?? 0) + (counts[429] ?? 0), 200, JSON.stringify(counts));
      await server.waitFor(() => server.lines.filter((l) => l.msg === 'request').length >= 200);
      assert.deepEqual(
        new Set(server.lines.filter((l) => l.msg === 'request').map((l) => l.worker)),
        new Set([1, 2]),
        'both workers answered',
      );
      assert.equal(upstream.received.length, 0);
      // Another client is not affected.
      assert.equal(
        (await request(url, '/api/ok', { headers: { 'x-api-key': KEY }, localAddress: '127.0.0.2' })).status,
        200,
      );
    } finally {
      await server.stop();
    }
  });
});

describe('lockout burst: provider-verified webhook endpoints are neither counted nor locked', () => {
  const GITHUB_SECRET = 'github-burst-secret-0123456789';
  const HOOK_SECRET = 'deploy-burst-secret-0123456789';
  let target: RecordingServer;
  let gatehouse: TestGatehouse;
  let hooks: string;
  before(async () => {
    target = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(
      testConfig(target.url, {
        storage: { path: path.join(mkdtempSync(path.join(tmpdir(), 'gatehouse-burst-hooks-')), 'gatehouse.db') },
        gateway: { auth: { failures: { max: 3, windowSeconds: 60, lockoutSeconds: 60 } } },
        webhooks: {
          enabled: true,
          listen: { host: '127.0.0.1', port: 0 },
          endpoints: [
            { path: '/webhook/github', verify: { type: 'github', secret: GITHUB_SECRET }, action: 'system-event' },
            { path: '/webhook/deploys', secret: HOOK_SECRET, action: 'system-event' },
          ],
          targets: { 'system-event': { url: `${target.url}/events` } },
        },
      }),
    );
    hooks = gatehouse.webhooks!.url;
  });
  after(async () => {
    await gatehouse.close();
    await target.close();
  });

  const post = (p: string, body: string, headers: Record<string, string>) =>
    request(hooks, p, {
      method: 'POST',
      body,
      headers: { 'content-type': 'application/json', ...headers },
      localAddress: '127.0.0.1',
    });
  const githubDelivery = async (id: string, secret = GITHUB_SECRET) => {
    const body = JSON.stringify({ ref: 'refs/heads/main', after: id });
    return post('/webhook/github', body, {
      'x-github-event': 'push',
      'x-github-delivery': id,
      'x-hub-signature-256': await githubSign(secret, body),
    });
  };

  it('30 bad GitHub signatures from one address do not lock it out: the next correctly signed delivery is stored (202)', async () => {
    const bad = await Promise.all(
      Array.from({ length: 30 }, (_, i) => githubDelivery(`forged-${i}`, 'the-attackers-own-repo-secret')),
    );
    assert.deepEqual(tally(bad), { 401: 30 });
    const good = await githubDelivery('genuine-1');
    assert.equal(good.status, 202, good.body);
    const { id } = good.json();
    assert.match(id, /^evt_/);
    assert.equal(good.headers['x-gatehouse-event-id'], id);
    const stored = await gatehouse.webhooks!.store.list({ limit: 100 });
    assert.deepEqual(
      stored.map((e: { id: string }) => e.id),
      [id],
      'only the genuine delivery is stored',
    );
  });

  it('a secret endpoint still locks (concurrent guesses included), and that lockout does not block the provider endpoint', async () => {
    const guesses = await Promise.all(
      Array.from({ length: 50 }, (_, i) =>
        post('/webhook/deploys', '{}', { 'x-webhook-secret': `guess-${i}-0123456789` }),
      ),
    );
    const counts = tally(guesses);
    assert.ok((counts[401] ?? 0) <= 3, `secret guesses evaluated: ${JSON.stringify(counts)}`);
    const locked = await post('/webhook/deploys', '{"deploy":1}', { 'x-webhook-secret': HOOK_SECRET });
    assert.equal(locked.status, 429);
    assert.equal(locked.json().error.code, 'too_many_failures');
    assert.ok(Number(locked.headers['retry-after']) > 0);

    const good = await githubDelivery('genuine-2');
    assert.equal(good.status, 202, "the provider endpoint is not refused by the secret endpoint's lockout");
    const stored = await gatehouse.webhooks!.store.list({ limit: 100 });
    assert.ok(stored.some((e: { id: string }) => e.id === good.json().id));
    assert.equal(stored.length, 2, 'the refused secret delivery was not stored');
  });
});
