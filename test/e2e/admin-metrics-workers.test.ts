import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { jwks, scrape, sendTraffic, signGood, start, useAdminFixtures, writeConfig } from '../helpers/admin.js';
import { waitFor } from '../helpers/wait.js';
import { request } from '../helpers/http.js';

// The admin listener with gateway.workers: 2: one scrape of the primary covers both workers
// (their metrics come over IPC and are summed), and /readyz asks each worker for its keys.

useAdminFixtures();

describe('admin listener, gateway.workers: 2', () => {
  it('one scrape of the primary sums the counters of both workers', async () => {
    const s = await start(writeConfig('workers.json5', { workers: 2 }), { NODE_CLUSTER_SCHED_POLICY: 'rr' });
    try {
      const from = s.server.lines.length;
      await sendTraffic(s, 'w-1');
      await sendTraffic(s, 'w-2');
      // Both workers served some of it (round robin), so a sum of one would be short.
      await s.server.waitFor(
        () => s.server.lines.slice(from).filter((l) => l.msg === 'request' && l.worker !== undefined).length >= 16,
      );
      const workers = new Set(
        s.server.lines
          .slice(from)
          .filter((l) => l.msg === 'request' && l.worker !== undefined)
          .map((l) => l.worker),
      );
      assert.deepEqual([...workers].sort(), [1, 2]);
      await waitFor(
        async () =>
          (await scrape(s.admin)).value('gatehouse_deliveries_total{action="message",outcome="delivered"}') === 2,
        { what: 'both deliveries counted' },
      );

      const m = await scrape(s.admin);
      // The route and code labels came over IPC with the workers' snapshots.
      const requests = (labels: string) => m.value(`gatehouse_http_requests_total{${labels}}`);
      assert.equal(requests('listener="gateway",route="/api/",status="200",code="",auth="api-key"'), 8);
      assert.equal(requests('listener="gateway",route="",status="401",code="invalid_api_key",auth="none"'), 4);
      assert.equal(requests('listener="gateway",route="",status="401",code="invalid_token",auth="none"'), 2);
      assert.equal(requests('listener="gateway",route="",status="401",code="missing_credentials",auth="none"'), 2);
      assert.equal(m.value('gatehouse_auth_failures_total{method="api-key",reason="invalid_api_key"}'), 4);
      assert.equal(m.value('gatehouse_auth_failures_total{method="bearer",reason="invalid_token"}'), 2);
      assert.equal(m.value('gatehouse_auth_failures_total{method="none",reason="missing_credentials"}'), 2);
      assert.equal(m.value('gatehouse_upstream_duration_seconds_count{route="/api/"}'), 8);
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
        assert.equal(
          (await request(s.gateway, '/api/x', { headers: { authorization: `Bearer ${await signGood('bob')}` } }))
            .status,
          200,
        );
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
