import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, it } from 'node:test';
import type { WebhookAction } from '../../src/config/schema.js';
import {
  DELIVERED_RECOUNT_MS,
  IDEMPOTENCY_WINDOW_MS,
  type ClaimedEvent,
  type EventStore,
  type NewEvent,
} from '../../src/storage/contracts/events.js';
import { waitFor } from '../helpers/wait.js';
import { operatorQueriesContract } from './store-queries-contract.js';

/**
 * The EventStore contract: the same cases run against every driver (store.test.ts for SQLite,
 * test/storage/postgres-events.test.ts for PostgreSQL). Only behaviour seen through the
 * interface is asserted, plus two counts each driver answers from its own tables.
 */
export interface StoreHarness {
  driver: 'sqlite' | 'postgres';
  /** A new, empty store for one test. */
  open(): Promise<EventStore>;
  /** Another store on the same storage: what another process would see. */
  other(): Promise<EventStore>;
  countReplayKeys(): Promise<number>;
  countAttempts(eventId: string): Promise<number>;
  /** After each test: close what it opened, drop its data. */
  reset(): Promise<void>;
}

export const T0 = Date.UTC(2024, 0, 15, 12, 0, 0);
const LEASE = 30_000;
const ID = /^evt_[0-9a-z]{9}[0-9a-f]{20}$/;

/** A webhook as the receiver hands it over; the envelope records the id it was built with. */
export function event(overrides: Partial<Omit<NewEvent, 'envelope'>> = {}): NewEvent {
  return {
    endpoint: '/webhook/github',
    action: 'message',
    receivedAt: T0,
    ...overrides,
    envelope: (id) => JSON.stringify({ id, payload: { n: 1 } }),
  };
}

export function attempt(n: number, at = T0, status: number | null = 503, error: string | null = null) {
  return { attempt: n, at, status, error, durationMs: 12.4 };
}

