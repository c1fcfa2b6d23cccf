import type pg from 'pg';
import type { WebhookAction } from '../../../config/schema.js';
import { IDEMPOTENCY_WINDOW_MS, newEventId, type AcceptResult, type NewEvent } from '../../contracts/events.js';
import { inTransaction, isRetryableTransactionError } from '../pool.js';
import type { Claims, LeasableAccept } from './claims.js';
import type { DueNotifier } from './notify.js';
import type { PostgresTuning } from './tuning.js';

interface PendingAccept extends LeasableAccept {
  resolve: (result: AcceptResult) => void;
  reject: (err: unknown) => void;
}

type Decision =
  | { kind: 'duplicate'; id: string }
  | { kind: 'failed'; err: unknown }
  | { kind: 'insert'; forget?: string }
  | { kind: 'same-as'; index: number };

/**
 * Accepts, group-committed. The accepts waiting when a batch starts share one transaction: one
 * lookup of their delivery ids and replay keys, multi-row inserts with ON CONFLICT on the unique
 * (endpoint, idempotency_key) and (endpoint, replay_key), so two instances accepting the same
 * delivery at once store it once. Each accept resolves after COMMIT; a NOTIFY (coalesced) then
 * wakes the other instances' deliverers, for the events not leased to this one's (see Claims).
 */
export class AcceptBatcher {
  private pending: PendingAccept[] = [];
  private flushScheduled = false;
  private flushing: Promise<void> | undefined;

  constructor(
    private readonly pool: pg.Pool,
    /** This store's id, written as the lease owner of the events leased on insert. */
    private readonly owner: string,
    private readonly tuning: Readonly<PostgresTuning>,
    private readonly claims: Claims,
    private readonly notifier: DueNotifier,
  ) {}

  accept(event: NewEvent): Promise<AcceptResult> {
    return new Promise<AcceptResult>((resolve, reject) => {
      this.pending.push({ event, id: newEventId(event.receivedAt), resolve, reject });
      if (!this.flushScheduled && !this.flushing) {
        this.flushScheduled = true;
        setImmediate(() => void this.flush());
      }
    });
  }

  /** Resolves once every accept made so far is committed (or failed). */
  async drain(): Promise<void> {
    while (this.flushing || this.pending.length > 0) {
      if (this.flushing) await this.flushing;
      else await this.flush();
    }
  }

  /** One batch at a time; accepts arriving meanwhile wait for the next, and so share it. */
  private async flush(): Promise<void> {
    this.flushScheduled = false;
    const run = async () => {
      while (this.pending.length > 0) await this.commitBatch(this.pending.splice(0, this.tuning.maxBatch));
    };
    const done = run();
    this.flushing = done;
    await done;
    if (this.flushing === done) this.flushing = undefined;
    // An accept that came while this one was finishing saw it running and waits for the next.
    if (this.pending.length > 0 && !this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(() => void this.flush());
    }
  }

  private async commitBatch(batch: PendingAccept[]): Promise<void> {
    this.claims.leaseForDeliverer(batch);
    for (let attempt = 1; ; attempt++) {
      let outcome: (AcceptResult | { err: unknown })[];
      try {
        // No delivery id or replay key in the batch: its only statement is the insert, which commits
        // on its own (one round trip, not BEGIN/INSERT/COMMIT: measured as the ingest's main wait).
        const insertOnly = batch.every((p) => p.event.idempotencyKey === undefined && p.event.replayKey === undefined);
        outcome = insertOnly
          ? await this.acceptInTransaction(this.pool, batch)
          : await inTransaction(this.pool, (client) => this.acceptInTransaction(client, batch));
      } catch (err) {
        // Deadlock between two instances' batches (keys locked in different orders): run it again.
        if (attempt < this.tuning.batchTries && isRetryableTransactionError(err)) continue;
        for (const p of batch) p.reject(err); // not committed: nothing in the batch is stored
        return;
      }
      let storedUnleased = false;
      batch.forEach((p, i) => {
        const result = outcome[i]!;
        if ('err' in result) return p.reject(result.err);
        if (!result.duplicate) {
          if (p.lease) this.claims.handOver(p, p.lease);
          else {
            storedUnleased = true;
            this.claims.mayHaveDue(p.event.action);
          }
        }
        p.resolve(result);
      });
      // Only unleased events are anyone else's business; this process's deliverer is woken by the receiver.
      if (storedUnleased) this.notifier.notifyDue();
      return;
    }
  }

