import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import { before, after, describe, it } from 'node:test';
import {
  auth,
  dir,
  KEY,
  scrape,
  sendTraffic,
  signGood,
  start,
  TOKEN,
  upstream,
  target,
  useAdminFixtures,
  WRONG_KEY,
  writeConfig,
  type Started,
} from '../helpers/admin.js';
import { waitFor } from '../helpers/wait.js';
import { request } from '../helpers/http.js';
import { DRAIN_START, runCli } from '../helpers/process.js';
import { rawExchange } from '../helpers/raw-socket.js';
import { startRecordingUpstream } from '../helpers/upstream.js';

// The admin listener (issue 14): a real `gatehouse start`, real traffic on the gateway and the
// webhook listener, then the counters as Prometheus reads them from /metrics. With workers:
// admin-metrics-workers.test.ts; on postgres: admin-readyz-postgres.test.ts.

useAdminFixtures();

describe('admin listener, one process', () => {
  let s: Started;
  before(async () => {
    s = await start(writeConfig('single.json5'));
  });
  after(() => s.server.stop('SIGKILL'));

  it('counts real traffic: requests by status and auth, auth failures by method and reason, webhooks, deliveries, the queue', async () => {
    const upstreamBefore = upstream.received.length;
    await sendTraffic(s);
    assert.equal(
      (
        await request(s.gateway, '/api/me', {
          headers: { authorization: `Bearer ${await signGood('alice@example.com')}` },
        })
      ).status,
      200,
    );
    assert.equal(upstream.received.length - upstreamBefore, 5, 'only the authenticated requests went upstream');
    await waitFor(async () => target.received.some((r) => r.body.includes('"ref":"main"')), {
      what: 'the webhook delivered to the target',
    });
    // Settled after the target answered: wait for the delivery counter rather than guess.
    await waitFor(
      async () =>
        (await scrape(s.admin)).value('gatehouse_deliveries_total{action="message",outcome="delivered"}') === 1,
      { what: 'delivery counted' },
    );

    const m = await scrape(s.admin);
    const requests = (labels: string) => m.value(`gatehouse_http_requests_total{${labels}}`);
    assert.equal(requests('listener="gateway",route="/api/",status="200",code="",auth="api-key"'), 4);
    assert.equal(requests('listener="gateway",route="/api/",status="200",code="",auth="bearer"'), 1);
    // Refused before a route was chosen: route "", the error code says why.
    assert.equal(requests('listener="gateway",route="",status="401",code="invalid_api_key",auth="none"'), 2);
    assert.equal(requests('listener="gateway",route="",status="401",code="missing_credentials",auth="none"'), 1);
    assert.equal(requests('listener="gateway",route="",status="401",code="invalid_token",auth="none"'), 1);
    assert.equal(requests('listener="webhooks",route="",status="202",code="",auth="none"'), 1);
    assert.equal(requests('listener="webhooks",route="",status="401",code="invalid_webhook_secret",auth="none"'), 1);
    assert.equal(m.value('gatehouse_request_duration_seconds_count{listener="gateway"}'), 9);
    assert.equal(m.value('gatehouse_upstream_duration_seconds_count{route="/api/"}'), 5);
    assert.equal(m.value('gatehouse_auth_failures_total{method="api-key",reason="invalid_api_key"}'), 2);
    assert.equal(m.value('gatehouse_auth_failures_total{method="none",reason="missing_credentials"}'), 1);
    assert.equal(m.value('gatehouse_auth_failures_total{method="bearer",reason="invalid_token"}'), 1);
    assert.equal(m.value('gatehouse_webhooks_received_total{endpoint="/webhook/deploys",outcome="accepted"}'), 1);
    assert.equal(m.value('gatehouse_webhooks_received_total{endpoint="/webhook/deploys",outcome="duplicate"}'), 1);
    assert.equal(
      m.value('gatehouse_webhooks_received_total{endpoint="/webhook/deploys",outcome="invalid_webhook_secret"}'),
      1,
    );
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

  it('shows a lockout while it lasts, and the requests it refused', async () => {
    // The first test already spent 3 of the 10 failures (2 wrong keys, 1 foreign token).
    const statuses: number[] = [];
    for (let i = 0; i < 12 && statuses.at(-1) !== 429; i++) {
      statuses.push((await request(s.gateway, '/api/guess', { headers: { 'x-api-key': WRONG_KEY } })).status);
    }
    assert.deepEqual(statuses, [401, 401, 401, 401, 401, 401, 401, 429]);
    const m = await scrape(s.admin);
    assert.equal(m.value('gatehouse_lockouts_active'), 1);
    assert.equal(m.value('gatehouse_auth_failures_total{method="lockout",reason="too_many_failures"}'), 1);
    assert.equal(m.value('gatehouse_auth_failures_total{method="api-key",reason="invalid_api_key"}'), 9);
    assert.equal(
      m.value(
        'gatehouse_http_requests_total{listener="gateway",route="",status="429",code="too_many_failures",auth="none"}',
      ),
      1,
    );
  });

  it('/metrics needs the token: none or a wrong one is 401 JSON, compared whatever its length', async () => {
    for (const headers of [
      {},
      { authorization: 'Bearer wrong' },
      { authorization: `Bearer ${TOKEN}x` },
      { authorization: `Basic ${TOKEN}` },
      { authorization: TOKEN },
    ]) {
      const reply = await request(s.admin, '/metrics', { headers });
      assert.equal(reply.status, 401, JSON.stringify(headers));
      assert.equal(reply.json().error.code, 'invalid_admin_token');
      assert.ok(!reply.body.includes('gatehouse_'));
    }
    assert.equal(
      (await request(s.admin, '/metrics', { headers: { authorization: `bearer ${TOKEN}` } })).status,
      200,
      'the scheme is case-insensitive',
    );
    // Two Authorization lines, the right one first (the attack review: Node's req.headers keeps only the first).
    for (const second of ['Bearer nope', `Bearer ${TOKEN}`, '']) {
      const { responses } = await rawExchange(
        s.admin,
        `GET /metrics HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer ${TOKEN}\r\nAuthorization: ${second}\r\nConnection: close\r\n\r\n`,
      );
      assert.equal(responses[0]?.status, 401, `then "${second}"`);
      assert.ok(!responses[0]!.body.includes('gatehouse_'));
    }
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
    const smuggled = await rawExchange(
      s.admin,
      'GET /healthz HTTP/1.1\r\nHost: admin\r\nContent-Length: 5\r\n\r\nhello',
    );
    assert.equal(smuggled.responses[0]?.status, 400, 'a body on GET is refused as on the other listeners');
  });

  it('/readyz is 200 when ready, then 503 naming "draining" once SIGTERM starts the drain; in-flight requests still finish', async () => {
    // Ready once its first store probe has committed: on a loaded machine (load 9) that took longer than
    // the probe's 2 s just after start, and a first /readyz asked at once was 503.
    let ready = await request(s.admin, '/readyz');
    await waitFor(async () => (ready = await request(s.admin, '/readyz')).status === 200, {
      timeoutMs: 30_000,
      what: () => `ready: ${ready.body}`,
    });
    assert.deepEqual(ready.json(), {
      status: 'ready',
      failing: [],
      checks: { store: 'ok', jwks: 'ok', draining: 'ok' },
    });
    assert.equal((await request(s.admin, '/readyz', { method: 'HEAD' })).status, 200);

    // A request the upstream holds for a while keeps the drain going.
    const slow = await startRecordingUpstream((_req, res) => setTimeout(() => res.end('late'), 1_500));
    const d = await start(writeConfig('drain.json5', { upstreamUrl: slow.url }));
    try {
      const inFlight = request(d.gateway, '/api/slow', { headers: { 'x-api-key': KEY } });
      inFlight.catch(() => {}); // awaited below; a failure must not surface as an unhandled rejection first
      await waitFor(async () => slow.received.length === 1, { what: 'the slow request reached the upstream' });
      d.server.child.kill('SIGTERM');
      await d.server.waitFor((l) => l.msg === DRAIN_START);
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

describe('admin listener: /readyz on a SQLite file the OS refuses writes to', () => {
  it('answers 503 naming "store" (found by an outside attack: a write that changed no row passed), and 200 again once writes work', async (t) => {
    const file = writeConfig('immutable.json5');
    const wal = path.join(dir, 'immutable.json5.db-wal');
    const s = await start(file);
    const immutable = (on: boolean) => execFileSync('chattr', [on ? '+i' : '-i', wal]);
    try {
      assert.equal((await request(s.admin, '/readyz')).status, 200);
      try {
        immutable(true);
      } catch (err) {
        return t.skip(
          `chattr +i is not available here (${(err as Error).message.split('\n')[0]}): nothing can make the file refuse root's writes`,
        );
      }
      // A write that worked stands for a second (probes share one fsync): then the next one fails.
      await new Promise((r) => setTimeout(r, 1_100));
      const refused = await request(s.admin, '/readyz');
      assert.equal(refused.status, 503, refused.body);
      assert.deepEqual(refused.json().failing, ['store']);
      assert.match(refused.json().checks.store, /^the store does not take writes \(/);
      immutable(false);
      await waitFor(async () => (await request(s.admin, '/readyz')).status === 200, {
        what: 'ready again once the file takes writes',
      });
    } finally {
      try {
        immutable(false);
      } catch {
        /* never set, or already cleared */
      }
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
    const withToken = writeConfig('closed.json5', {
      admin: `{ listen: { host: "0.0.0.0", port: 0 }, token: "${TOKEN}" }`,
    });
    const ok = await runCli(['config', 'check', '--config', withToken]);
    assert.equal(ok.code, 0, ok.stderr);
  });
});
