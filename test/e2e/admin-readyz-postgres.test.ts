import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { waitFor } from '../helpers/wait.js';
import { request } from '../helpers/http.js';
import { startServerProcess } from '../helpers/process.js';
import { startRecordingUpstream } from '../helpers/upstream.js';

// /readyz and the queue gauges on the postgres driver: the store's write probe goes to the
// database, so a stopped cluster makes the instance not ready (503 "store") until it is back.

const cluster = await startPostgres();
const skip = 'skip' in cluster ? cluster.skip : false;
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-admin-pg-'));
const SECRET = 'admin-pg-hook-secret-012345';

describe('admin /readyz on postgres', { skip, timeout: 90_000 }, () => {
  it('200 while the database takes writes, 503 "store" while it is stopped, 200 again once it is back', async () => {
    const pg = cluster as PostgresCluster;
    const url = await pg.createDatabase();
    const upstream = await startRecordingUpstream();
    // A target that refuses: the event stays queued, so the queue gauges have something to show.
    const target = await startRecordingUpstream((_req, res) => {
      res.writeHead(503);
      res.end();
    });
    const file = path.join(dir, 'pg.json5');
    writeFileSync(
      file,
      `{
      gateway: { listen: { port: 0 }, upstream: { target: "${upstream.url}" }, auth: { apiKey: "admin-pg-key-0123456789abcdefghijklmnopq" } },
      webhooks: { enabled: true, listen: { port: 0 }, endpoints: [{ path: "/webhook/pg", secret: "${SECRET}", action: "message" }],
        targets: { message: { url: "${target.url}/hook" } }, delivery: { initialBackoffMs: 60000, maxBackoffMs: 60000 } },
      storage: { driver: "postgres", url: "${url}" },
      admin: { listen: { port: 0 } },
    }`,
    );
    const server = startServerProcess(file);
    try {
      const admin = (await server.waitFor((l) => l.msg?.startsWith('admin listener'), 40_000)).url;
      const webhooks = server.lines.find((l) => l.msg === 'webhook receiver listening')!.url;
      const ready = await request(admin, '/readyz');
      assert.equal(ready.status, 200, ready.body);
      assert.equal(ready.json().checks.store, 'ok');

      const hook = await request(webhooks, '/webhook/pg', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-webhook-secret': SECRET },
        body: '{"n":1}',
      });
      assert.equal(hook.status, 202);
      await waitFor(async () => target.received.length >= 1, { timeoutMs: 15_000, what: 'the first attempt' });
      await waitFor(
        async () =>
          (await request(admin, '/metrics')).body.includes(
            'gatehouse_deliveries_total{action="message",outcome="retry"} 1',
          ),
        { timeoutMs: 15_000, what: 'the retry counted' },
      );
      const metrics = (await request(admin, '/metrics')).body;
      assert.match(metrics, /^gatehouse_queue_events\{action="message",status="queued"\} 1$/m);
      assert.match(metrics, /^gatehouse_queue_events\{action="message",status="delivered"\} 0$/m);
      assert.match(metrics, /^gatehouse_queue_oldest_due_seconds \d/m);
      assert.match(
        metrics,
        /^# HELP gatehouse_queue_oldest_due_seconds .*Store-wide: aggregate across instances with max, not sum\.$/m,
      );

      await pg.stop();
      const down = await request(admin, '/readyz');
      assert.equal(down.status, 503, down.body);
      assert.deepEqual(down.json().failing, ['store']);
      assert.match(down.json().checks.store, /^the store does not take writes/);
      assert.ok(!down.body.includes(url), 'the database URL is not in the public answer');
      // /metrics still answers (what the process itself counted), without the queue it cannot read.
      const partial = await request(admin, '/metrics');
      assert.equal(partial.status, 200);
      // Every gauge read from the store is absent, not 0 (oldest_due read 0 here: "no lag" during the outage).
      for (const gauge of ['gatehouse_queue_events', 'gatehouse_queue_oldest_due_seconds'])
        assert.doesNotMatch(partial.body, new RegExp(`^${gauge}[{ ]`, 'm'), gauge);
      assert.match(
        partial.body,
        /^gatehouse_webhooks_received_total\{endpoint="\/webhook\/pg",outcome="accepted"\} 1$/m,
      );

      await pg.start();
      await waitFor(async () => (await request(admin, '/readyz')).status === 200, {
        timeoutMs: 15_000,
        what: 'ready again after the restart',
      });
      const back = (await request(admin, '/metrics')).body;
      assert.match(back, /^gatehouse_queue_events\{action="message",status="queued"\} 1$/m);
      assert.match(back, /^gatehouse_queue_oldest_due_seconds \d/m);
    } finally {
      await server.stop('SIGKILL');
      await upstream.close();
      await target.close();
    }
  });
});
