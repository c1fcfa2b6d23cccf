import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import pino from 'pino';
import { parseConfig } from '../../src/config/load.js';
import type { PostgresStorageConfig } from '../../src/config/schema.js';
import { DELIVERED_RECOUNT_MS, type DeliveredCounts, type EventStore } from '../../src/storage/contracts/events.js';
import { CLAIM_DUE_SQL, PostgresEventStore, UNDELIVERED_COUNTS_SQL } from '../../src/storage/postgres/events.js';
import { PostgresLockoutStore } from '../../src/storage/postgres/lockout.js';
import { migratePostgres } from '../../src/storage/migrate.js';
import { MIGRATIONS, POSTGRES_SCHEMA_VERSION } from '../../src/storage/postgres/migrations.js';
import { Deliverer } from '../../src/webhooks/delivery/deliverer.js';
import { request } from '../helpers/http.js';
import { startTestGatehouse, testConfig } from '../helpers/gatehouse.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { runCli } from '../helpers/process.js';
import { waitFor } from '../helpers/wait.js';
import { attempt, event, eventStoreContract, T0 } from '../webhooks/store-contract.js';

// One cluster for this file (initdb + start: about 2-4 s), one database per describe.
const cluster = await startPostgres();
const skip = 'skip' in cluster ? cluster.skip : false;
/** The cluster, inside tests that run only when it started. */
const pgc = () => cluster as PostgresCluster;
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

const silent = pino({ level: 'silent' });
const LEASE = 30_000;

function storage(url: string, max = 5): PostgresStorageConfig {
  return { driver: 'postgres', url, pool: { max } };
}

