import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import pino from 'pino';
import { startAdmin } from '../../src/admin/listener.js';
import { parseConfig } from '../../src/config/load.js';
import type { WebhookAction } from '../../src/config/schema.js';
import { MemoryLockoutStore } from '../../src/http/lockout.js';
import { lockoutControl } from '../../src/runtime/lockouts.js';
import { DELIVERED_RECOUNT_MS, DeliveredCounts } from '../../src/storage/contracts/events.js';
import { SqliteEventStore } from '../../src/storage/sqlite/events.js';
import { request } from '../helpers/http.js';
import { waitFor } from '../helpers/wait.js';

/** A recount whose answers the test gives one by one (a Map, or an Error to fail with). */
function scriptedRecount() {
  const calls: ((answer: Map<WebhookAction, number> | Error) => void)[] = [];
  const recount = () =>
    new Promise<Map<WebhookAction, number>>((resolve, reject) => {
      calls.push((answer) => (answer instanceof Error ? reject(answer) : resolve(answer)));
    });
  return { recount, calls };
}
const settle = () => new Promise((r) => setImmediate(r));
const counted = (n: number) => new Map<WebhookAction, number>([['message', n]]);

describe('DeliveredCounts (the delivered counts of /metrics)', () => {
  it('the first call waits; later ones get the last count and start a recount only once it is DELIVERED_RECOUNT_MS old', async () => {
    const { recount, calls } = scriptedRecount();
    const counts = new DeliveredCounts(recount);
    const first = counts.get(0);
    const alsoFirst = counts.get(1);
    assert.equal(calls.length, 1, 'calls meanwhile share the count under way');
    calls[0]!(counted(1));
    assert.deepEqual([await first, await alsoFirst], [counted(1), counted(1)]);
    assert.deepEqual(await counts.get(DELIVERED_RECOUNT_MS - 1), counted(1));
    assert.equal(calls.length, 1);
    assert.deepEqual(await counts.get(DELIVERED_RECOUNT_MS), counted(1), 'the last count, while the recount runs');
    assert.equal(calls.length, 2);
    calls[1]!(counted(2));
    await settle();
    assert.deepEqual(await counts.get(DELIVERED_RECOUNT_MS + 1), counted(2));
  });

  it('a failed count (the first one too) is reported, the last count kept, and tried again a full interval later, not at every call', async () => {
    const R = DELIVERED_RECOUNT_MS;
    const { recount, calls } = scriptedRecount();
    const errors: unknown[] = [];
    const counts = new DeliveredCounts(recount, (err) => errors.push(err));
    const first = counts.get(0);
    calls[0]!(new Error('statement timeout'));
    assert.equal(await first, undefined, 'no count yet: unknown');
    assert.equal(await counts.get(R - 1), undefined);
    assert.equal(calls.length, 1, 'found by review: a count that always fails ran again at every scrape');
    const second = counts.get(R);
    calls[1]!(counted(5));
    assert.deepEqual(await second, counted(5));
    assert.deepEqual(await counts.get(2 * R), counted(5));
    calls[2]!(new Error('connection lost'));
    await settle();
    assert.deepEqual(
      errors.map((e) => (e as Error).message),
      ['statement timeout', 'connection lost'],
    );
    assert.deepEqual(await counts.get(2 * R + 1), counted(5), 'the last count stands');
    assert.equal(calls.length, 3, 'no retry at once after a failure');
    await counts.get(3 * R);
    assert.equal(calls.length, 4, 'retried an interval later');
  });

  it('before the first count lands a call waits for it at most firstWaitMs, then gets undefined; the count goes on and is used once it lands', async () => {
    const { recount, calls } = scriptedRecount();
    const counts = new DeliveredCounts(recount, () => {}, 50);
    const started = Date.now();
    assert.equal(await counts.get(0), undefined, 'unknown, not 0');
    assert.ok(Date.now() - started >= 45, 'it waited for the count first');
    assert.equal(await counts.get(1), undefined);
    assert.equal(calls.length, 1, 'calls meanwhile wait for the count under way, not a new one');
    const later = Date.now();
    assert.equal(await counts.get(50), undefined);
    assert.ok(Date.now() - later < 40, 'firstWaitMs after the count started, a call no longer waits for it');
    calls[0]!(counted(7));
    await settle();
    assert.deepEqual(await counts.get(2), counted(7));
    assert.equal(calls.length, 1);
  });

  it('a clock that went back starts a recount (the age of the last count is unknown)', async () => {
    const { recount, calls } = scriptedRecount();
    const counts = new DeliveredCounts(recount);
    const first = counts.get(1_000_000);
    calls[0]!(counted(1));
    await first;
    await counts.get(1_000_000 - 3_600_000);
    assert.equal(calls.length, 2);
  });
});

describe('the first scrape after a start (a real admin listener on a real SQLite store)', () => {
  it('does not wait for a long first delivered count: queued and dead at once, delivered left out (unknown, not 0) until it is counted', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-first-scrape-'));
    const store = new SqliteEventStore(path.join(dir, 'events.db'));
    const event = (receivedAt: number) => ({
      endpoint: '/webhook/a',
      action: 'message' as const,
      receivedAt,
      envelope: () => '{}',
    });
    const delivered = (await store.accept(event(1_000))).id;
    await store.accept(event(2_000));
    await store.recordAttempt(
      delivered,
      { attempt: 1, at: 3_000, status: 200, error: null, durationMs: 1 },
      { status: 'delivered' },
    );
    // The first count runs (as one of tens of millions of events would) until the test lets it finish.
    let finishCount!: () => void;
    const countMayFinish = new Promise<void>((resolve) => (finishCount = resolve));
    const counting = store as unknown as { countDelivered(): Promise<Map<WebhookAction, number>> };
    const countDelivered = counting.countDelivered.bind(store);
    counting.countDelivered = async () => {
      await countMayFinish;
      return countDelivered();
    };
    const config = parseConfig({
      gateway: { upstream: { target: 'http://127.0.0.1:1' } },
      webhooks: {
        enabled: true,
        endpoints: [{ path: '/webhook/a', secret: 'first-scrape-secret-0123456789', action: 'message' }],
        targets: { message: { url: 'http://127.0.0.1:1/' } },
      },
      admin: { listen: { host: '127.0.0.1', port: 0 } },
    });
    const lockoutStore = new MemoryLockoutStore();
    const admin = await startAdmin(
      config,
      {
        probeGateway: async () => ({ keysLoaded: true, snapshots: [] }),
        lockoutStore,
        lockouts: lockoutControl(lockoutStore, {}),
        listeners: () => ({ gateway: 'http://127.0.0.1:1' }),
        store,
      },
      pino({ level: 'silent' }),
    );
    try {
      const first = await request(admin.url, '/metrics');
      assert.equal(first.status, 200);
      assert.match(first.body, /^gatehouse_queue_events\{action="message",status="queued"\} 1$/m);
      assert.match(first.body, /^gatehouse_queue_events\{action="message",status="dead"\} 0$/m);
      assert.doesNotMatch(first.body, /status="delivered"/, 'delivered is not known yet: no series rather than a 0');
      finishCount();
      await waitFor(
        async () =>
          /^gatehouse_queue_events\{action="message",status="delivered"\} 1$/m.test(
            (await request(admin.url, '/metrics')).body,
          ),
        { intervalMs: 50, what: 'the delivered count on /metrics' },
      );
    } finally {
      finishCount();
      await admin.close(0);
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
