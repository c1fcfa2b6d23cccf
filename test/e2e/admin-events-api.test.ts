import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { start, type Started } from '../helpers/admin.js';
import { request, type Reply } from '../helpers/http.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

// Issue 30, first slice: the admin events API through a real `gatehouse start`, on SQLite and on
// PostgreSQL. A target that fails until it is fixed; events die, are found, read and retried by
// ids and by filter; the target's own record says what was sent, and that nothing was sent twice.

const TOKEN = 'events-api-token-0123456789abcdef';
const HOOK_SECRET = 'events-api-hook-secret-0123456789';
const auth = { authorization: `Bearer ${TOKEN}` };
const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-events-api-'));

const cluster = await startPostgres();
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

let target: RecordingServer;
let failing = true;
before(async () => {
  target = await startRecordingUpstream((_req, res) => {
    res.writeHead(failing ? 500 : 200, { 'content-type': 'application/json' });
    res.end(failing ? '{"error":"target down"}' : '{"ok":true}');
  });
});
after(() => target.close());

function writeConfig(name: string, storage: string, admin = `{ listen: { port: 0 }, token: "${TOKEN}" }`): string {
  const file = path.join(dir, name);
  writeFileSync(
    file,
    `{
    gateway: { listen: { port: 0 }, upstream: { target: "http://127.0.0.1:1" }, auth: { apiKey: "${'k'.repeat(40)}" } },
    webhooks: { enabled: true, listen: { port: 0 },
      endpoints: [{ path: "/webhook/deploys", secret: "${HOOK_SECRET}", action: "message" },
                  { path: "/webhook/other", secret: "${HOOK_SECRET}", action: "message" }],
      targets: { message: { url: "${target.url}/hook" } },
      delivery: { maxAttempts: 2, initialBackoffMs: 20, maxBackoffMs: 50, timeoutMs: 5000 } },
    storage: ${storage},
    admin: ${admin},
  }`,
  );
  return file;
}