/** A target answering 200 (after `delayMs`) and recording the event ids it got. */
async function startTarget(delayMs = 0): Promise<{ url: string; ids: string[]; close(): Promise<void> }> {
  const ids: string[] = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      setTimeout(() => {
        ids.push(JSON.parse(body).id);
        res.end('ok');
      }, delayMs);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    ids,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

function deliveryConfig(targetUrl: string, delivery: Record<string, number> = {}) {
  return parseConfig({
    gateway: { upstream: { target: 'http://127.0.0.1:1' }, auth: { apiKey: 'k'.repeat(40) } },
    webhooks: {
      enabled: true,
      endpoints: [{ path: '/webhook/github', secret: 's'.repeat(16), action: 'message' }],
      targets: { message: { url: targetUrl } },
      delivery: { concurrency: 4, timeoutMs: 2_000, initialBackoffMs: 20, maxBackoffMs: 100, ...delivery },
    },
  }).webhooks;
}

describe('PostgresEventStore: the EventStore contract', { skip, timeout: 90_000 }, () => {
  let url: string;
  let admin: pg.Client;
  const stores: EventStore[] = [];
  before(async () => {
    if ('skip' in cluster) return;
    url = await pgc().createDatabase();
    admin = new pg.Client({ connectionString: url });
    await admin.connect();
  });
  after(async () => admin?.end());
  const count = async (sql: string, params: unknown[] = []) => Number((await admin.query(sql, params)).rows[0].n);

  eventStoreContract({
    driver: 'postgres',
    async open() {
      return PostgresEventStore.open(storage(url), { migrate: true });
    },
    async other() {
      return PostgresEventStore.open(storage(url));
    },
    countReplayKeys: () => count('SELECT count(*) AS n FROM event_replay_keys'),
    countAttempts: (id) => count('SELECT count(*) AS n FROM attempts WHERE event_id = $1', [id]),
    async reset() {
      for (const s of stores.splice(0)) await s.close();
      await admin.query('TRUNCATE events, attempts, event_replay_keys');
    },
  });
});

describe('PostgresEventStore: several instances on one database', { skip, timeout: 90_000 }, () => {
  let url: string;
  const open: EventStore[] = [];
  const instance = async (options: { listen?: boolean } = {}) => {
    const store = await PostgresEventStore.open(storage(url), { migrate: true, ...options, logger: silent });
    open.push(store);
    return store;
  };
  before(async () => {
    if ('skip' in cluster) return;
    url = await pgc().createDatabase();
  });
  after(async () => {
    for (const s of open) await s.close().catch(() => {});
  });
  /** Three instances on a database of their own (the first migrates it), closed after `run`. */
  async function onNewDatabase(
    run: (stores: [PostgresEventStore, PostgresEventStore, PostgresEventStore]) => Promise<void>,
  ): Promise<void> {
    const db = await pgc().createDatabase();
    const stores: PostgresEventStore[] = [];
    try {
      for (let i = 0; i < 3; i++)
        stores.push(await PostgresEventStore.open(storage(db), { migrate: i === 0, logger: silent }));
      await run(stores as [PostgresEventStore, PostgresEventStore, PostgresEventStore]);
    } finally {
      for (const store of stores) await store.close();
    }
  }

  it('instances starting together migrate once, under the advisory lock', async () => {
    const fresh = await pgc().createDatabase();
    const stores = await Promise.all([1, 2, 3].map(() => PostgresEventStore.open(storage(fresh), { migrate: true })));
    const versions = await Promise.all(stores.map((s) => s.status(T0)));
    assert.deepEqual(
      versions.map((v) => v.schemaVersion),
      [POSTGRES_SCHEMA_VERSION, POSTGRES_SCHEMA_VERSION, POSTGRES_SCHEMA_VERSION],
    );
    const client = new pg.Client({ connectionString: fresh });
    await client.connect();
    const { rows } = await client.query('SELECT version FROM schema_migrations ORDER BY version');
    assert.deepEqual(
      rows.map((r) => r.version),
      MIGRATIONS.map((m) => m.version),
    );
    await client.end();
    for (const s of stores) await s.close();
    // The CLI's open (no migrate) refuses a database without the schema, saying what to run.
    const empty = await pgc().createDatabase();
    await assert.rejects(PostgresEventStore.open(storage(empty)), /gatehouse storage migrate/);
  });

  it('a database at schema 7 (no headers, no response snippets) migrates to the latest: its events keep their rows, with headers and snippets null', async () => {
    const db = await pgc().createDatabase();
    const pool = new pg.Pool({ connectionString: db });
    try {
      const client = await pool.connect();
      try {
        await migratePostgres(
          client,
          MIGRATIONS.filter((m) => m.version <= 7),
        );
        await client.query(
          `INSERT INTO events (id, endpoint, action, received_at, envelope, status, attempts, round_attempts, next_attempt_at, last_error)
           VALUES ('evt_old', '/w', 'message', 1, '{"n":1}', 'dead', 1, 1, 0, 'HTTP 503')`,
        );
        await client.query(
          "INSERT INTO attempts (event_id, attempt, at, status, error, duration_ms) VALUES ('evt_old', 1, 2, 503, NULL, 7)",
        );
      } finally {
        client.release();
      }
      await assert.rejects(PostgresEventStore.open(storage(db)), /schema version 7, older than/);
      const store = await PostgresEventStore.open(storage(db), { migrate: true, logger: silent });
      try {
        assert.equal((await store.status(T0)).schemaVersion, POSTGRES_SCHEMA_VERSION);
        const old = await store.get('evt_old');
        assert.equal(old?.headers, null);
        assert.deepEqual(old?.attempts, [
          { attempt: 1, at: 2, status: 503, error: null, durationMs: 7, responseSnippet: null },
        ]);
        assert.equal(old?.event.envelope, '{"n":1}');
        // New events on the migrated schema keep both.
        const { id } = await store.accept(event({ headers: '{"a":"b"}' }));
        await store.recordAttempt(id, { ...attempt(1, T0, 503), responseSnippet: 'busy' }, { status: 'dead' });
        const fresh = await store.get(id);
        assert.equal(fresh?.headers, '{"a":"b"}');
        assert.equal(fresh?.attempts[0]?.responseSnippet, 'busy');
      } finally {
        await store.close();
      }
    } finally {
      await pool.end();
    }
  });

  /** A new database at schema version 4 (before the concurrent index migration), and a client on it. */
  async function databaseAtVersion4(): Promise<{ db: string; client: pg.Client }> {
    const db = await pgc().createDatabase();
    const client = new pg.Client({ connectionString: db });
    await client.connect();
    await client.query(
      'CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())',
    );
    for (const m of MIGRATIONS.filter((m) => m.version <= 4)) {
      assert.ok('sql' in m);
      await client.query(m.sql);
      await client.query('INSERT INTO schema_migrations (version, name) VALUES ($1, $2)', [m.version, m.name]);
    }
    return { db, client };
  }

  it("a migration outlasting the pool's query timeout (an index build waiting for a long reader) completes instead of failing the start", async () => {
    // (Found by review: the lockout pool's 2 s timeout gave up on the client side, the build went on under the lock.)
    const { db, client } = await databaseAtVersion4();
    const reader = new pg.Client({ connectionString: db });
    await reader.connect();
    try {
      await reader.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      await reader.query('SELECT count(*) FROM events'); // a snapshot CREATE INDEX CONCURRENTLY waits for
      const opening = PostgresLockoutStore.open(storage(db), { logger: silent });
      await new Promise((r) => setTimeout(r, 3_000)); // past the lockout pool's 2 s query timeout
      await reader.query('COMMIT');
      const lockout = await opening;
      await lockout.close();
      assert.deepEqual(
        (await client.query('SELECT max(version) AS v FROM schema_migrations')).rows[0].v,
        POSTGRES_SCHEMA_VERSION,
      );
    } finally {
      await reader.end();
      await client.end();
    }
  });

  it('migration 5 builds its index concurrently, rebuilding one a failed build left invalid, and drops the indexes it replaces', async () => {
    // A database at version 4 (events stored), where a concurrent build of events_free failed half way.
    const { db, client } = await databaseAtVersion4();
    try {
      await client.query(
        `INSERT INTO events (id, endpoint, action, received_at, envelope, status, next_attempt_at) VALUES ('a', '/w', 'message', 1, '{}', 'queued', 1), ('b', '/w', 'message', 2, '{}', 'queued', 2)`,
      );
      await assert.rejects(
        client.query('CREATE UNIQUE INDEX CONCURRENTLY events_free ON events (action)'),
        /could not create unique index/,
      );
      const valid = async (index: string) =>
        (await client.query('SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)', [index])).rows[0]
          ?.indisvalid;
      assert.equal(await valid('events_free'), false, 'left invalid');
      // The CLI (which does not migrate) refuses a schema behind it, saying what to run; a Gmail command met a missing table before.
      await assert.rejects(
        PostgresEventStore.open(storage(db)),
        /has schema version 4, older than this gatehouse's \d+: run `gatehouse storage migrate`/,
      );
      const store = await PostgresEventStore.open(storage(db), { migrate: true, logger: silent });
      await store.close();
      assert.equal(await valid('events_free'), true);
      const { rows } = await client.query(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'events' AND indexname IN ('events_free', 'events_due', 'events_next')",
      );
      assert.deepEqual(
        rows.map((r) => r.indexname),
        ['events_free'],
      );
      assert.match(
        rows[0].indexdef,
        /\(action, next_attempt_at, id\) WHERE \(\(status = 'queued'::text\) AND \(lease_until IS NULL\)\)/,
      );
      assert.deepEqual(
        (await client.query('SELECT version FROM schema_migrations ORDER BY version')).rows.map((r) => r.version),
        MIGRATIONS.map((m) => m.version),
      );
    } finally {
      await client.end();
    }
  });

  it('concurrent claims from two instances never hand the same event to both', async () => {
    const [a, b] = [await instance(), await instance()];
    const accepted = await Promise.all(
      Array.from({ length: 200 }, (_, i) => (i % 2 ? a : b).accept(event({ receivedAt: T0 + (i % 5) }))),
    );
    const claimedBy = { a: [] as string[], b: [] as string[] };
    // Every drainer's first claim is in flight before any drainer goes on, so both instances take
    // part however the machine schedules them (a loaded one let one instance drain all 200).
    let firstClaims = 0;
    let allStarted!: () => void;
    const started = new Promise<void>((resolve) => (allStarted = resolve));
    const drain = async (store: EventStore, into: string[]) => {
      for (let round = 0; ; round++) {
        const got = await store.claimDue(T0 + 10, 7, LEASE, 'message');
        if (round === 0 && ++firstClaims === 4) allStarted();
        if (round === 0) await started;
        if (got.length === 0) return;
        into.push(...got.map((e) => e.id));
      }
    };
    await Promise.all([drain(a, claimedBy.a), drain(b, claimedBy.b), drain(a, claimedBy.a), drain(b, claimedBy.b)]);
    const all = [...claimedBy.a, ...claimedBy.b];
    assert.equal(new Set(all).size, all.length, 'no event claimed twice');
    assert.deepEqual(new Set(all), new Set(accepted.map((r) => r.id)));
    assert.ok(
      claimedBy.a.length > 0 && claimedBy.b.length > 0,
      `both instances claimed (${claimedBy.a.length} / ${claimedBy.b.length})`,
    );
    await (a as PostgresEventStore).releaseLeases();
    await (b as PostgresEventStore).releaseLeases();
    await a.purgeDelivered(Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
    for (const id of all) await a.recordAttempt(id, attempt(1, T0, 200), { status: 'delivered' });
    await a.purgeDelivered(Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
  });

  it("a lease that expires (its instance died) is taken over; the old holder's late outcome and renewal are ignored", async () => {
    const [a, b] = [await instance(), await instance()];
    const { id } = await a.accept(event({ idempotencyKey: 'lease-takeover' }));
    const [held] = await a.claimDue(T0, 1, LEASE, 'message');
    assert.equal(held?.id, id);
    assert.deepEqual(await b.claimDue(T0 + LEASE - 1, 10, LEASE, 'message'), [], 'still leased');
    const [taken] = await b.claimDue(T0 + LEASE, 10, LEASE, 'message');
    assert.equal(taken?.id, id, "taken over at the lease's end");
    assert.equal(await a.renewLease(id, held!.claimId, T0 + 10 * LEASE), false);
    assert.equal(await a.recordAttempt(id, attempt(1, T0, 200), { status: 'delivered' }, held!.claimId), false);
    assert.equal((await b.get(id))?.event.status, 'queued');
    assert.equal(await b.recordAttempt(id, attempt(1, T0 + LEASE, 200), { status: 'delivered' }, taken!.claimId), true);
    const got = await a.get(id);
    assert.equal(got?.event.status, 'delivered');
    assert.equal(got?.attempts.length, 1);
    // releaseLeases frees this instance's leases only. (Stored by an instance whose deliverer never
    // claimed: a's own accepts are leased to a by their INSERT now.)
    await (await instance()).accept(event({ idempotencyKey: 'lease-owner' }));
    const [mine] = await b.claimDue(T0, 1, LEASE, 'message');
    assert.equal(await a.releaseLeases(), 0);
    assert.deepEqual(await a.claimDue(T0 + 1, 1, LEASE, 'message'), [], "b's lease survives a's release");
    assert.equal(await b.releaseLeases(), 1);
    // A second on: a found nothing at T0 + 1 and asks again after its quiet time (a listening one is woken by b's NOTIFY).
    assert.equal((await a.claimDue(T0 + 1_001, 1, LEASE, 'message'))[0]?.id, mine!.id);
  });

  it("a retry from the CLI leaves an attempt under way alone, even one claimed by an instance whose clock is ahead of the CLI's", async () => {
    const [server, cli] = [await instance(), await instance()];
    const { id } = await cli.accept(event({ idempotencyKey: 'retry-while-leased' }));
    const [held] = await server.claimDue(T0, 1, LEASE, 'message');
    assert.equal(held?.id, id);
    // The CLI's clock is 10 s behind: the event's next attempt (T0) is "later" for it, but the event is leased.
    assert.equal(await cli.requeue(id, T0 - 10_000), false);
    assert.equal(await cli.requeueWaiting(T0 - 10_000), 0);
    assert.equal(
      await server.recordAttempt(id, attempt(1, T0, 200), { status: 'delivered' }, held!.claimId),
      true,
      'the holder still settles it',
    );
    assert.equal((await cli.get(id))?.event.status, 'delivered');
  });

  it('the same delivery id (or signed request) accepted by two instances at once is stored once', async () => {
    const [a, b] = [await instance(), await instance()];
    const keys = Array.from({ length: 60 }, (_, i) => `dup-${i}`);
    const pairs = await Promise.all(
      keys.map((k) => Promise.all([a.accept(event({ idempotencyKey: k })), b.accept(event({ idempotencyKey: k }))])),
    );
    for (const [x, y] of pairs) {
      assert.equal(x.id, y.id);
      assert.equal([x, y].filter((r) => r.duplicate).length, 1);
    }
    const replays = await Promise.all(
      keys.map((k, i) =>
        Promise.all([
          a.accept(event({ idempotencyKey: `r-a-${i}`, replayKey: `sig-${k}` })),
          b.accept(event({ idempotencyKey: `r-b-${i}`, replayKey: `sig-${k}` })),
        ]),
      ),
    );
    for (const [x, y] of replays) {
      assert.equal(x.id, y.id);
      assert.equal([x, y].filter((r) => r.duplicate).length, 1);
    }
    const stored = await a.list({ limit: 10_000 });
    const mentioned = new Set([...pairs, ...replays].flat().map((r) => r.id));
    assert.equal(stored.filter((e) => mentioned.has(e.id)).length, keys.length * 2, 'one row per delivery');
  });

  it('NOTIFY wakes the other instances after a commit; two deliverers deliver every event exactly once', async () => {
    const [a, b] = [await instance({ listen: true }), await instance({ listen: true })];
    let woken = 0;
    const stop = b.onDue!(() => woken++);
    await waitFor(() => woken > 0, { what: 'LISTEN connected' }); // called once on connect
    const before = woken;
    await a.accept(event({ receivedAt: Date.now() }));
    await waitFor(() => woken > before, { timeoutMs: 2_000, what: 'a NOTIFY from the other instance' });
    stop();

    const target = await startTarget(5);
    const config = deliveryConfig(target.url);
    const deliverers = [new Deliverer(a, config, silent), new Deliverer(b, config, silent)];
    await Promise.all(deliverers.map((d) => d.start()));
    try {
      const accepted = await Promise.all(
        Array.from({ length: 80 }, (_, i) => (i % 2 ? a : b).accept(event({ receivedAt: Date.now() }))),
      );
      const expected = new Set([...accepted.map((r) => r.id)]);
      await waitFor(() => [...expected].every((id) => target.ids.includes(id)), {
        timeoutMs: 15_000,
        what: 'every event delivered',
      });
      const delivered = target.ids.filter((id) => expected.has(id));
      assert.equal(delivered.length, expected.size, 'each delivered exactly once');
      await waitFor(
        async () => {
          const statuses = await Promise.all([...expected].map(async (id) => (await a.get(id))?.event.status));
          return statuses.every((s) => s === 'delivered');
        },
        { what: 'every outcome committed' },
      );
    } finally {
      await Promise.all(deliverers.map((d) => d.stop(1_000)));
      await target.close();
    }
  });

  it("under steady accepts a retry and a dead instance's expired lease are claimed when due, ahead of newer accepts", async () => {
    // (Found by review: while fresh accepts filled every claim, the database was never asked.)
    await onNewDatabase(async ([a, dead]) => {
      const T = Date.now();
      const { id: orphan } = await dead.accept(event({ receivedAt: T - 100, idempotencyKey: 'orphan' }));
      assert.equal(
        (await dead.claimDue(T, 1, 1_000, 'message'))[0]?.id,
        orphan,
        'claimed by an instance that then dies: its lease runs out at T + 1 s',
      );
      assert.deepEqual(await a.claimDue(T, 1, LEASE, 'message'), []); // a's deliverer is claiming: its accepts are leased to it on insert
      const { id: retry } = await a.accept(event({ receivedAt: T }));
      const [first] = await a.claimDue(T, 1, LEASE, 'message');
      assert.equal(first?.id, retry);
      assert.equal(
        await a.recordAttempt(retry, attempt(1, T, 503), { status: 'queued', nextAttemptAt: T + 10 }, first!.claimId),
        true,
      );
      const order: string[] = [];
      for (let i = 1; i <= 5; i++) {
        const now = T + i * 1_000; // one new accept for every free slot
        await a.accept(event({ receivedAt: now }));
        for (const e of await a.claimDue(now, 1, LEASE, 'message')) {
          order.push(e.id === orphan ? 'orphan' : e.id === retry ? 'retry' : 'new');
          await a.recordAttempt(e.id, attempt(e.attempts + 1, now, 200), { status: 'delivered' }, e.claimId);
        }
      }
      assert.deepEqual(order, ['orphan', 'retry', 'new', 'new', 'new'], 'the oldest due first, whichever the source');
    });
  });

  it('an instance leases to its own deliverer only about two seconds of its delivery rate: the rest is claimable by the others at once', async () => {
    // (Found by review: a busy instance held up to 5,000 accepts under its leases while idle instances could not take them.)
    await onNewDatabase(async ([busy, idle]) => {
      const T = Date.now();
      assert.deepEqual(await busy.claimDue(T, 1, LEASE, 'message'), []); // its deliverer claims (and then takes nothing: a slow target)
      const accepted = await Promise.all(Array.from({ length: 200 }, () => busy.accept(event({ receivedAt: T }))));
      const taken = await idle.claimDue(T + 1, 500, LEASE, 'message');
      assert.equal(taken.length, 200 - 64, 'all but the 64 leased to the busy instance');
      const mine = await busy.claimDue(T + 1, 500, LEASE, 'message');
      assert.equal(mine.length, 64);
      assert.deepEqual(new Set([...taken, ...mine].map((e) => e.id)), new Set(accepted.map((r) => r.id)));
    });
  });

  it("a busy instance's look in the database takes only what goes ahead of its own due events, leaving newer ones to the others", async () => {
    // (Found by review: each look claimed up to the limit and held what it could not start yet under its lease.)
    await onNewDatabase(async ([busy, elsewhere, idle]) => {
      const T = Date.now();
      assert.deepEqual(await busy.claimDue(T, 1, LEASE, 'message'), []);
      const own = await Promise.all([1, 2, 3, 4, 5].map(() => busy.accept(event({ receivedAt: T }))));
      const newer = await Promise.all([1, 2, 3].map(() => elsewhere.accept(event({ receivedAt: T + 5 })))); // unleased: no deliverer there
      const taken = await busy.claimDue(T + 1_100, 2, LEASE, 'message'); // past the 1 s look
      assert.deepEqual(
        taken.map((e) => e.id),
        own.slice(0, 2).map((r) => r.id),
      );
      const byIdle = await idle.claimDue(T + 1_100, 10, LEASE, 'message');
      assert.deepEqual(
        new Set(byIdle.map((e) => e.id)),
        new Set(newer.map((r) => r.id)),
        'the newer accepts were left claimable',
      );
    });
  });

  it('a long attempt renews its lease, so no other instance claims it meanwhile', async () => {
    const [a, b] = [await instance(), await instance()];
    const target = await startTarget(900);
    const config = deliveryConfig(target.url, { timeoutMs: 1_000, concurrency: 1 });
    const renewals: boolean[] = [];
    const counting = new Proxy(a, {
      get(t, prop, receiver) {
        const value = Reflect.get(t, prop, receiver);
        if (prop === 'renewLease')
          return async (...args: [string, string, number]) => (
            renewals.push(await t.renewLease(...args)),
            renewals.at(-1)!
          );
        return typeof value === 'function' ? value.bind(t) : value;
      },
    });
    const deliverer = new Deliverer(counting, config, silent, Date.now, { leaseMarginMs: 0 }); // lease = 1 s, renewed every 0.5 s
    // Earlier cases' leftovers on this database would be delivered first, one at a time: settled beforehand.
    for (const e of await a.list({ status: 'queued', limit: 10_000 }))
      await a.recordAttempt(e.id, attempt(e.attempts + 1, T0, 200), { status: 'delivered' });
    const { id } = await a.accept(event({ receivedAt: Date.now() }));
    await deliverer.start();
    try {
      await waitFor(async () => (await a.status(Date.now())).leased > 0, { what: 'the attempt under way' });
      await new Promise((r) => setTimeout(r, 600)); // past the first renewal
      // (Earlier cases' leftovers on this database may be claimed: only this event must not be.)
      assert.ok(!(await b.claimDue(Date.now(), 10, 1_000, 'message')).some((e) => e.id === id), 'still held');
      await waitFor(async () => (await a.get(id))?.event.status === 'delivered', { what: 'delivered' });
      assert.ok(renewals.length >= 1 && renewals.every(Boolean), `renewals: ${renewals}`);
      assert.deepEqual(
        target.ids.filter((x) => x === id),
        [id],
      );
    } finally {
      await deliverer.stop(1_000);
      await target.close();
    }
  });
  it('an event whose lease ran low while its claim waited for the database is renewed before its attempt: another instance never delivers it too', async () => {
    await onNewDatabase(async ([a, b, elsewhere]) => {
      const target = await startTarget(2_000); // inside timeoutMs
      const config = deliveryConfig(target.url, { timeoutMs: 5_000, concurrency: 1 });
      const options = { leaseMarginMs: 1_000 }; // lease 6 s, renewed every 3 s while an attempt runs
      const { id } = await elsewhere.accept(event({ receivedAt: Date.now() })); // unleased: no deliverer there
      // a's claim waits 5.5 s before it runs (a pool with no free connection): the lease it takes,
      // counted from the deliverer's time before the wait, has 0.5 s left when it comes back.
      let claimedByA = false;
      const pool = a.database;
      const query = pool.query.bind(pool) as (text: string, values: unknown[]) => Promise<pg.QueryResult>;
      Object.assign(pool, {
        query: async (text: string, values: unknown[]) => {
          if (text !== CLAIM_DUE_SQL || claimedByA) return query(text, values);
          await new Promise((r) => setTimeout(r, 5_500));
          const result = await query(text, values);
          claimedByA ||= result.rows.some((row: { id: string | null }) => row.id === id);
          return result;
        },
      });
      const first = new Deliverer(a, config, silent, Date.now, options);
      await first.start();
      await waitFor(() => claimedByA, { what: "a's claim of the event" });
      // Another instance claims what is due or whose lease ran out, as soon as it can.
      const second = new Deliverer(b, config, silent, Date.now, options);
      await second.start();
      try {
        await waitFor(async () => (await a.get(id))?.event.status === 'delivered', {
          timeoutMs: 20_000,
          what: 'delivered',
        });
      } finally {
        await Promise.all([first.stop(5_000), second.stop(5_000)]);
        await target.close();
      }
      assert.deepEqual(
        target.ids.filter((x) => x === id),
        [id],
        'posted once',
      );
    });
  });
});

describe('PostgresEventStore: a claim and a scrape read only what they need', { skip, timeout: 90_000 }, () => {
  /** Rows of `events` a statement's plan read (returned or filtered out), by EXPLAIN ANALYZE, rolled back. */
  async function rowsRead(client: pg.Client, sql: string, params: unknown[]): Promise<number> {
    await client.query('BEGIN');
    try {
      const { rows } = await client.query(`EXPLAIN (ANALYZE, FORMAT JSON) ${sql}`, params);
      let read = 0;
      const walk = (node: Record<string, unknown>) => {
        if (node['Relation Name'] === 'events')
          read +=
            ((node['Actual Rows'] as number) + ((node['Rows Removed by Filter'] as number | undefined) ?? 0)) *
            (node['Actual Loops'] as number);
        for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) walk(child);
      };
      walk(rows[0]['QUERY PLAN'][0].Plan);
      return read;
    } finally {
      await client.query('ROLLBACK');
    }
  }

  interface Rows {
    prefix: string;
    action: string;
    status?: string;
    count: number;
    firstAt: number;
    leaseUntil?: number | null;
  }
  /**
   * A fresh database with a store on it and a plain connection that fills it: `count` rows of
   * `action` in `status` (default queued) received from firstAt + 1 ms on, ids prefix000001…, each
   * due when received (delivered then, if delivered), leased to another instance until
   * `leaseUntil` if given.
   */
  async function onFilledDatabase(
    run: (store: PostgresEventStore, client: pg.Client, add: (rows: Rows) => Promise<unknown>) => Promise<void>,
  ): Promise<void> {
    const url = await pgc().createDatabase();
    const store = await PostgresEventStore.open(storage(url), { migrate: true, logger: silent });
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    const envelope = JSON.stringify({ padding: 'x'.repeat(500) });
    const add = ({ prefix, action, status = 'queued', count, firstAt, leaseUntil = null }: Rows) =>
      client.query(
        `INSERT INTO events (id, endpoint, action, received_at, envelope, status, next_attempt_at, delivered_at, lease_until, claim_id, lease_owner)
       SELECT $1 || lpad(g::text, 6, '0'), '/webhook/x', $2, $3::bigint + g, $4, $5, $3::bigint + g, CASE WHEN $5 = 'delivered' THEN $3::bigint + g END,
              $6::bigint, CASE WHEN $6::bigint IS NULL THEN NULL ELSE gen_random_uuid() END, CASE WHEN $6::bigint IS NULL THEN NULL ELSE 'other' END
         FROM generate_series(1, $7::int) g`,
        [prefix, action, firstAt, envelope, status, leaseUntil, count],
      );
    try {
      await run(store, client, add);
    } finally {
      await client.end();
      await store.close();
    }
  }

  it('a backlog behind 5,000 rows another instance holds: 32 claimed, oldest (an expired lease) first, without reading the rest', async () => {
    await onFilledDatabase(async (store, client, add) => {
      const now = T0 + 100_000;
      await add({ prefix: 'expired-', action: 'message', count: 1, firstAt: T0 - 10, leaseUntil: now - 1 }); // its holder died: claimable, and the oldest
      await add({ prefix: 'held-', action: 'message', count: 5_000, firstAt: T0, leaseUntil: now + LEASE }); // another instance's accepts, leased to it
      await add({ prefix: 'agent-', action: 'agent', count: 5_000, firstAt: T0 }); // another action's backlog
      await add({ prefix: 'free-', action: 'message', count: 20_000, firstAt: T0 + 10_000 });
      // Planned without statistics (a fresh table) and with them: neither reads the backlog or the held rows.
      const before = await rowsRead(client, CLAIM_DUE_SQL, [now, LEASE, 'me', 'message', 32, now]);
      await client.query('ANALYZE events');
      const after = await rowsRead(client, CLAIM_DUE_SQL, [now, LEASE, 'me', 'message', 32, now]);
      assert.ok(
        before < 300 && after < 300,
        `rows of events read by a claim of 32: ${before} without statistics, ${after} with`,
      );
      const claimed = await store.claimDue(now, 32, LEASE, 'message');
      assert.deepEqual(
        claimed.map((e) => e.id),
        ['expired-000001', ...Array.from({ length: 31 }, (_, i) => `free-${String(i + 1).padStart(6, '0')}`)],
      );
      assert.equal(await store.nextDueAt(now), T0 + 1, 'more are due: the oldest unleased (of any action)');
      assert.equal((await store.queueStats(now)).oldestDueAt, T0 - 9, 'the oldest due counts leased rows too');
    });
  });

  it('a scrape counts queued and dead events without reading the 20,000 delivered ones (they are recounted apart)', async () => {
    // Found by measuring: each scrape read the whole table (450 ms at 1,000,000 events).
    await onFilledDatabase(async (store, client, add) => {
      await add({ prefix: 'delivered-', action: 'message', status: 'delivered', count: 20_000, firstAt: T0 });
      await add({ prefix: 'queued-', action: 'message', count: 30, firstAt: T0 });
      await add({ prefix: 'leased-', action: 'message', count: 5, firstAt: T0, leaseUntil: T0 + LEASE });
      await add({ prefix: 'dead-', action: 'agent', status: 'dead', count: 3, firstAt: T0 });
      const before = await rowsRead(client, UNDELIVERED_COUNTS_SQL, []);
      await client.query('ANALYZE events');
      const after = await rowsRead(client, UNDELIVERED_COUNTS_SQL, []);
      assert.ok(
        before < 200 && after < 200,
        `rows of events read by a scrape's counts: ${before} without statistics, ${after} with`,
      );
      const counts = Object.fromEntries(
        (await store.queueStats(T0)).counts.map((c) => [`${c.action}/${c.status}`, c.events]),
      );
      assert.deepEqual(counts, { 'message/queued': 35, 'agent/dead': 3, 'message/delivered': 20_000 });
    });
  });

  it('closing the store does not wait for a recount of the delivered events under way (it is cancelled)', async () => {
    // Found by review: pool.end() waited for the recount's connection, up to its 10-minute timeout, past systemd's stop timeout.
    await onFilledDatabase(async (store, client) => {
      await store.queueStats(T0); // the first count
      await client.query('BEGIN');
      await client.query('LOCK TABLE events IN ACCESS EXCLUSIVE MODE'); // the next count waits here, as a long one would run
      try {
        // The recount alone (a scrape's other statements would wait on the lock too).
        await (store as unknown as { delivered: DeliveredCounts }).delivered.get(T0 + DELIVERED_RECOUNT_MS);
        await waitFor(
          async () => {
            // Inside this transaction the activity view is a snapshot taken at its first read: cleared for each look.
            await client.query('SELECT pg_stat_clear_snapshot()');
            const { rows } = await client.query(
              "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%status = ''delivered'' GROUP BY action%'",
            );
            return rows[0].n > 0;
          },
          { what: 'the recount waiting' },
        );
        const closed = await Promise.race([
          store.close().then(() => 'closed'),
          new Promise((r) => setTimeout(() => r('still waiting after 10 s'), 10_000)),
        ]);
        assert.equal(closed, 'closed');
      } finally {
        await client.query('ROLLBACK');
      }
    });
  });
});

describe('PostgresEventStore: Postgres stopped, then restarted', { skip, timeout: 90_000 }, () => {
  it('accept rejects during the outage and works after; nothing accepted is lost; the deliverer pauses and resumes', async () => {
    if ('skip' in cluster) return;
    const url = await pgc().createDatabase();
    const store = await PostgresEventStore.open(storage(url), { migrate: true, listen: true, logger: silent });
    const target = await startTarget();
    const deliverer = new Deliverer(store, deliveryConfig(target.url), silent);
    await deliverer.start();
    const accepted: string[] = [];
    try {
      for (let i = 0; i < 10; i++) accepted.push((await store.accept(event({ receivedAt: Date.now() }))).id);
      await waitFor(() => accepted.every((id) => target.ids.includes(id)), { what: 'the first events delivered' });

      await pgc().stop();
      await assert.rejects(store.accept(event({ receivedAt: Date.now() })));
      // A second on: past the quiet time in which a store that found nothing to claim does not ask again.
      await assert.rejects(store.claimDue(Date.now() + 1_000, 1, LEASE, 'message'));
      await new Promise((r) => setTimeout(r, 300)); // the deliverer and the LISTEN client meet the outage too

      await pgc().start();
      // The pool opens new connections: the first accept after the restart works.
      for (let i = 0; i < 10; i++) accepted.push((await store.accept(event({ receivedAt: Date.now() }))).id);
      await waitFor(() => accepted.every((id) => target.ids.includes(id)), {
        timeoutMs: 15_000,
        what: 'every event delivered after the restart',
      });
      const stored = await store.list({ limit: 1_000 });
      assert.deepEqual(new Set(stored.map((e) => e.id)), new Set(accepted), 'nothing accepted is lost');
      // The target answered; the outcome is committed just after.
      await waitFor(async () => (await store.list({ status: 'delivered', limit: 1_000 })).length === accepted.length, {
        what: 'every event settled as delivered',
      });
    } finally {
      await deliverer.stop(1_000);
      await store.close();
      await target.close();
    }
  });
});

describe('gatehouse on storage.driver "postgres"', { skip, timeout: 90_000 }, () => {
  it('the server migrates at start, answers 202 after COMMIT and delivers; storage and deliveries CLIs work on it', async () => {
    if ('skip' in cluster) return;
    const url = await pgc().createDatabase();
    const target = await startTarget();
    const raw = testConfig('http://127.0.0.1:1', {
      storage: { path: undefined, driver: 'postgres', url },
      webhooks: {
        enabled: true,
        listen: { host: '127.0.0.1', port: 0 },
        endpoints: [{ path: '/webhook/deploys', secret: 's'.repeat(24), action: 'system-event' }],
        targets: { 'system-event': { url: target.url } },
      },
    });
    const gatehouse = await startTestGatehouse(raw);
    try {
      const reply = await request(gatehouse.webhooks!.url, '/webhook/deploys', {
        method: 'POST',
        body: '{"v":1}',
        headers: { 'content-type': 'application/json', 'x-webhook-secret': 's'.repeat(24), 'idempotency-key': 'd-1' },
      });
      assert.equal(reply.status, 202, reply.body);
      const { id } = JSON.parse(reply.body);
      await waitFor(() => target.ids.includes(id), { what: 'delivered' });

      const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-pg-cli-'));
      const file = path.join(dir, 'gateway.json5');
      writeFileSync(file, JSON.stringify({ ...raw, storage: { driver: 'postgres', url: '${TEST_DATABASE_URL}' } }));
      const env = { TEST_DATABASE_URL: url };
      const migrate = await runCli(['storage', 'migrate', '--config', file], { env });
      assert.equal(migrate.code, 0, migrate.stderr);
      assert.match(migrate.stdout, new RegExp(`postgres .*: schema at version ${POSTGRES_SCHEMA_VERSION}`));
      const status = await runCli(['storage', 'status', '--config', file, '--json'], { env });
      assert.equal(status.code, 0, status.stderr);
      const parsed = JSON.parse(status.stdout);
      assert.equal(parsed.driver, 'postgres');
      assert.equal(parsed.schemaVersion, POSTGRES_SCHEMA_VERSION);
      assert.equal(parsed.counts.delivered, 1);
      const list = await runCli(['webhooks', 'deliveries', 'list', '--config', file, '--json'], { env });
      assert.equal(list.code, 0, list.stderr);
      assert.deepEqual(
        JSON.parse(list.stdout).map((e: { id: string; status: string }) => [e.id, e.status]),
        [[id, 'delivered']],
      );
    } finally {
      await gatehouse.close();
      await target.close();
    }
  });

  it('a config with channels is accepted on postgres (their state is in the driver: test/storage/state-stores.test.ts)', () => {
    const base = {
      gateway: { upstream: { target: 'http://127.0.0.1:1' } },
      storage: { driver: 'postgres', url: 'postgres://u@127.0.0.1/db' },
    };
    const config = parseConfig({
      ...base,
      webhooks: { enabled: true, targets: { message: { url: 'http://127.0.0.1:2' } } },
      channels: { tg: { kind: 'qr' } },
    });
    assert.equal(config.storage.driver, 'postgres');
    assert.deepEqual(Object.keys(config.channels), ['tg']);
  });
});
