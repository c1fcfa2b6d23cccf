import assert from 'node:assert/strict';
import { once } from 'node:events';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { request } from '../helpers/http.js';
import { runCli, startServerProcess, type ServerProcess } from '../helpers/process.js';
import { rawExchange } from '../helpers/raw-socket.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// The admin listener (issue 14): real `gatehouse start` processes, real traffic on the gateway
// and the webhook listener, then the counters as Prometheus reads them from /metrics.

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-admin-'));
const KEY = 'admin-test-key-0123456789abcdefghijklmnopqrs';
const WRONG_KEY = 'admin-test-bad-0123456789abcdefghijklmnopqrs';
const TOKEN = 'admin-token-0123456789abcdef';
const HOOK_SECRET = 'admin-hook-secret-0123456789';

let upstream: RecordingServer;
let target: RecordingServer;
let jwks: { url: string; status: number; close(): Promise<void> };
let signGood: (sub: string) => Promise<string>;
let signStranger: () => Promise<string>;

before(async () => {
  upstream = await startRecordingUpstream();
  target = await startRecordingUpstream();
  const ours = await generateKeyPair('RS256');
  const stranger = await generateKeyPair('RS256');
  const jwk = { ...(await exportJWK(ours.publicKey)), kid: 'k1', alg: 'RS256', use: 'sig' };
  signGood = (sub) => new SignJWT({}).setProtectedHeader({ alg: 'RS256', kid: 'k1' }).setSubject(sub).setExpirationTime('5m').sign(ours.privateKey);
  signStranger = () => new SignJWT({}).setProtectedHeader({ alg: 'RS256', kid: 'k1' }).setSubject('mallory').setExpirationTime('5m').sign(stranger.privateKey);
  const state = { status: 200 };
  const server = http.createServer((_req, res) => {
    res.writeHead(state.status, { 'content-type': 'application/json' });
    res.end(state.status === 200 ? JSON.stringify({ keys: [jwk] }) : '{"error":"down"}');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  jwks = {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/jwks.json`,
    get status() { return state.status; },
    set status(s: number) { state.status = s; },
    close: () => new Promise((r) => server.close(() => r())),
  };
});
after(async () => {
  await Promise.all([upstream.close(), target.close(), jwks.close()]);
});

function writeConfig(name: string, options: { workers?: number; upstreamUrl?: string; admin?: string; storage?: string } = {}): string {
  const file = path.join(dir, name);
  writeFileSync(file, `{
    gateway: { listen: { port: 0 }, workers: ${options.workers ?? 1}, upstream: { target: "${options.upstreamUrl ?? upstream.url}" },
      auth: { apiKey: "${KEY}", require: "any", bearer: { jwt: { jwksUri: "${jwks.url}", jwksCooldownSeconds: 0 } } } },
    webhooks: { enabled: true, listen: { port: 0 },
      endpoints: [{ path: "/webhook/deploys", secret: "${HOOK_SECRET}", action: "message" }],
      targets: { message: { url: "${target.url}/hook" } },
      delivery: { initialBackoffMs: 50, maxBackoffMs: 100 } },
    storage: ${options.storage ?? `{ path: "${path.join(dir, name + '.db')}" }`},
    admin: ${options.admin ?? `{ listen: { port: 0 }, token: "${TOKEN}", limits: { maxHeaderCount: 20 } }`},
  }`);
  return file;
}

interface Started { server: ServerProcess; gateway: string; webhooks: string; admin: string }

async function start(file: string, env: NodeJS.ProcessEnv = {}): Promise<Started> {
  const server = startServerProcess(file, { env });
  const admin = await server.waitFor((l) => l.msg?.startsWith('admin listener'), 40_000);
  const webhooks = server.lines.find((l) => l.msg === 'webhook receiver listening')!;
  const gateway = server.lines.find((l) => l.msg === 'gateway listening' || l.msg === 'gateway workers listening')!;
  return { server, gateway: gateway.url, webhooks: webhooks.url, admin: admin.url };
}

const auth = { authorization: `Bearer ${TOKEN}` };

/** Scrapes /metrics (with the token) into `name{labels} → value`. */
async function scrape(admin: string): Promise<{ text: string; value(series: string): number | undefined }> {
  const reply = await request(admin, '/metrics', { headers: auth });
  assert.equal(reply.status, 200, reply.body);
  assert.match(String(reply.headers['content-type']), /^text\/plain; version=0\.0\.4/);
  const values = new Map<string, number>();
  for (const line of reply.body.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    values.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return { text: reply.body, value: (series) => values.get(series) };
}

/** The same traffic for both layouts: counts below are what it must produce. */
async function sendTraffic(s: Started, deliveryId = 'd-1'): Promise<void> {
  for (let i = 0; i < 4; i++) assert.equal((await request(s.gateway, `/api/items/${i}`, { headers: { 'x-api-key': KEY } })).status, 200);
  for (let i = 0; i < 2; i++) assert.equal((await request(s.gateway, '/api/items', { headers: { 'x-api-key': WRONG_KEY } })).status, 401);
  assert.equal((await request(s.gateway, '/api/items')).status, 401);
  assert.equal((await request(s.gateway, '/api/items', { headers: { authorization: `Bearer ${await signStranger()}` } })).status, 401);
  const hook = (secret: string, id: string) => request(s.webhooks, '/webhook/deploys', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-webhook-secret': secret, 'idempotency-key': id },
    body: '{"ref":"main"}',
  });
  assert.equal((await hook(HOOK_SECRET, deliveryId)).status, 202);
  assert.equal((await hook(HOOK_SECRET, deliveryId)).status, 200); // the same delivery id: a duplicate
  assert.equal((await hook('not-the-secret-0123456789', 'other')).status, 401);
}

async function waitUntil(check: () => Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('admin listener, one process', () => {
  let s: Started;
  before(async () => {
    s = await start(writeConfig('single.json5'));
  });
  after(() => s.server.stop('SIGKILL'));

  it('counts real traffic: requests by status and auth, auth failures by method and reason, webhooks, deliveries, the queue', async () => {
    const upstreamBefore = upstream.received.length;
    await sendTraffic(s);
    assert.equal((await request(s.gateway, '/api/me', { headers: { authorization: `Bearer ${await signGood('alice@example.com')}` } })).status, 200);
    assert.equal(upstream.received.length - upstreamBefore, 5, 'only the authenticated requests went upstream');
    await waitUntil(async () => target.received.some((r) => r.body.includes('"ref":"main"')), 'the webhook delivered to the target');
    // Settled after the target answered: wait for the delivery counter rather than guess.
    await waitUntil(async () => (await scrape(s.admin)).value('gatehouse_deliveries_total{action="message",outcome="delivered"}') === 1, 'delivery counted');

    const m = await scrape(s.admin);
    assert.equal(m.value('gatehouse_http_requests_total{listener="gateway",status="200",auth="api-key"}'), 4);
    assert.equal(m.value('gatehouse_http_requests_total{listener="gateway",status="200",auth="bearer"}'), 1);
    assert.equal(m.value('gatehouse_http_requests_total{listener="gateway",status="401",auth="none"}'), 4);
    assert.equal(m.value('gatehouse_http_requests_total{listener="webhooks",status="202",auth="none"}'), 1);
    assert.equal(m.value('gatehouse_http_requests_total{listener="webhooks",status="401",auth="none"}'), 1);
    assert.equal(m.value('gatehouse_request_duration_seconds_count{listener="gateway"}'), 9);
    assert.equal(m.value('gatehouse_upstream_duration_seconds_count'), 5);
    assert.equal(m.value('gatehouse_auth_failures_total{method="api-key",reason="invalid_api_key"}'), 2);
    assert.equal(m.value('gatehouse_auth_failures_total{method="none",reason="missing_credentials"}'), 1);
    assert.equal(m.value('gatehouse_auth_failures_total{method="bearer",reason="invalid_token"}'), 1);
    assert.equal(m.value('gatehouse_webhooks_received_total{endpoint="/webhook/deploys",outcome="accepted"}'), 1);
    assert.equal(m.value('gatehouse_webhooks_received_total{endpoint="/webhook/deploys",outcome="duplicate"}'), 1);
    assert.equal(m.value('gatehouse_webhooks_received_total{endpoint="/webhook/deploys",outcome="invalid_webhook_secret"}'), 1);
    assert.equal(m.value('gatehouse_deliveries_total{action="message",outcome="delivered"}'), 1);
    assert.equal(m.value('gatehouse_queue_events{action="message",status="delivered"}'), 1);
    assert.equal(m.value('gatehouse_queue_events{action="message",status="queued"}'), 0);
    assert.equal(m.value('gatehouse_queue_events{action="message",status="dead"}'), 0);
    assert.equal(m.value('gatehouse_queue_oldest_due_seconds'), 0);
    assert.equal(m.value('gatehouse_jwks_fetches_total{outcome="ok"}'), 1, 'the prefetch at start');
    assert.equal(m.value('gatehouse_lockouts_active'), 0);
    assert.ok((m.value('process_cpu_user_seconds_total') ?? 0) > 0, 'Node process metrics');
    assert.ok(m.value('nodejs_heap_size_used_bytes') !== undefined);
    // No label made from request data: no subject, key, path or client address in any series.
    for (const leak of ['alice@example.com', 'mallory', KEY, WRONG_KEY, '/api/items', '127.0.0.1', 'd-1']) {
      assert.ok(!m.text.includes(leak), `metrics contain ${leak}`);
    }
  });

  it('counts reloads (SIGHUP) by outcome', async () => {
    s.server.child.kill('SIGHUP');
    await s.server.waitFor((l) => l.msg === 'configuration reloaded');
    const m = await scrape(s.admin);
    assert.equal(m.value('gatehouse_config_reloads_total{outcome="ok"}'), 1);
  });

  it('/metrics needs the token: none or a wrong one is 401 JSON, compared whatever its length', async () => {
    for (const headers of [{}, { authorization: 'Bearer wrong' }, { authorization: `Bearer ${TOKEN}x` }, { authorization: `Basic ${TOKEN}` }, { authorization: TOKEN }]) {
      const reply = await request(s.admin, '/metrics', { headers });
      assert.equal(reply.status, 401, JSON.stringify(headers));
      assert.equal(reply.json().error.code, 'invalid_admin_token');
      assert.ok(!reply.body.includes('gatehouse_'));
    }
    assert.equal((await request(s.admin, '/metrics', { headers: { authorization: `bearer ${TOKEN}` } })).status, 200, 'the scheme is case-insensitive');
  });

  it('serves GET/HEAD on its three paths only: 404 and 405 as JSON elsewhere', async () => {
    assert.deepEqual((await request(s.admin, '/healthz')).json(), { status: 'ok' });
    const head = await request(s.admin, '/metrics', { method: 'HEAD', headers: auth });
    assert.equal(head.status, 200);
    assert.equal(head.body, '');
    const post = await request(s.admin, '/metrics', { method: 'POST', headers: auth });
    assert.equal(post.status, 405);
    assert.equal(post.headers.allow, 'GET, HEAD');
    assert.equal(post.json().error.code, 'method_not_allowed');
    for (const p of ['/', '/api/items', '/metrics/', '/webhook/deploys']) {
      const reply = await request(s.admin, p, { headers: auth });
      assert.equal(reply.status, 404, p);
      assert.equal(reply.json().error.code, 'not_found');
    }
    // Neither other listener serves the admin paths.
    assert.equal((await request(s.gateway, '/metrics')).status, 404);
    assert.equal((await request(s.webhooks, '/readyz')).status, 404);
  });

  it('sets its own parser limits: more header lines than admin.limits.maxHeaderCount is 431 over a raw socket', async () => {
    const headers = Array.from({ length: 25 }, (_, i) => `X-Filler-${i}: ${i}\r\n`).join('');
    const { responses } = await rawExchange(s.admin, `GET /healthz HTTP/1.1\r\nHost: admin\r\n${headers}\r\n`);
    assert.equal(responses[0]?.status, 431);
    assert.equal(JSON.parse(responses[0]!.body).error.code, 'request_header_fields_too_large');
    const ok = await rawExchange(s.admin, 'GET /healthz HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n');
    assert.equal(ok.responses[0]?.status, 200);
    const smuggled = await rawExchange(s.admin, 'GET /healthz HTTP/1.1\r\nHost: admin\r\nContent-Length: 5\r\n\r\nhello');
    assert.equal(smuggled.responses[0]?.status, 400, 'a body on GET is refused as on the other listeners');
  });

  it('/readyz is 200 when ready, then 503 naming "draining" once SIGTERM starts the drain; in-flight requests still finish', async () => {
    const ready = await request(s.admin, '/readyz');
    assert.equal(ready.status, 200);
    assert.deepEqual(ready.json(), { status: 'ready', failing: [], checks: { store: 'ok', jwks: 'ok', draining: 'ok' } });
    assert.equal((await request(s.admin, '/readyz', { method: 'HEAD' })).status, 200);

    // A request the upstream holds for a while keeps the drain going.
    const slow = await startRecordingUpstream((_req, res) => setTimeout(() => res.end('late'), 1_500));
    const d = await start(writeConfig('drain.json5', { upstreamUrl: slow.url }));
    try {
      const inFlight = request(d.gateway, '/api/slow', { headers: { 'x-api-key': KEY } });
      inFlight.catch(() => {}); // awaited below; a failure must not surface as an unhandled rejection first
      await waitUntil(async () => slow.received.length === 1, 'the slow request reached the upstream');
      d.server.child.kill('SIGTERM');
      await d.server.waitFor((l) => l.msg === 'shutting down: draining in-flight requests');
      const draining = await request(d.admin, '/readyz');
      assert.equal(draining.status, 503);
      assert.deepEqual(draining.json().failing, ['draining']);
      assert.equal(draining.json().checks.store, 'skipped', 'the store is being closed: not probed');
      assert.equal((await request(d.admin, '/healthz')).status, 200, 'still alive while draining');
      const reply = await inFlight;
      assert.equal(reply.status, 200);
      assert.equal(reply.body, 'late');
      // Exits by itself once drained (stop() would send a second SIGTERM, which cuts the drain short).
      const [code] = d.server.child.exitCode !== null ? [d.server.child.exitCode] : await once(d.server.child, 'exit');
      assert.equal(code, 0);
    } finally {
      await d.server.stop('SIGKILL');
      await slow.close();
    }
  });
});

describe('admin listener, gateway.workers: 2', () => {
  it('one scrape of the primary sums the counters of both workers', async () => {
    const s = await start(writeConfig('workers.json5', { workers: 2 }), { NODE_CLUSTER_SCHED_POLICY: 'rr' });
    try {
      const from = s.server.lines.length;
      await sendTraffic(s, 'w-1');
      await sendTraffic(s, 'w-2');
      // Both workers served some of it (round robin), so a sum of one would be short.
      await s.server.waitFor(() => s.server.lines.slice(from).filter((l) => l.msg === 'request' && l.worker !== undefined).length >= 16);
      const workers = new Set(s.server.lines.slice(from).filter((l) => l.msg === 'request' && l.worker !== undefined).map((l) => l.worker));
      assert.deepEqual([...workers].sort(), [1, 2]);
      await waitUntil(async () => (await scrape(s.admin)).value('gatehouse_deliveries_total{action="message",outcome="delivered"}') === 2, 'both deliveries counted');

      const m = await scrape(s.admin);
      assert.equal(m.value('gatehouse_http_requests_total{listener="gateway",status="200",auth="api-key"}'), 8);
      assert.equal(m.value('gatehouse_http_requests_total{listener="gateway",status="401",auth="none"}'), 8);
      assert.equal(m.value('gatehouse_auth_failures_total{method="api-key",reason="invalid_api_key"}'), 4);
      assert.equal(m.value('gatehouse_auth_failures_total{method="bearer",reason="invalid_token"}'), 2);
      assert.equal(m.value('gatehouse_auth_failures_total{method="none",reason="missing_credentials"}'), 2);
      assert.equal(m.value('gatehouse_upstream_duration_seconds_count'), 8);
      assert.equal(m.value('gatehouse_request_duration_seconds_count{listener="gateway"}'), 16);
      assert.equal(m.value('gatehouse_jwks_fetches_total{outcome="ok"}'), 2, 'each worker prefetched once');
      assert.equal(m.value('gatehouse_webhooks_received_total{endpoint="/webhook/deploys",outcome="accepted"}'), 2);
      assert.equal(m.value('gatehouse_webhooks_received_total{endpoint="/webhook/deploys",outcome="duplicate"}'), 2);
      assert.equal(m.value('gatehouse_queue_events{action="message",status="delivered"}'), 2);
      // Not a single series twice: the aggregation merged them.
      const names = m.text.split('\n').filter((l) => l.startsWith('# TYPE gatehouse_http_requests_total'));
      assert.equal(names.length, 1);
      assert.equal((await request(s.admin, '/readyz')).status, 200);
    } finally {
      await s.server.stop('SIGKILL');
    }
  });

  it('/readyz is 503 "jwks" while the workers have not loaded the key set', async () => {
    jwks.status = 503;
    const s = await start(writeConfig('no-keys.json5', { workers: 2 }), { NODE_CLUSTER_SCHED_POLICY: 'rr' });
    try {
      const reply = await request(s.admin, '/readyz');
      assert.equal(reply.status, 503);
      assert.deepEqual(reply.json().failing, ['jwks']);
      assert.equal(reply.json().checks.store, 'ok');
      const m = await scrape(s.admin);
      assert.equal(m.value('gatehouse_jwks_fetches_total{outcome="http_error"}'), 2);
      assert.equal(m.value('gatehouse_jwks_fetches_total{outcome="ok"}'), undefined);
      // The key set comes back: the next bearer request fetches it, and the edge is ready.
      jwks.status = 200;
      // Round robin: new connections alternate between the workers, so each one fetches.
      for (let i = 0; i < 4; i++) {
        assert.equal((await request(s.gateway, '/api/x', { headers: { authorization: `Bearer ${await signGood('bob')}` } })).status, 200);
      }
      const ready = await request(s.admin, '/readyz');
      assert.equal(ready.status, 200, ready.body);
      assert.equal((await scrape(s.admin)).value('gatehouse_jwks_fetches_total{outcome="ok"}'), 2);
    } finally {
      jwks.status = 200;
      await s.server.stop('SIGKILL');
    }
  });
});

describe('admin config', () => {
  it('a non-loopback admin address without a token is refused at admin.token', async () => {
    const file = writeConfig('open.json5', { admin: '{ listen: { host: "0.0.0.0", port: 0 } }' });
    const result = await runCli(['config', 'check', '--config', file]);
    assert.equal(result.code, 1, result.stdout + result.stderr);
    assert.match(result.stderr, /admin\.token: required when admin\.listen\.host is not loopback \(0\.0\.0\.0\)/);
    const withToken = writeConfig('closed.json5', { admin: `{ listen: { host: "0.0.0.0", port: 0 }, token: "${TOKEN}" }` });
    const ok = await runCli(['config', 'check', '--config', withToken]);
    assert.equal(ok.code, 0, ok.stderr);
  });
});