  /**
   * Runs `work` in one transaction with an `accept` that stores events in it (deduped as accept
   * does), so the events and what `work` writes to its own tables (an integration's cursor)
   * commit together, or not at all. Run again from the start after a deadlock; resolves after
   * COMMIT, and wakes the other instances' deliverers when an event was stored.
   */
  async atomically<T>(
    work: (tx: { client: pg.PoolClient; accept(events: NewEvent[]): Promise<AcceptResult[]> }) => Promise<T>,
  ): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      const stored = new Set<WebhookAction>();
      try {
        const result = await inTransaction(this.pool, (client) =>
          work({
            client,
            accept: async (events) => {
              const pending = events.map((event) => ({
                event,
                id: newEventId(event.receivedAt),
                resolve: () => {},
                reject: () => {},
              }));
              return (await this.acceptInTransaction(client, pending)).map((outcome, i) => {
                if ('err' in outcome) throw outcome.err;
                if (!outcome.duplicate) stored.add(events[i]!.action);
                return outcome;
              });
            },
          }),
        );
        if (stored.size > 0) {
          for (const action of stored) this.claims.mayHaveDue(action); // stored unleased: claimed from the database
          this.notifier.notifyDue();
        }
        return result;
      } catch (err) {
        if (attempt < this.tuning.batchTries && isRetryableTransactionError(err)) continue;
        throw err;
      }
    }
  }

  /** The batch's statements, on `client` in a transaction (or on the pool when the batch needs only the insert). */
  private async acceptInTransaction(
    client: pg.PoolClient | pg.Pool,
    batch: PendingAccept[],
  ): Promise<(AcceptResult | { err: unknown })[]> {
    // 1. What is already on file: delivery ids and replay keys of the batch, in one round trip.
    const keyed = batch.flatMap((p, i) =>
      p.event.idempotencyKey !== undefined ? [{ i, endpoint: p.event.endpoint, key: p.event.idempotencyKey }] : [],
    );
    const replays = batch.flatMap((p, i) =>
      p.event.replayKey !== undefined ? [{ i, endpoint: p.event.endpoint, key: p.event.replayKey }] : [],
    );
    const seenKey = new Map<number, { id: string; receivedAt: number }>();
    const seenReplay = new Map<number, string>();
    if (keyed.length + replays.length > 0) {
      const { rows } = await client.query<{ kind: 'key' | 'replay'; i: number; id: string; received_at: number }>(
        `SELECT 'key' AS kind, b.i, e.id, e.received_at
           FROM unnest($1::int[], $2::text[], $3::text[]) AS b(i, endpoint, key)
           JOIN events e ON e.endpoint = b.endpoint AND e.idempotency_key = b.key
         UNION ALL
         SELECT 'replay', b.i, r.event_id, 0
           FROM unnest($4::int[], $5::text[], $6::text[]) AS b(i, endpoint, key)
           JOIN event_replay_keys r ON r.endpoint = b.endpoint AND r.replay_key = b.key`,
        [
          keyed.map((k) => k.i),
          keyed.map((k) => k.endpoint),
          keyed.map((k) => k.key),
          replays.map((k) => k.i),
          replays.map((k) => k.endpoint),
          replays.map((k) => k.key),
        ],
      );
      for (const row of rows) {
        if (row.kind === 'key') seenKey.set(row.i, { id: row.id, receivedAt: row.received_at });
        else seenReplay.set(row.i, row.id);
      }
    }

    // 2. Decide each, as the SQLite driver does: a delivery id inside the window, then a replay key; repeats inside the batch follow their first.
    const firstWithKey = new Map<string, number>();
    const firstWithReplay = new Map<string, number>();
    const decisions: Decision[] = batch.map((p, i) => {
      const { event } = p;
      const seen = seenKey.get(i);
      if (seen && seen.receivedAt > event.receivedAt - IDEMPOTENCY_WINDOW_MS) return { kind: 'duplicate', id: seen.id };
      const replayed = seenReplay.get(i);
      if (replayed !== undefined) return { kind: 'duplicate', id: replayed };
      const keyId =
        event.idempotencyKey !== undefined ? JSON.stringify([event.endpoint, event.idempotencyKey]) : undefined;
      const replayId = event.replayKey !== undefined ? JSON.stringify([event.endpoint, event.replayKey]) : undefined;
      const earlier =
        (keyId !== undefined ? firstWithKey.get(keyId) : undefined) ??
        (replayId !== undefined ? firstWithReplay.get(replayId) : undefined);
      if (earlier !== undefined) return { kind: 'same-as', index: earlier };
      try {
        p.envelope ??= event.envelope(p.id); // only for an event to be stored; a throw fails it alone
      } catch (err) {
        return { kind: 'failed', err };
      }
      if (keyId !== undefined) firstWithKey.set(keyId, i);
      if (replayId !== undefined) firstWithReplay.set(replayId, i);
      return { kind: 'insert', forget: seen?.id };
    });

    // 3. Delivery ids past their window are forgotten by the event that reuses them.
    const forget = decisions.flatMap((d) => (d.kind === 'insert' && d.forget !== undefined ? [d.forget] : []));
    if (forget.length > 0)
      await client.query('UPDATE events SET idempotency_key = NULL WHERE id = ANY($1::text[])', [forget]);

    // 4. One multi-row insert. Sorted by key, so two instances' batches lock keys in one order.
    const inserts = batch
      .map((p, i) => ({ p, i }))
      .filter(({ i }) => decisions[i]!.kind === 'insert')
      .sort((a, b) => compareKeys(a.p.event, b.p.event));
    const inserted = new Set<string>();
    if (inserts.length > 0) {
      const { rows } = await client.query<{ id: string }>(
        `INSERT INTO events (id, endpoint, action, idempotency_key, received_at, envelope, status, next_attempt_at, lease_until, claim_id, lease_owner, headers, trace_context)
         SELECT id, endpoint, action, key, received_at, envelope, 'queued', received_at, lease_until, claim_id, CASE WHEN claim_id IS NULL THEN NULL ELSE $9 END, headers, trace_context
           FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::bigint[], $8::uuid[], $10::text[], $11::text[])
             AS t(id, endpoint, action, key, received_at, envelope, lease_until, claim_id, headers, trace_context)
         ON CONFLICT (endpoint, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
         RETURNING id`,
        [
          inserts.map(({ p }) => p.id),
          inserts.map(({ p }) => p.event.endpoint),
          inserts.map(({ p }) => p.event.action),
          inserts.map(({ p }) => p.event.idempotencyKey ?? null),
          inserts.map(({ p }) => p.event.receivedAt),
          inserts.map(({ p }) => p.envelope!),
          inserts.map(({ p }) => p.lease?.until ?? null),
          inserts.map(({ p }) => p.lease?.claimId ?? null),
          this.owner,
          inserts.map(({ p }) => p.event.headers ?? null),
          inserts.map(({ p }) => p.event.traceContext ?? null),
        ],
      );
      for (const row of rows) inserted.add(row.id);
    }

    // 5. Replay keys of the stored events; one another instance stored meanwhile makes ours a duplicate.
    const withReplay = inserts.filter(({ p }) => inserted.has(p.id) && p.event.replayKey !== undefined);
    const replayStored = new Set<string>();
    if (withReplay.length > 0) {
      const { rows } = await client.query<{ event_id: string }>(
        `INSERT INTO event_replay_keys (endpoint, replay_key, event_id)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[])
         ON CONFLICT (endpoint, replay_key) DO NOTHING
         RETURNING event_id`,
        [
          withReplay.map(({ p }) => p.event.endpoint),
          withReplay.map(({ p }) => p.event.replayKey!),
          withReplay.map(({ p }) => p.id),
        ],
      );
      for (const row of rows) replayStored.add(row.event_id);
      const beaten = withReplay.filter(({ p }) => !replayStored.has(p.id)).map(({ p }) => p.id);
      if (beaten.length > 0) {
        await client.query('DELETE FROM events WHERE id = ANY($1::text[])', [beaten]);
        for (const id of beaten) inserted.delete(id);
      }
    }

    // 6. Those another instance won: the winner committed (ON CONFLICT waited for it), so this statement sees it.
    const lost = inserts.filter(({ p }) => !inserted.has(p.id));
    const winners = new Map<number, string>();
    if (lost.length > 0) {
      const { rows } = await client.query<{ i: number; id: string }>(
        `SELECT b.i, coalesce(r.event_id, e.id) AS id
           FROM unnest($1::int[], $2::text[], $3::text[], $4::text[]) AS b(i, endpoint, key, replay)
           LEFT JOIN event_replay_keys r ON r.endpoint = b.endpoint AND r.replay_key = b.replay
           LEFT JOIN events e ON e.endpoint = b.endpoint AND e.idempotency_key = b.key`,
        [
          lost.map(({ i }) => i),
          lost.map(({ p }) => p.event.endpoint),
          lost.map(({ p }) => p.event.idempotencyKey ?? null),
          lost.map(({ p }) => p.event.replayKey ?? null),
        ],
      );
      for (const row of rows) if (row.id !== null) winners.set(row.i, row.id);
      // Not found: the winner vanished in between (purged). Running the batch again decides afresh.
      if (winners.size < lost.length)
        throw Object.assign(new Error('a concurrent duplicate vanished; retrying the batch'), { code: '40001' });
    }

    const results: (AcceptResult | { err: unknown })[] = [];
    decisions.forEach((d, i) => {
      if (d.kind === 'duplicate') results.push({ id: d.id, duplicate: true });
      else if (d.kind === 'failed') results.push({ err: d.err });
      else if (d.kind === 'same-as') results.push({ id: (results[d.index] as AcceptResult).id, duplicate: true });
      else if (winners.has(i)) results.push({ id: winners.get(i)!, duplicate: true });
      else results.push({ id: batch[i]!.id, duplicate: false });
    });
    return results;
  }
}

function compareKeys(a: NewEvent, b: NewEvent): number {
  const ka = `${a.endpoint}\u0000${a.idempotencyKey ?? ''}`;
  const kb = `${b.endpoint}\u0000${b.idempotencyKey ?? ''}`;
  return ka < kb ? -1 : ka > kb ? 1 : 0;
}
