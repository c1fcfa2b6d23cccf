import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { decodeCursor, listEvents, retryEvents } from '../../src/admin/deliveries.js';
import type { EventFilter, EventStore, NewEvent } from '../../src/storage/contracts/events.js';

/**
 * The operator's queries (issue 30: the admin API and `gatehouse webhooks deliveries`), part of the
 * EventStore contract: run against every driver from store-contract.ts, through the module the API
 * and the CLI share (src/admin/deliveries.ts).
 */
const T0 = Date.UTC(2024, 0, 15, 12, 0, 0);
const NOW = T0 + 1_000;

function hook(overrides: Partial<Omit<NewEvent, 'envelope'>> & { text?: string } = {}): NewEvent {
  const { text = 'hello', ...rest } = overrides;
  return {
    endpoint: '/webhook/github',
    action: 'message',
    receivedAt: T0,
    ...rest,
    envelope: (id) => JSON.stringify({ id, payload: { text } }),
  };
}

const failed = (n: number, at = T0) => ({ attempt: n, at, status: 503, error: 'HTTP 503', durationMs: 7 });

export function operatorQueriesContract(current: () => EventStore): void {
  const ids = async (filter: EventFilter, limit = 100) =>
    (await listEvents(current(), { filter, limit })).events.map((e) => e.id);

  /** One event of each state, received a millisecond apart (dead newest). */
  async function fourStates() {
    const store = current();
    const accept = async (n: number, more: Partial<Omit<NewEvent, 'envelope'>> & { text?: string } = {}) =>
      (await store.accept(hook({ receivedAt: T0 + n, ...more }))).id;
    const due = await accept(1, { endpoint: '/webhook/other', action: 'agent', idempotencyKey: 'd-due' });
    const waiting = await accept(2, { text: 'needle in a body' });
    const delivered = await accept(3, { idempotencyKey: 'd-delivered' });
    const dead = await accept(4);
    await store.recordAttempt(waiting, failed(1), { status: 'queued', nextAttemptAt: T0 + 60_000 });
    await store.recordAttempt(delivered, { ...failed(1), status: 200, error: null }, { status: 'delivered' });
    await store.recordAttempt(dead, failed(1, T0 + 10), { status: 'dead' });
    return { due, waiting, delivered, dead };
  }

  describe('operator queries: list (keyset pages) and retry by ids or filter', () => {
    it('filters by status, endpoint, action, time and q (event id, delivery id, body text); rows carry the last attempt', async () => {
      const e = await fourStates();
      assert.deepEqual(await ids({}), [e.dead, e.delivered, e.waiting, e.due]);
      assert.deepEqual(await ids({ status: 'queued' }), [e.waiting, e.due]);
      assert.deepEqual(await ids({ status: 'dead' }), [e.dead]);
      assert.deepEqual(await ids({ endpoint: '/webhook/other' }), [e.due]);
      assert.deepEqual(await ids({ action: 'agent' }), [e.due]);
      assert.deepEqual(await ids({ action: 'message', status: 'queued' }), [e.waiting]);
      // since inclusive, until exclusive
      assert.deepEqual(await ids({ since: T0 + 2, until: T0 + 4 }), [e.delivered, e.waiting]);
      assert.deepEqual(await ids({ q: e.dead }), [e.dead]);
      assert.deepEqual(await ids({ q: 'd-delivered' }), [e.delivered]);
      assert.deepEqual(await ids({ q: 'needle' }), [e.waiting]);
      assert.deepEqual(await ids({ q: 'NEEDLE' }), [], 'case-sensitive');
      assert.deepEqual(await ids({ q: '%' }), [], 'no LIKE wildcards');
      assert.deepEqual(await ids({ q: 'needle', status: 'dead' }), []);

      const [dead] = (await listEvents(current(), { filter: { status: 'dead' }, limit: 1 })).events;
      assert.equal(dead!.lastAttemptAt, T0 + 10);
      assert.equal(dead!.lastStatus, 503);
      assert.equal(dead!.lastError, 'HTTP 503');
      assert.equal(dead!.attempts, 1);
      assert.ok(!('envelope' in dead!), 'a list row has no envelope');
      const [due] = (await listEvents(current(), { filter: { q: 'd-due' }, limit: 1 })).events;
      assert.equal(due!.lastAttemptAt, null);
      assert.equal(due!.idempotencyKey, 'd-due');
    });

    it('q naming an event id or a delivery id finds those events by key, not others that mention it; a retry by that filter requeues only them', async () => {
      const e = await fourStates();
      const store = current();
      // An event whose body quotes another's id and another's delivery id.
      const quoting = (await store.accept(hook({ receivedAt: T0 + 5, text: `re ${e.dead} and d-delivered` }))).id;
      assert.deepEqual(await ids({ q: e.dead }), [e.dead]);
      assert.deepEqual(await ids({ q: 'd-delivered' }), [e.delivered]);
      assert.deepEqual(await ids({ q: e.dead, status: 'queued' }), [quoting], 'no id match under the filter: text');
      assert.deepEqual(await ids({ q: `re ${e.dead}` }), [quoting]);
      const page = await listEvents(store, { filter: { q: e.dead }, limit: 1 });
      assert.equal(page.nextCursor, null, 'the id query has one page');
      assert.equal(await retryEvents(store, { filter: { q: e.dead }, includeDelivered: false }, NOW), 1);
      assert.deepEqual(
        await ids({ status: 'queued', q: e.dead }),
        [e.dead],
        'requeued: now the id matches under the filter',
      );
    });

    it('pages newest first without duplicates or skips while newer events arrive between pages (ties broken by id)', async () => {
      const store = current();
      const initial: string[] = [];
      // 23 events over 8 distinct times: several share a millisecond.
      for (let i = 0; i < 23; i++) initial.push((await store.accept(hook({ receivedAt: T0 + (i % 8) }))).id);
      const expected = (await store.listPage({}, { limit: 100 })).map((e) => e.id);
      assert.deepEqual([...expected].sort(), [...initial].sort());
      const seen: string[] = [];
      let cursor: string | null = null;
      let pages = 0;
      do {
        const page: Awaited<ReturnType<typeof listEvents>> = await listEvents(store, {
          filter: {},
          limit: 5,
          ...(cursor && { after: decodeCursor(cursor) }),
        });
        seen.push(...page.events.map((e) => e.id));
        cursor = page.nextCursor;
        pages++;
        // Newer events arrive between pages: one later, one at the newest time already listed.
        await store.accept(hook({ receivedAt: T0 + 100 + pages }));
        await store.accept(hook({ receivedAt: T0 + 7 }));
      } while (cursor);
      assert.ok(pages >= 5, `${pages} pages`);
      const arrivedAtT7 = (await store.listPage({ until: T0 + 8, since: T0 + 7 }, { limit: 100 })).map((e) => e.id);
      // Every initial event exactly once, in order; of those that arrived later, only ones that sort after the cursor (ties at T0+7 with a smaller id) may show.
      const initialSeen = seen.filter((id) => initial.includes(id));
      assert.deepEqual(initialSeen, expected);
      assert.equal(new Set(seen).size, seen.length, 'no duplicates');
      for (const id of seen) assert.ok(initial.includes(id) || arrivedAtT7.includes(id), id);
    });

    it('retries by ids: dead and waiting become due now; due, delivered and unknown ones do not; a repeat changes nothing', async () => {
      const e = await fourStates();
      const all = { ids: [e.due, e.waiting, e.delivered, e.dead, 'evt_unknown'], includeDelivered: false };
      assert.equal(await retryEvents(current(), all, NOW), 2);
      for (const id of [e.waiting, e.dead]) {
        const { event } = (await current().get(id))!;
        assert.equal(event.status, 'queued');
        assert.equal(event.nextAttemptAt, NOW);
        assert.equal(event.roundAttempts, 0, 'a fresh attempt budget');
      }
      assert.equal((await current().get(e.delivered))!.event.status, 'delivered');
      assert.equal(await retryEvents(current(), all, NOW), 0, 'the same request again');
      assert.equal(await retryEvents(current(), all, NOW + 5), 0, 'a moment later: they are due already');
      // includeDelivered: the delivered one too, once.
      assert.equal(await retryEvents(current(), { ...all, includeDelivered: true }, NOW), 1);
      const { event } = (await current().get(e.delivered))!;
      assert.equal(event.status, 'queued');
      assert.equal(event.deliveredAt, null);
      assert.equal(await retryEvents(current(), { ...all, includeDelivered: true }, NOW), 0);
    });

    it('retries by filter in chunks: counts exact, only matching events, delivered only when asked', async () => {
      const store = current();
      const dead: string[] = [];
      for (let i = 0; i < 11; i++) {
        const endpoint = i % 3 === 0 ? '/webhook/other' : '/webhook/github';
        const id = (await store.accept(hook({ receivedAt: T0 + i, endpoint }))).id;
        await store.recordAttempt(id, failed(1), { status: 'dead' });
        dead.push(id);
      }
      const delivered = (await store.accept(hook({ receivedAt: T0 + 50 }))).id;
      await store.recordAttempt(delivered, { ...failed(1), status: 200, error: null }, { status: 'delivered' });
      const byFilter = (filter: EventFilter, includeDelivered = false) =>
        store.requeueMatching({ filter }, NOW, { includeDelivered, chunk: 3 });
      assert.equal(await byFilter({ status: 'delivered' }), 0, 'delivered ones need includeDelivered');
      assert.equal(await byFilter({ endpoint: '/webhook/other' }), 4);
      assert.deepEqual(await ids({ status: 'dead', endpoint: '/webhook/other' }), []);
      assert.equal((await ids({ status: 'dead' })).length, 7);
      assert.equal(await byFilter({ status: 'dead' }), 7, 'seven dead over three chunks');
      assert.equal(await byFilter({}), 0, 'everything is due already');
      assert.equal(await byFilter({}, true), 1, 'and the delivered one with includeDelivered');
      assert.deepEqual(await ids({ status: 'queued' }, 200), [delivered, ...[...dead].reverse()]);
    });
  });
}