export function eventStoreContract(harness: StoreHarness): void {
  let store: EventStore;
  const others: EventStore[] = [];

  async function other(): Promise<EventStore> {
    const second = await harness.other();
    others.push(second);
    return second;
  }

  async function acceptAt(receivedAt: number, action: WebhookAction = 'message'): Promise<string> {
    return (await store.accept(event({ receivedAt, action }))).id;
  }

  beforeEach(async () => {
    store = await harness.open();
  });

  afterEach(async () => {
    for (const s of others.splice(0)) await s.close().catch(() => {});
    await store.close().catch(() => {});
    await harness.reset();
  });

  describe('accept', () => {
    it('returns an evt_ id, builds the envelope with it, and the row is committed when it resolves', async () => {
      const result = await store.accept(event());
      assert.equal(result.duplicate, false);
      assert.match(result.id, ID);

      const row = (await (await other()).get(result.id))?.event;
      assert.ok(row, 'another connection sees the committed row');
      assert.equal(row.status, 'queued');
      assert.equal(row.receivedAt, T0);
      assert.equal(row.nextAttemptAt, T0, 'due as soon as received');
      assert.deepEqual(JSON.parse(row.envelope), { id: result.id, payload: { n: 1 } });
    });

    it('a second store on the same storage reads the event back', async () => {
      const { id } = await store.accept(event({ idempotencyKey: 'delivery-1' }));
      const second = await other();
      const got = await second.get(id);
      assert.ok(got);
      assert.deepEqual(got.event, {
        id,
        endpoint: '/webhook/github',
        action: 'message',
        idempotencyKey: 'delivery-1',
        receivedAt: T0,
        envelope: JSON.stringify({ id, payload: { n: 1 } }),
        status: 'queued',
        attempts: 0,
        roundAttempts: 0,
        nextAttemptAt: T0,
        lastError: null,
        deliveredAt: null,
      });
      assert.deepEqual(got.attempts, []);
      assert.equal(got.headers, null, 'none given, none stored');
    });

    it('keeps the received headers given with the event, as given (group-committed with others that have none)', async () => {
      const headers = JSON.stringify({
        'content-type': 'application/json',
        'x-webhook-secret': '[redacted]',
        é: 'ü €',
      });
      const [withHeaders, without] = await Promise.all([
        store.accept(event({ headers, idempotencyKey: 'h-1' })),
        store.accept(event({ idempotencyKey: 'h-2' })),
      ]);
      const second = await other();
      assert.equal((await second.get(withHeaders.id))?.headers, headers);
      assert.equal((await second.get(without.id))?.headers, null);
      // The deliverer's view carries no headers: the claimed row is the delivery's, not the operator's.
      const claimed = await store.claimDue(T0, 10, LEASE, 'message');
      assert.equal(claimed.length, 2);
      for (const e of claimed) assert.equal('headers' in e, false);
    });

    it('keeps the trace context an event was received in for its deliverer: handed over from memory, and read back after a release (null where none)', async () => {
      const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
      const [traced, untraced] = await Promise.all([
        store.accept(event({ traceContext: traceparent, idempotencyKey: 't-1' })),
        store.accept(event({ idempotencyKey: 't-2' })),
      ]);
      const contexts = (claimed: ClaimedEvent[]) => new Map(claimed.map((e) => [e.id, e.traceContext ?? null]));
      const fresh = contexts(await store.claimDue(T0, 10, LEASE, 'message'));
      assert.deepEqual([fresh.get(traced.id), fresh.get(untraced.id)], [traceparent, null]);
      assert.equal(await store.releaseLeases(), 2);
      const stored = contexts(await store.claimDue(T0, 10, LEASE, 'message'));
      assert.deepEqual([stored.get(traced.id), stored.get(untraced.id)], [traceparent, null]);
    });

    it('stores every one of many accepts made in the same tick (group commit), with distinct ids', async () => {
      const count = 250;
      const results = await Promise.all(
        Array.from({ length: count }, (_, i) =>
          store.accept(event({ receivedAt: T0 + (i % 3), idempotencyKey: `k${i}` })),
        ),
      );
      const ids = new Set(results.map((r) => r.id));
      assert.equal(ids.size, count);
      assert.ok(results.every((r) => !r.duplicate && ID.test(r.id)));
      const rows = await (await other()).list({ limit: 1000 });
      assert.equal(rows.length, count);
      assert.deepEqual(new Set(rows.map((r) => r.id)), ids);
    });

    it('ids sort by time of receipt', async () => {
      const later = await acceptAt(T0 + 1);
      const earlier = await acceptAt(T0);
      const much = await acceptAt(T0 + 86_400_000 * 400);
      assert.deepEqual([much, later, earlier].sort(), [earlier, later, much]);
    });

    it('commits accepts still pending when close() is called', async () => {
      const pending = store.accept(event());
      await store.close();
      const { id } = await pending;
      assert.ok(await (await other()).get(id));
    });

    it('rejects after close() (so the receiver can answer 503)', async () => {
      await store.close();
      await assert.rejects(store.accept(event()));
      await assert.rejects(store.accept(event({ idempotencyKey: 'k' })));
    });
  });

  describe('idempotency', () => {
    it('the same (endpoint, key) within 24 h is a duplicate carrying the original id, and stores nothing', async () => {
      let built = 0;
      const original = await store.accept(event({ idempotencyKey: 'gh-1' }));
      const repeat = await store.accept({
        ...event({ idempotencyKey: 'gh-1', receivedAt: T0 + IDEMPOTENCY_WINDOW_MS - 1 }),
        envelope: (id) => (built++, id),
      });
      assert.deepEqual(repeat, { id: original.id, duplicate: true });
      assert.equal(built, 0, 'no envelope built for a duplicate');
      assert.equal((await store.list({})).length, 1);
    });

    it('repeats inside one group commit are recognised too', async () => {
      const [a, b, c] = await Promise.all([
        store.accept(event({ idempotencyKey: 'same' })),
        store.accept(event({ idempotencyKey: 'same' })),
        store.accept(event({ idempotencyKey: 'same', endpoint: '/webhook/other' })),
      ]);
      assert.equal(a!.duplicate, false);
      assert.deepEqual(b, { id: a!.id, duplicate: true });
      assert.equal(c!.duplicate, false);
      assert.notEqual(c!.id, a!.id);
    });

    it('the same key on a different endpoint is a new event', async () => {
      const first = await store.accept(event({ idempotencyKey: 'k' }));
      const other = await store.accept(event({ idempotencyKey: 'k', endpoint: '/webhook/stripe' }));
      assert.equal(other.duplicate, false);
      assert.notEqual(other.id, first.id);
    });

    it('events without a key are never duplicates', async () => {
      const a = await store.accept(event());
      const b = await store.accept(event());
      assert.equal(b.duplicate, false);
      assert.notEqual(a.id, b.id);
    });

    it('after the 24 h window the key is a new event, which then becomes the one repeats map to', async () => {
      const first = await store.accept(event({ idempotencyKey: 'k' }));
      const later = T0 + IDEMPOTENCY_WINDOW_MS + 1;
      const second = await store.accept(event({ idempotencyKey: 'k', receivedAt: later }));
      assert.equal(second.duplicate, false);
      assert.notEqual(second.id, first.id);
      const third = await store.accept(event({ idempotencyKey: 'k', receivedAt: later + 1_000 }));
      assert.deepEqual(third, { id: second.id, duplicate: true });
      // The first event is kept (it may still be delivering), only its key is forgotten.
      assert.equal((await store.get(first.id))?.event.idempotencyKey, null);
      assert.equal((await store.get(second.id))?.event.idempotencyKey, 'k');
    });

    it('exactly 24 h later is already outside the window', async () => {
      const first = await store.accept(event({ idempotencyKey: 'k' }));
      const again = await store.accept(event({ idempotencyKey: 'k', receivedAt: T0 + IDEMPOTENCY_WINDOW_MS }));
      assert.equal(again.duplicate, false);
      assert.notEqual(again.id, first.id);
    });
  });

  describe('replay keys (signed requests without a timestamp)', () => {
    it('the same (endpoint, replay key) is a duplicate of the first event under any delivery id, long after the idempotency window', async () => {
      let built = 0;
      const original = await store.accept(event({ idempotencyKey: 'delivery-1', replayKey: 'sig-1' }));
      for (const [idempotencyKey, receivedAt] of [
        ['delivery-2', T0 + 1],
        [undefined, T0 + 2],
        ['delivery-1', T0 + IDEMPOTENCY_WINDOW_MS * 30],
      ] as const) {
        const replay = await store.accept({
          ...event({ idempotencyKey, replayKey: 'sig-1', receivedAt }),
          envelope: (id) => (built++, id),
        });
        assert.deepEqual(replay, { id: original.id, duplicate: true }, `${idempotencyKey} at +${receivedAt - T0} ms`);
      }
      assert.equal(built, 0, 'no envelope built for a replay');
      assert.equal((await store.list({})).length, 1);
    });

    it('a replay under a new delivery id leaves that id unremembered', async () => {
      await store.accept(event({ idempotencyKey: 'delivery-1', replayKey: 'sig-1' }));
      assert.equal((await store.accept(event({ idempotencyKey: 'delivery-2', replayKey: 'sig-1' }))).duplicate, true);
      const fresh = await store.accept(event({ idempotencyKey: 'delivery-2', replayKey: 'sig-2' }));
      assert.equal(fresh.duplicate, false, 'delivery-2 was not stored by the replay');
    });

    it('is per endpoint; a different key, or none, is a new event', async () => {
      const first = await store.accept(event({ replayKey: 'sig' }));
      const otherEndpoint = await store.accept(event({ replayKey: 'sig', endpoint: '/webhook/whatsapp' }));
      const otherKey = await store.accept(event({ replayKey: 'sig-b' }));
      const none = await store.accept(event());
      assert.ok([otherEndpoint, otherKey, none].every((r) => !r.duplicate && r.id !== first.id));
      assert.deepEqual(await store.accept(event({ replayKey: 'sig', endpoint: '/webhook/whatsapp' })), {
        id: otherEndpoint.id,
        duplicate: true,
      });
    });

    it('repeats inside one group commit are recognised too', async () => {
      const [a, b] = await Promise.all([
        store.accept(event({ idempotencyKey: 'x', replayKey: 'same' })),
        store.accept(event({ idempotencyKey: 'y', replayKey: 'same' })),
      ]);
      assert.equal(a!.duplicate, false);
      assert.deepEqual(b, { id: a!.id, duplicate: true });
    });

    it('purging the delivered event forgets its replay key with it', async () => {
      const { id } = await store.accept(event({ replayKey: 'sig' }));
      await store.recordAttempt(id, attempt(1, T0, 200), { status: 'delivered' });
      assert.deepEqual(await store.purgeDelivered(T0 + 10_000, T0 + 10_000), { purged: 1, keptInWindow: 0 });
      assert.equal(await harness.countReplayKeys(), 0);
      assert.equal((await store.accept(event({ replayKey: 'sig', receivedAt: T0 + 20_000 }))).duplicate, false);
    });

    it('an envelope that throws writes nothing: an expired delivery id is not forgotten, no replay key is left', async () => {
      const first = await store.accept(event({ idempotencyKey: 'k' }));
      const failing = store.accept({
        ...event({ idempotencyKey: 'k', replayKey: 'sig', receivedAt: T0 + IDEMPOTENCY_WINDOW_MS + 1 }),
        envelope: () => {
          throw new Error('boom');
        },
      });
      await assert.rejects(failing, /boom/);
      assert.equal((await store.get(first.id))?.event.idempotencyKey, 'k');
      assert.equal(
        (await store.accept(event({ replayKey: 'sig', receivedAt: T0 + IDEMPOTENCY_WINDOW_MS + 2 }))).duplicate,
        false,
      );
    });
  });

  describe('claimDue', () => {
    it('leases: a second claim before the lease ends gets nothing; at its end the event is claimable again', async () => {
      const id = await acceptAt(T0);
      const first = await store.claimDue(T0, 10, LEASE, 'message');
      assert.deepEqual(
        first.map((e) => e.id),
        [id],
      );
      assert.deepEqual(await store.claimDue(T0 + 1, 10, LEASE, 'message'), []);
      assert.deepEqual(await store.claimDue(T0 + LEASE - 1, 10, LEASE, 'message'), []);
      const again = await store.claimDue(T0 + LEASE, 10, LEASE, 'message');
      assert.deepEqual(
        again.map((e) => e.id),
        [id],
      );
    });

    it('only returns events of the requested action', async () => {
      const message = await acceptAt(T0, 'message');
      const agent = await acceptAt(T0, 'agent');
      assert.deepEqual(
        (await store.claimDue(T0, 10, LEASE, 'system-event')).map((e) => e.id),
        [],
      );
      assert.deepEqual(
        (await store.claimDue(T0, 10, LEASE, 'agent')).map((e) => e.id),
        [agent],
      );
      assert.deepEqual(
        (await store.claimDue(T0, 10, LEASE, 'message')).map((e) => e.id),
        [message],
      );
    });

    it('only returns events whose next attempt is due, earliest first, up to the limit', async () => {
      const late = await acceptAt(T0 + 5_000);
      const early = await acceptAt(T0 + 1_000);
      const mid = await acceptAt(T0 + 2_000);
      assert.deepEqual(await store.claimDue(T0, 10, LEASE, 'message'), []);
      assert.deepEqual(
        (await store.claimDue(T0 + 2_000, 1, LEASE, 'message')).map((e) => e.id),
        [early],
      );
      assert.deepEqual(
        (await store.claimDue(T0 + 2_000, 10, LEASE, 'message')).map((e) => e.id),
        [mid],
      );
      assert.deepEqual(
        (await store.claimDue(T0 + 4_999, 10, LEASE, 'message')).map((e) => e.id),
        [],
      );
      assert.deepEqual(
        (await store.claimDue(T0 + 5_000, 10, LEASE, 'message')).map((e) => e.id),
        [late],
      );
    });

    it('never returns delivered or dead events', async () => {
      const delivered = await acceptAt(T0);
      const dead = await acceptAt(T0);
      await store.recordAttempt(delivered, attempt(1, T0, 200), { status: 'delivered' });
      await store.recordAttempt(dead, attempt(1, T0, 400), { status: 'dead' });
      assert.deepEqual(await store.claimDue(T0 + 10 * LEASE, 10, LEASE, 'message'), []);
    });
  });

  describe('recordAttempt', () => {
    it('delivered: status, counters, no error, deliveredAt, and the attempt listed by get()', async () => {
      const id = await acceptAt(T0);
      await store.claimDue(T0, 1, LEASE, 'message');
      await store.recordAttempt(id, attempt(1, T0 + 100, 204), { status: 'delivered' });
      const got = await store.get(id);
      assert.ok(got);
      assert.equal(got.event.status, 'delivered');
      assert.equal(got.event.attempts, 1);
      assert.equal(got.event.roundAttempts, 1);
      assert.equal(got.event.lastError, null);
      assert.equal(got.event.deliveredAt, T0 + 100 + 12);
      assert.deepEqual(got.attempts, [
        { attempt: 1, at: T0 + 100, status: 204, error: null, durationMs: 12, responseSnippet: null },
      ]);
    });

    it("keeps each attempt's response snippet (settled in one batch), null where none came", async () => {
      const ids = [await acceptAt(T0), await acceptAt(T0 + 1), await acceptAt(T0 + 2)];
      await store.claimDue(T0 + 10, 3, LEASE, 'message');
      const snippet = `{"error":"busy"} ✓ <b>\n\t`;
      await Promise.all([
        store.recordAttempt(ids[0]!, { ...attempt(1, T0 + 100, 503), responseSnippet: snippet }, { status: 'dead' }),
        store.recordAttempt(ids[1]!, { ...attempt(1, T0 + 100, 204), responseSnippet: null }, { status: 'delivered' }),
        store.recordAttempt(ids[2]!, attempt(1, T0 + 100, null, 'ECONNREFUSED'), { status: 'dead' }),
      ]);
      const second = await other();
      assert.deepEqual(
        (await second.get(ids[0]!))?.attempts.map((a) => a.responseSnippet),
        [snippet],
      );
      assert.deepEqual(
        (await second.get(ids[1]!))?.attempts.map((a) => a.responseSnippet),
        [null],
      );
      assert.deepEqual(
        (await second.get(ids[2]!))?.attempts.map((a) => a.responseSnippet),
        [null],
      );
    });

    it('queued: next attempt time set, lease freed, lastError from the status or the error', async () => {
      const id = await acceptAt(T0);
      await store.claimDue(T0, 1, LEASE, 'message');
      await store.recordAttempt(id, attempt(1, T0, 503), { status: 'queued', nextAttemptAt: T0 + 2_000 });
      let got = await store.get(id);
      assert.equal(got?.event.status, 'queued');
      assert.equal(got?.event.nextAttemptAt, T0 + 2_000);
      assert.equal(got?.event.lastError, 'HTTP 503');
      assert.equal(await store.nextDueAt(T0), T0 + 2_000);
      // The lease taken at T0 would last until T0 + LEASE; settling freed it.
      assert.deepEqual(await store.claimDue(T0 + 1_999, 1, LEASE, 'message'), []);
      assert.deepEqual(
        (await store.claimDue(T0 + 2_000, 1, LEASE, 'message')).map((e) => e.id),
        [id],
      );

      await store.recordAttempt(id, attempt(2, T0 + 2_000, null, 'ECONNREFUSED: connect ECONNREFUSED'), {
        status: 'queued',
        nextAttemptAt: T0 + 6_000,
      });
      got = await store.get(id);
      assert.equal(got?.event.attempts, 2);
      assert.equal(got?.event.roundAttempts, 2);
      assert.equal(got?.event.lastError, 'ECONNREFUSED: connect ECONNREFUSED');
      assert.deepEqual(
        got?.attempts.map((a) => [a.attempt, a.status, a.error]),
        [
          [1, 503, null],
          [2, null, 'ECONNREFUSED: connect ECONNREFUSED'],
        ],
      );
    });

    it('dead: status dead with the last error, and no longer due', async () => {
      const id = await acceptAt(T0);
      await store.recordAttempt(id, attempt(1, T0, 410), { status: 'dead' });
      const got = await store.get(id);
      assert.equal(got?.event.status, 'dead');
      assert.equal(got?.event.lastError, 'HTTP 410');
      assert.equal(got?.event.deliveredAt, null);
      assert.equal(await store.nextDueAt(T0), undefined);
    });

    it('rejects a repeated attempt number without changing the event', async () => {
      const id = await acceptAt(T0);
      await store.recordAttempt(id, attempt(1), { status: 'queued', nextAttemptAt: T0 + 1 });
      await assert.rejects(store.recordAttempt(id, attempt(1, T0, 200), { status: 'delivered' }));
      const got = await store.get(id);
      assert.equal(got?.event.status, 'queued', 'the transaction rolled back');
      assert.equal(got?.event.attempts, 1);
    });
  });

  describe('requeue', () => {
    it('a dead event gets a fresh round but keeps its attempt numbering', async () => {
      const id = await acceptAt(T0);
      await store.recordAttempt(id, attempt(1), { status: 'queued', nextAttemptAt: T0 + 1_000 });
      await store.recordAttempt(id, attempt(2, T0 + 1_000), { status: 'dead' });
      assert.equal(await store.requeue(id, T0 + 60_000), true);

      let got = await store.get(id);
      assert.equal(got?.event.status, 'queued');
      assert.equal(got?.event.roundAttempts, 0);
      assert.equal(got?.event.attempts, 2);
      assert.equal(got?.event.nextAttemptAt, T0 + 60_000);
      assert.deepEqual(
        (await store.claimDue(T0 + 60_000, 1, LEASE, 'message')).map((e) => e.id),
        [id],
      );

      // The deliverer numbers the next attempt attempts + 1: it must not collide with attempt 2.
      await store.recordAttempt(id, attempt(got!.event.attempts + 1, T0 + 60_000, 200), { status: 'delivered' });
      got = await store.get(id);
      assert.equal(got?.event.status, 'delivered');
      assert.equal(got?.event.attempts, 3);
      assert.equal(got?.event.roundAttempts, 1);
      assert.deepEqual(
        got?.attempts.map((a) => a.attempt),
        [1, 2, 3],
      );
    });

    it('a queued event waiting for its retry is due now, with a fresh round (a copied queue need not wait out its backoff)', async () => {
      const id = await acceptAt(T0);
      await store.recordAttempt(id, attempt(1), { status: 'queued', nextAttemptAt: T0 + 60_000 });
      assert.deepEqual(await store.claimDue(T0 + 10_000, 1, LEASE, 'message'), [], 'not due yet');
      assert.equal(await store.requeue(id, T0 + 10_000), true);
      const got = await store.get(id);
      assert.deepEqual(
        [got?.event.status, got?.event.nextAttemptAt, got?.event.roundAttempts, got?.event.attempts],
        ['queued', T0 + 10_000, 0, 1],
      );
      assert.deepEqual(
        (await store.claimDue(T0 + 10_000, 1, LEASE, 'message')).map((e) => e.id),
        [id],
      );
    });

    it('requeueWaiting makes every queued event waiting for a retry due now, and nothing else', async () => {
      const [waiting, waitingAgent, due, delivered, dead] = [
        await acceptAt(T0),
        await acceptAt(T0, 'agent'),
        await acceptAt(T0),
        await acceptAt(T0),
        await acceptAt(T0),
      ];
      await store.recordAttempt(waiting, attempt(1), { status: 'queued', nextAttemptAt: T0 + 60_000 });
      await store.recordAttempt(waitingAgent, attempt(1), { status: 'queued', nextAttemptAt: T0 + 120_000 });
      await store.recordAttempt(due, attempt(1), { status: 'queued', nextAttemptAt: T0 + 5_000 });
      await store.recordAttempt(delivered, attempt(1, T0, 200), { status: 'delivered' });
      await store.recordAttempt(dead, attempt(1), { status: 'dead' });
      assert.equal(await store.requeueWaiting(T0 + 10_000), 2);
      assert.equal(await store.requeueWaiting(T0 + 10_000), 0, 'nothing left waiting');
      for (const id of [waiting, waitingAgent]) {
        const got = await store.get(id);
        assert.deepEqual([got?.event.nextAttemptAt, got?.event.roundAttempts], [T0 + 10_000, 0], id);
      }
      assert.deepEqual(
        [(await store.get(due))?.event.nextAttemptAt, (await store.get(due))?.event.roundAttempts],
        [T0 + 5_000, 1],
        'already due: as it was',
      );
      assert.equal((await store.get(delivered))?.event.status, 'delivered');
      assert.equal((await store.get(dead))?.event.status, 'dead');
    });

    it('returns false for a queued event already due (leaving it as is) and for an unknown id', async () => {
      const id = await acceptAt(T0);
      await store.recordAttempt(id, attempt(1), { status: 'queued', nextAttemptAt: T0 + 5_000 });
      assert.equal(await store.requeue(id, T0 + 60_000), false);
      const got = await store.get(id);
      assert.equal(got?.event.roundAttempts, 1);
      assert.equal(got?.event.nextAttemptAt, T0 + 5_000);
      assert.equal(await store.requeue('evt_nope', T0), false);
    });

    it('a delivered event can be sent again; deliveredAt is cleared', async () => {
      const id = await acceptAt(T0);
      await store.recordAttempt(id, attempt(1, T0, 200), { status: 'delivered' });
      assert.equal(await store.requeue(id, T0 + 1), true);
      const got = await store.get(id);
      assert.equal(got?.event.status, 'queued');
      assert.equal(got?.event.deliveredAt, null);
    });

    it('requeueDead requeues exactly the dead events and counts them', async () => {
      const dead1 = await acceptAt(T0);
      const dead2 = await acceptAt(T0, 'agent');
      const delivered = await acceptAt(T0);
      const queued = await acceptAt(T0);
      await store.recordAttempt(dead1, attempt(1), { status: 'dead' });
      await store.recordAttempt(dead2, attempt(1), { status: 'dead' });
      await store.recordAttempt(delivered, attempt(1, T0, 200), { status: 'delivered' });
      assert.equal(await store.requeueDead(T0 + 10), 2);
      assert.equal(await store.requeueDead(T0 + 10), 0, 'nothing left dead');
      assert.equal((await store.get(dead1))?.event.status, 'queued');
      assert.equal((await store.get(dead2))?.event.roundAttempts, 0);
      assert.equal((await store.get(dead2))?.event.nextAttemptAt, T0 + 10);
      assert.equal((await store.get(delivered))?.event.status, 'delivered');
      assert.equal((await store.get(queued))?.event.status, 'queued');
    });
  });

  describe('purgeDelivered and releaseLeases', () => {
    it('purges only delivered events older than the cutoff, with their attempts', async () => {
      const old = await acceptAt(T0);
      const recent = await acceptAt(T0);
      const deadOld = await acceptAt(T0);
      const queued = await acceptAt(T0);
      await store.recordAttempt(old, attempt(1, T0, 500), { status: 'queued', nextAttemptAt: T0 });
      await store.recordAttempt(old, attempt(2, T0 + 1_000, 200), { status: 'delivered' }); // delivered at T0 + 1012
      await store.recordAttempt(recent, attempt(1, T0 + 50_000, 200), { status: 'delivered' });
      await store.recordAttempt(deadOld, attempt(1, T0, 400), { status: 'dead' });

      assert.deepEqual(await store.purgeDelivered(T0 + 10_000, T0 + 10_000), { purged: 1, keptInWindow: 0 });
      assert.equal(await store.get(old), undefined);
      for (const id of [recent, deadOld, queued]) assert.ok(await store.get(id), id);
      assert.equal(await harness.countAttempts(old), 0, 'attempts of purged events are gone');
      assert.deepEqual(await store.purgeDelivered(T0 + 10_000, T0 + 10_000), { purged: 0, keptInWindow: 0 });
    });

    it('an event whose delivery id is still remembered stays until the id is forgotten (found by an outside attack: a purge let the same id in again), and is counted as kept', async () => {
      const keyed = (await store.accept(event({ idempotencyKey: 'K' }))).id;
      const plain = await acceptAt(T0);
      for (const id of [keyed, plain]) await store.recordAttempt(id, attempt(1, T0, 200), { status: 'delivered' });
      assert.deepEqual(
        await store.purgeDelivered(T0 + 60_000, T0 + 60_000),
        { purged: 1, keptInWindow: 1 },
        'the one without a delivery id goes; the other is reported kept',
      );
      assert.ok(await store.get(keyed));
      assert.deepEqual(await store.accept(event({ idempotencyKey: 'K', receivedAt: T0 + 60_000 })), {
        id: keyed,
        duplicate: true,
      });
      assert.deepEqual(
        await store.purgeDelivered(T0 + 60_000, T0 + IDEMPOTENCY_WINDOW_MS - 1),
        { purged: 0, keptInWindow: 1 },
        'the id is remembered for its whole window',
      );
      assert.deepEqual(
        await store.purgeDelivered(T0 + 60_000, T0 + IDEMPOTENCY_WINDOW_MS),
        { purged: 1, keptInWindow: 0 },
        'then purged',
      );
    });

    it('inside the delivery-id window, page after page (a cursor: chunks no longer read the kept rows again): every event without a remembered id goes, every one with it stays', async () => {
      const ids: { id: string; keyed: boolean }[] = [];
      for (let i = 0; i < 1_100; i++) {
        const keyed = i % 2 === 0;
        const { id } = await store.accept(
          event({ receivedAt: T0 + i, ...(keyed ? { idempotencyKey: `k-${i}` } : {}) }),
        );
        ids.push({ id, keyed });
      }
      // Delivered at a handful of instants, so pages end inside a run of equal times.
      for (const [i, { id }] of ids.entries())
        await store.recordAttempt(id, attempt(1, T0 + 2_000 + Math.floor(i / 300), 200), { status: 'delivered' });
      assert.deepEqual(await store.purgeDelivered(T0 + 60_000, T0 + 60_000), { purged: 550, keptInWindow: 550 });
      for (const { id, keyed } of [ids[0]!, ids[1]!, ids[599]!, ids[600]!, ids[1_098]!, ids[1_099]!])
        assert.equal((await store.get(id)) !== undefined, keyed, id);
      assert.equal((await store.status(T0)).counts.delivered, 550);
      assert.deepEqual(
        await store.purgeDelivered(T0 + 60_000, T0 + IDEMPOTENCY_WINDOW_MS + 1_100),
        { purged: 550, keptInWindow: 0 },
        'once the window has passed for all',
      );
    });

    it('releaseLeases frees every lease and counts them', async () => {
      const a = await acceptAt(T0);
      const b = await acceptAt(T0, 'agent');
      await acceptAt(T0);
      await store.claimDue(T0, 1, LEASE, 'message');
      await store.claimDue(T0, 1, LEASE, 'agent');
      assert.equal(await store.releaseLeases(), 2);
      assert.equal(await store.releaseLeases(), 0);
      assert.deepEqual(
        (await store.claimDue(T0, 10, LEASE, 'agent')).map((e) => e.id),
        [b],
      );
      assert.ok((await store.claimDue(T0, 10, LEASE, 'message')).some((e) => e.id === a));
    });
  });

  describe('nextDueAt and list', () => {
    it('nextDueAt is the earliest next attempt of queued events, or undefined', async () => {
      assert.equal(await store.nextDueAt(T0), undefined);
      await acceptAt(T0 + 3_000);
      await acceptAt(T0 + 1_000, 'agent');
      assert.equal(await store.nextDueAt(T0), T0 + 1_000);
    });

    // A leased event counted as due made the deliverer poll in a hot loop while a delivery was in flight.
    it('nextDueAt does not report a leased event as due before its lease ends', async () => {
      await acceptAt(T0);
      await store.claimDue(T0, 1, LEASE, 'message');
      assert.equal(await store.nextDueAt(T0), T0 + LEASE);
    });

    it('list filters by status and endpoint, newest first, with a limit', async () => {
      const a = await acceptAt(T0);
      const b = await acceptAt(T0 + 1);
      const c = (await store.accept(event({ receivedAt: T0 + 2, endpoint: '/webhook/other' }))).id;
      await store.recordAttempt(a, attempt(1), { status: 'dead' });
      assert.deepEqual(
        (await store.list({})).map((e) => e.id),
        [c, b, a],
      );
      assert.deepEqual(
        (await store.list({ limit: 2 })).map((e) => e.id),
        [c, b],
      );
      assert.deepEqual(
        (await store.list({ status: 'queued' })).map((e) => e.id),
        [c, b],
      );
      assert.deepEqual(
        (await store.list({ endpoint: '/webhook/github' })).map((e) => e.id),
        [b, a],
      );
      assert.deepEqual(
        (await store.list({ status: 'dead', endpoint: '/webhook/github' })).map((e) => e.id),
        [a],
      );
    });
  });

  describe('leases are fenced (claim ids)', () => {
    it('each claim carries a fresh claim id and its lease end', async () => {
      const id = await acceptAt(T0);
      const [first] = await store.claimDue(T0, 1, LEASE, 'message');
      assert.equal(first?.id, id);
      assert.equal(first?.leaseUntil, T0 + LEASE);
      assert.equal(typeof first?.claimId, 'string');
      const [again] = await store.claimDue(T0 + LEASE, 1, LEASE, 'message');
      assert.equal(again?.id, id);
      assert.notEqual(again?.claimId, first?.claimId);
    });

    it("an outcome under a claim that has passed to another is ignored; the current holder's is recorded", async () => {
      const id = await acceptAt(T0);
      const [stale] = await store.claimDue(T0, 1, LEASE, 'message');
      const [current] = await store.claimDue(T0 + LEASE, 1, LEASE, 'message'); // the first holder's lease ran out
      assert.equal(await store.recordAttempt(id, attempt(1, T0, 200), { status: 'delivered' }, stale!.claimId), false);
      let got = await store.get(id);
      assert.equal(got?.event.status, 'queued', 'nothing written');
      assert.deepEqual(got?.attempts, []);
      assert.equal(
        await store.recordAttempt(
          id,
          attempt(1, T0 + LEASE, 503),
          { status: 'queued', nextAttemptAt: T0 + LEASE + 1_000 },
          current!.claimId,
        ),
        true,
      );
      got = await store.get(id);
      assert.equal(got?.event.attempts, 1);
      assert.equal(got?.event.nextAttemptAt, T0 + LEASE + 1_000);
      // Settled: the token is spent.
      assert.equal(
        await store.recordAttempt(id, attempt(2, T0 + LEASE, 200), { status: 'delivered' }, current!.claimId),
        false,
      );
    });

    it('an expired lease nobody took over still settles under its own claim id', async () => {
      const id = await acceptAt(T0);
      const [claim] = await store.claimDue(T0, 1, LEASE, 'message');
      assert.equal(
        await store.recordAttempt(id, attempt(1, T0 + 2 * LEASE, 200), { status: 'delivered' }, claim!.claimId),
        true,
      );
      assert.equal((await store.get(id))?.event.status, 'delivered');
    });

    it('renewLease extends a held lease, and refuses a stale claim id', async () => {
      const id = await acceptAt(T0);
      const [claim] = await store.claimDue(T0, 1, LEASE, 'message');
      assert.equal(await store.renewLease(id, claim!.claimId, T0 + 3 * LEASE), true);
      assert.deepEqual(await store.claimDue(T0 + LEASE, 1, LEASE, 'message'), [], 'the renewed lease still holds');
      assert.equal(await store.nextDueAt(T0 + LEASE), T0 + 3 * LEASE);
      const [next] = await store.claimDue(T0 + 3 * LEASE, 1, LEASE, 'message');
      assert.equal(next?.id, id);
      assert.equal(
        await store.renewLease(id, claim!.claimId, T0 + 10 * LEASE),
        false,
        'the old claim cannot revive itself',
      );
      assert.deepEqual(await store.claimDue(T0 + 3 * LEASE + 1, 1, LEASE, 'message'), []);
    });
  });

  describe('status', () => {
    it('counts events by status, and the leased ones', async () => {
      const a = await acceptAt(T0);
      const b = await acceptAt(T0);
      await acceptAt(T0);
      await store.recordAttempt(a, attempt(1, T0, 200), { status: 'delivered' });
      await store.recordAttempt(b, attempt(1, T0, 400), { status: 'dead' });
      await store.claimDue(T0, 1, LEASE, 'message');
      const status = await store.status(T0);
      assert.equal(status.driver, harness.driver);
      assert.ok(status.schemaVersion >= 1);
      assert.deepEqual(status.counts, { queued: 1, delivered: 1, dead: 1 });
      assert.equal(status.leased, 1);
      assert.equal((await store.status(T0 + LEASE)).leased, 0);
    });
  });

  describe('queueStats and probeWrite (the admin listener)', () => {
    it('counts events by action and status, and finds the earliest due one', async () => {
      const a = await acceptAt(T0 + 1_000);
      await acceptAt(T0 + 2_000);
      await acceptAt(T0 + 3_000, 'agent');
      const later = await acceptAt(T0 + 500);
      await store.recordAttempt(a, attempt(1, T0, 200), { status: 'delivered' });
      await store.recordAttempt(later, attempt(1, T0, 503), { status: 'queued', nextAttemptAt: T0 + 60_000 });
      const stats = await store.queueStats(T0 + 10_000);
      const byKey = Object.fromEntries(stats.counts.map((c) => [`${c.action}/${c.status}`, c.events]));
      assert.deepEqual(byKey, { 'message/delivered': 1, 'message/queued': 2, 'agent/queued': 1 });
      // The retried one is not due until T0 + 60 s: the earliest due is the one received at T0 + 2 s.
      assert.equal(stats.oldestDueAt, T0 + 2_000);
      assert.equal((await store.queueStats(T0)).oldestDueAt, undefined, 'nothing due yet');
    });

    it('delivered events are recounted at most every DELIVERED_RECOUNT_MS (in the background); queued and dead ones at each call', async () => {
      const [a, b, c] = [await acceptAt(T0), await acceptAt(T0 + 1), await acceptAt(T0 + 2)];
      await store.recordAttempt(a, attempt(1, T0, 200), { status: 'delivered' });
      const counts = async (now: number) =>
        Object.fromEntries((await store.queueStats(now)).counts.map((x) => [`${x.action}/${x.status}`, x.events]));
      assert.deepEqual(
        await counts(T0),
        { 'message/delivered': 1, 'message/queued': 2 },
        'the first call waits for the count',
      );
      await store.recordAttempt(b, attempt(1, T0, 200), { status: 'delivered' });
      await store.recordAttempt(c, attempt(1, T0, 410), { status: 'dead' });
      assert.deepEqual(
        await counts(T0 + 1_000),
        { 'message/delivered': 1, 'message/dead': 1 },
        'delivered: the last count; dead: now',
      );
      assert.deepEqual(
        await counts(T0 + DELIVERED_RECOUNT_MS),
        { 'message/delivered': 1, 'message/dead': 1 },
        'a recount is started, not waited for',
      );
      await waitFor(async () => (await counts(T0 + DELIVERED_RECOUNT_MS))['message/delivered'] === 2, {
        timeoutMs: 5_000,
        what: 'the recount to come in',
      });
    });

    it('probeWrite resolves on a writable store and changes nothing', async () => {
      const id = await acceptAt(T0);
      await store.probeWrite();
      assert.deepEqual((await store.status(T0)).counts, { queued: 1, delivered: 0, dead: 0 });
      assert.equal((await store.get(id))!.event.status, 'queued');
    });

    it('probeWrite rejects once the store is closed', async () => {
      const closed = await other();
      await closed.close();
      await assert.rejects(closed.probeWrite());
    });
  });

  operatorQueriesContract(() => store);
}