const json = (reply: Reply) => JSON.parse(reply.body);
const api = (s: Started, p: string, headers: Record<string, string> = auth) => request(s.admin, p, { headers });
const retry = (s: Started, body: unknown, headers: Record<string, string> = {}) =>
  request(s.admin, '/admin/api/events/retry', {
    method: 'POST',
    headers: { ...auth, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
/** Successful deliveries the target got, per event id. */
function deliveredAtTarget(): Map<string, number> {
  const counts = new Map<string, number>();
  // The recording server answers in order: a request's answer is 200 iff it came while not failing,
  // which the test switches only when nothing is in flight; so count by the body's id and the phase.
  for (const r of target.received.slice(fixedAt)) {
    const id = JSON.parse(r.body).id as string;
    counts.set(id, (counts.get(id) ?? 0) + 1);
  }
  return counts;
}
let fixedAt = 0;

for (const driver of ['sqlite', 'postgres'] as const) {
  describe(
    `admin events API (${driver})`,
    { timeout: 180_000, skip: driver === 'postgres' && 'skip' in cluster ? cluster.skip : false },
    () => {
      let s: Started;
      const ids: string[] = [];
      before(async () => {
        failing = true;
        const storage =
          driver === 'sqlite'
            ? `{ path: "${path.join(dir, 'events.db')}" }`
            : `{ driver: "postgres", url: "${await (cluster as PostgresCluster).createDatabase()}" }`;
        s = await start(writeConfig(`${driver}.json5`, storage));
        for (let i = 0; i < 6; i++) {
          const reply = await request(s.webhooks, i === 5 ? '/webhook/other' : '/webhook/deploys', {
            method: 'POST',
            headers: {
              'content-type': 'application/json',
              'x-webhook-secret': HOOK_SECRET,
              'idempotency-key': `d-${i}`,
            },
            body: JSON.stringify({ n: i, note: `needle-${i}` }),
          });
          assert.equal(reply.status, 202, reply.body);
          ids.push(json(reply).id);
        }
        await waitFor(async () => json(await api(s, '/admin/api/events?status=dead')).events.length === 6, {
          what: 'six events dead after two failed attempts each',
          timeoutMs: 60_000,
        });
      });
      after(() => s.server.stop('SIGKILL'));

      it('refuses without the token, with a wrong one, and with a token in the query string', async () => {
        for (const [p, headers] of [
          ['/admin/api/events', {}],
          ['/admin/api/events', { authorization: 'Bearer wrong-token-0123456789abcdef' }],
          [`/admin/api/events?access_token=${TOKEN}`, {}],
          [`/admin/api/events?token=${TOKEN}`, {}],
          [`/admin/api/events/${ids[0]}`, { authorization: TOKEN }],
        ] as const) {
          const reply = await api(s, p, headers);
          assert.equal(reply.status, 401, `${p} ${reply.body}`);
          assert.equal(json(reply).error.code, 'invalid_admin_token');
          assert.ok(!reply.body.includes('needle'), 'nothing of the events');
        }
        // The token in the query and the header as well: the parameter itself is refused.
        const both = await api(s, `/admin/api/events?access_token=${TOKEN}`);
        assert.equal(both.status, 400);
        assert.equal(json(both).error.code, 'invalid_parameter');
        const seen = target.received.length;
        const noToken = await request(s.admin, '/admin/api/events/retry', {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ filter: {} }),
        });
        assert.equal(noToken.status, 401);
        assert.equal(json(await api(s, '/admin/api/events?status=dead')).events.length, 6, 'still dead');
        assert.equal(target.received.length, seen, 'nothing sent');
      });

      it('lists newest first with filters, pages by cursor, and refuses bad parameters with a catalogue code', async () => {
        const all = json(await api(s, '/admin/api/events'));
        assert.deepEqual(
          all.events.map((e: { id: string }) => e.id),
          [...ids].reverse(),
        );
        assert.equal(all.nextCursor, null);
        const first = all.events[0];
        assert.deepEqual(Object.keys(first).sort(), [
          'action',
          'attempts',
          'deliveryId',
          'endpoint',
          'id',
          'lastAttemptAt',
          'lastError',
          'lastStatus',
          'receivedAt',
          'status',
        ]);
        assert.equal(first.status, 'dead');
        assert.equal(first.attempts, 2);
        assert.equal(first.lastStatus, 500);
        assert.equal(first.deliveryId, 'd-5');
        const only = async (query: string) =>
          json(await api(s, `/admin/api/events?${query}`)).events.map((e: { id: string }) => e.id);
        assert.deepEqual(await only('endpoint=/webhook/other'), [ids[5]]);
        assert.deepEqual(await only('q=d-3'), [ids[3]]);
        assert.deepEqual(await only('q=needle-4'), [ids[4]]);
        assert.deepEqual(await only(`q=${ids[2]}`), [ids[2]]);
        assert.deepEqual(await only('status=delivered'), []);
        assert.deepEqual(await only(`until=${encodeURIComponent(new Date(Date.now() - 3_600_000).toISOString())}`), []);
        const paged: string[] = [];
        let cursor: string | null = null;
        do {
          const page = json(await api(s, `/admin/api/events?limit=4${cursor ? `&cursor=${cursor}` : ''}`));
          assert.ok(page.events.length <= 4);
          paged.push(...page.events.map((e: { id: string }) => e.id));
          cursor = page.nextCursor;
        } while (cursor);
        assert.deepEqual(paged, [...ids].reverse());
        for (const [query, code] of [
          ['status=lost', 'invalid_parameter'],
          ['limit=201', 'invalid_parameter'],
          ['limit=0', 'invalid_parameter'],
          ['since=yesterday', 'invalid_parameter'],
          ['endpoint=deploys', 'invalid_parameter'],
          ['action=nope', 'invalid_parameter'],
          ['colour=red', 'invalid_parameter'],
          ['status=dead&status=queued', 'invalid_parameter'],
          ['cursor=not-a-cursor', 'invalid_cursor'],
          [`cursor=${Buffer.from('["x",1]').toString('base64url')}`, 'invalid_cursor'],
        ]) {
          const reply = await api(s, `/admin/api/events?${query}`);
          assert.equal(reply.status, 400, query);
          assert.equal(json(reply).error.code, code, query);
        }
      });

      it('shows one event: envelope, attempts with the target error; no secret; 404 for an unknown id', async () => {
        const reply = await api(s, `/admin/api/events/${ids[1]}`);
        assert.equal(reply.status, 200);
        const event = json(reply);
        assert.equal(event.id, ids[1]);
        assert.equal(event.envelope.id, ids[1]);
        assert.deepEqual(event.envelope.payload, { n: 1, note: 'needle-1' });
        assert.equal(event.attempts.length, 2);
        for (const a of event.attempts) {
          assert.equal(a.status, 500);
          assert.equal(typeof a.durationMs, 'number');
          assert.ok(!Number.isNaN(Date.parse(a.at)));
          assert.equal(a.responseSnippet, '{"error":"target down"}', "the target's answer");
        }
        assert.ok(!reply.body.includes(HOOK_SECRET), 'the webhook secret is not shown');
        assert.equal(event.headers['x-webhook-secret'], '[redacted]', 'the credential header, redacted');
        assert.equal(event.headers['idempotency-key'], 'd-1');
        for (const p of ['/admin/api/events/evt_000000000unknown', '/admin/api/events/..%2Fmetrics']) {
          const missing = await api(s, p);
          assert.equal(missing.status, 404, p);
          assert.equal(json(missing).error.code, 'event_not_found');
        }
        assert.equal(json(await api(s, '/admin/api/nothing')).error.code, 'not_found');
      });

      it('retries by ids and by filter: exact counts, each event sent once, a repeated request requeues nothing', async () => {
        failing = false;
        fixedAt = target.received.length;
        const wrongType = await request(s.admin, '/admin/api/events/retry', {
          method: 'POST',
          headers: { ...auth, 'content-type': 'text/plain' },
          body: JSON.stringify({ ids: [ids[0]] }),
        });
        assert.equal(wrongType.status, 415);
        assert.equal((await api(s, '/admin/api/events/retry')).status, 405);
        for (const body of [
          {},
          { ids: [] },
          { ids: [ids[0]], filter: {} },
          { filter: { colour: 'red' } },
          { ids: [1] },
        ]) {
          const bad = await retry(s, body);
          assert.equal(bad.status, 400, JSON.stringify(body));
          assert.equal(json(bad).error.code, 'invalid_parameter');
        }

        const byIds = { ids: [ids[0], ids[1], 'evt_unknown'] };
        const first = await retry(s, byIds, { 'idempotency-key': 'click-1' });
        assert.equal(first.status, 200, first.body);
        assert.deepEqual(json(first), { requeued: 2 });
        const again = await retry(s, byIds, { 'idempotency-key': 'click-1' });
        assert.deepEqual(json(again), { requeued: 2 }, 'the same answer for the same key');
        assert.equal(again.headers['idempotent-replayed'], 'true');
        const reused = await retry(s, { ids: [ids[2]] }, { 'idempotency-key': 'click-1' });
        assert.equal(reused.status, 422);
        assert.equal(json(reused).error.code, 'idempotency_key_reused');
        await waitFor(() => deliveredAtTarget().size === 2, {
          what: 'the two retried by id delivered',
          timeoutMs: 30_000,
        });

        const byFilter = { filter: { status: 'dead', endpoint: '/webhook/deploys' } };
        assert.deepEqual(json(await retry(s, byFilter)), { requeued: 3 });
        assert.deepEqual(json(await retry(s, byFilter)), { requeued: 0 }, 'a repeat without a key: nothing left dead');
        await waitFor(() => deliveredAtTarget().size === 5, { what: 'five delivered', timeoutMs: 30_000 });
        // The target has them; their settles are committed in batches, a moment later on a loaded machine.
        await waitFor(async () => sameCounts(await statuses(s), { dead: 1, delivered: 5 }), {
          what: () => statuses(s).then((c) => `five delivered and one dead in the store: ${JSON.stringify(c)}`),
          timeoutMs: 30_000,
        });
        assert.deepEqual(json(await retry(s, { filter: {} })), { requeued: 1 }, 'the one dead on /webhook/other');
        await waitFor(() => deliveredAtTarget().size === 6, { what: 'all six delivered', timeoutMs: 30_000 });
        assert.deepEqual(
          json(await retry(s, { filter: {} })),
          { requeued: 0 },
          'delivered ones stay without includeDelivered',
        );

        // Replayed on purpose: includeDelivered sends one delivered event again, once.
        assert.deepEqual(json(await retry(s, { ids: [ids[4]], includeDelivered: true })), { requeued: 1 });
        await waitFor(() => deliveredAtTarget().get(ids[4]!) === 2, {
          what: 'the replay delivered',
          timeoutMs: 30_000,
        });
        await waitFor(async () => (await statuses(s)).delivered === 6, { what: 'settled', timeoutMs: 30_000 });
        const counts = deliveredAtTarget();
        assert.deepEqual(
          ids.map((id) => counts.get(id)),
          [1, 1, 1, 1, 2, 1],
          'each event sent once after the fix, the replayed one twice',
        );

        // Log lines are written in batches: wait for the last retry's.
        const logged = await waitFor(
          () => {
            const lines = s.server.lines.filter((l) => l.msg === 'admin: events requeued');
            return lines.length >= 6 && lines;
          },
          { what: 'the retries logged' },
        );
        assert.ok(logged.every((l) => l.who === 'admin token'));
        assert.ok(logged.some((l) => l.ids === 3 && l.requeued === 2));
        assert.ok(logged.some((l) => l.filter?.endpoint === '/webhook/deploys' && l.requeued === 3));
        assert.ok(!JSON.stringify(s.server.lines).includes(TOKEN), 'the token is never logged');
        // A wrong token leaves a trace at the default level (outside attack: 401s were debug only).
        assert.ok(s.server.lines.some((l) => l.msg === 'admin request refused' && l.status === 401));
      });
    },
  );
}

function sameCounts(a: Record<string, number>, b: Record<string, number>): boolean {
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  return [...keys].every((k) => a[k] === b[k]);
}

async function statuses(s: Started): Promise<Record<string, number>> {
  const counts: Record<string, number> = {};
  for (const e of json(await api(s, '/admin/api/events?limit=200')).events as { status: string }[])
    counts[e.status] = (counts[e.status] ?? 0) + 1;
  return counts;
}

describe('admin events API without admin.token', { timeout: 60_000 }, () => {
  it('is refused (403 admin_api_disabled) even on loopback, while /metrics answers', async () => {
    const s = await start(
      writeConfig('no-token.json5', `{ path: "${path.join(dir, 'no-token.db')}" }`, '{ listen: { port: 0 } }'),
    );
    try {
      const reply = await request(s.admin, '/admin/api/events');
      assert.equal(reply.status, 403);
      assert.equal(json(reply).error.code, 'admin_api_disabled');
      assert.equal((await request(s.admin, '/metrics')).status, 200);
    } finally {
      await s.server.stop('SIGKILL');
    }
  });
});
