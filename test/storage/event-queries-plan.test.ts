import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import Database from 'better-sqlite3';
import pg from 'pg';
import type { DeliveryStatus, EventFilter, EventPageKey } from '../../src/storage/contracts/events.js';
import { listSql as postgresListSql } from '../../src/storage/postgres/events/admin.js';
import { PostgresEventStore } from '../../src/storage/postgres/events.js';
import { listSql as sqliteListSql } from '../../src/storage/sqlite/event-queries.js';
import { SqliteEventStore } from '../../src/storage/sqlite/events.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';

// The admin API's list and filter retry (issue 30) must be answered through an index that is
// already in (received_at, id) order, for every filter without `q` (which reads envelopes, and is
// documented to): no sort of the matching rows and no read of the whole table, on either driver.
// The plans are read from a store of 20,000 events, mostly delivered, with statistics.

const AFTER: EventPageKey = { receivedAt: 1_700_000_010_000, id: 'evt_m' };
const SINCE = 1_700_000_000_000;
/** Every filter shape the API takes, without q, with and without a cursor. */
const FILTERS: [string, EventFilter, readonly DeliveryStatus[]][] = [
  ['none', {}, []],
  ['status', { status: 'delivered' }, ['delivered']],
  ['dead', { status: 'dead' }, ['dead']],
  ['endpoint', { endpoint: '/webhook/b' }, []],
  ['action', { action: 'agent' }, []],
  ['time', { since: SINCE, until: SINCE + 5_000 }, []],
  ['status and endpoint', { status: 'dead', endpoint: '/webhook/b' }, ['dead']],
  ['retry walk (one status at a time)', { endpoint: '/webhook/a' }, ['queued']],
];

const ID_QUERIES: [string, EventFilter][] = [
  ['alone', { q: 'evt_00000042', qMatch: 'id' }],
  ['with a status and an endpoint', { q: 'dlv-42', qMatch: 'id', status: 'dead', endpoint: '/webhook/a' }],
];

describe('the operator list is index-backed: SQLite query plans', () => {
  let dir: string;
  let db: Database.Database;
  before(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-plan-'));
    const file = path.join(dir, 'events.db');
    await new SqliteEventStore(file).close(); // the schema, migrated
    db = new Database(file);
    db.exec(`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 19999)
      INSERT INTO events (id, endpoint, action, received_at, envelope, status, next_attempt_at)
      SELECT printf('evt_%08d', i), '/webhook/' || char(97 + i % 3), CASE i % 3 WHEN 2 THEN 'agent' ELSE 'message' END,
             ${SINCE} + i, '{}', CASE WHEN i % 50 = 0 THEN 'dead' WHEN i % 20 = 0 THEN 'queued' ELSE 'delivered' END, 0 FROM n;
      ANALYZE;`);
  });
  after(() => {
    db.close();
    rmSync(dir, { recursive: true, force: true });
  });

  for (const [name, filter, statuses] of FILTERS) {
    for (const after of [undefined, AFTER]) {
      it(`${name}${after ? ', after a cursor' : ''}: an index in order, no sort, no full scan`, () => {
        const { sql, params } = sqliteListSql(filter, statuses, after, 51);
        const plan = (db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(params) as { detail: string }[])
          .map((r) => r.detail)
          .join('\n');
        assert.doesNotMatch(plan, /TEMP B-TREE/, plan);
        assert.doesNotMatch(plan, /^SCAN events$/m, plan);
        assert.match(plan, /USING (COVERING )?INDEX events_\w*received/, plan);
      });
    }
  }

  // An id or delivery id in q (qMatch 'id', src/admin/deliveries.ts): found by key, not by reading envelopes.
  for (const [name, filter] of ID_QUERIES) {
    it(`q by id, ${name}: the primary key and events_idempotency, no scan of events`, () => {
      const { sql, params } = sqliteListSql(filter, filter.status ? [filter.status] : [], undefined, 51);
      const plan = (db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(params) as { detail: string }[])
        .map((r) => r.detail)
        .join('\n');
      assert.doesNotMatch(plan, /^SCAN (events|e)$/m, plan);
      assert.match(plan, /SEARCH events USING INDEX sqlite_autoindex_events_1 \(id=\?\)/, plan);
      assert.match(plan, /SEARCH x USING INDEX events_idempotency \(endpoint=\? AND idempotency_key=\?\)/, plan);
    });
  }
});

const cluster = await startPostgres();
const skip = 'skip' in cluster ? cluster.skip : false;
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

describe('the operator list is index-backed: PostgreSQL plans', { skip, timeout: 120_000 }, () => {
  let client: pg.Client;
  before(async () => {
    const url = await (cluster as PostgresCluster).createDatabase();
    await (await PostgresEventStore.open({ driver: 'postgres', url, pool: { max: 2 } }, { migrate: true })).close();
    client = new pg.Client({ connectionString: url });
    await client.connect();
    await client.query(`INSERT INTO events (id, endpoint, action, received_at, envelope, status, next_attempt_at)
      SELECT 'evt_' || lpad(i::text, 8, '0'), '/webhook/' || chr(97 + i % 3), CASE i % 3 WHEN 2 THEN 'agent' ELSE 'message' END,
             ${SINCE} + i, '{}', CASE WHEN i % 50 = 0 THEN 'dead' WHEN i % 20 = 0 THEN 'queued' ELSE 'delivered' END, 0
        FROM generate_series(0, 19999) i`);
    await client.query('ANALYZE events');
  });
  after(async () => client?.end());

  for (const [name, filter, statuses] of FILTERS) {
    for (const after of [undefined, AFTER]) {
      it(`${name}${after ? ', after a cursor' : ''}: an index, no sequential scan of events`, async () => {
        const { sql, params } = postgresListSql(filter, statuses, after, 51, 'e.id');
        const { rows } = await client.query<{ 'QUERY PLAN': string }>(`EXPLAIN ${sql}`, params);
        const plan = rows.map((r) => r['QUERY PLAN']).join('\n');
        assert.doesNotMatch(plan, /Seq Scan on events/, plan);
        assert.match(plan, /Index (Only )?Scan (Backward )?using events_\w+ on events/, plan);
      });
    }
  }

  for (const [name, filter] of ID_QUERIES) {
    it(`q by id, ${name}: the primary key and events_idempotency, no sequential scan`, async () => {
      const { sql, params } = postgresListSql(filter, filter.status ? [filter.status] : [], undefined, 51, 'e.id');
      const { rows } = await client.query<{ 'QUERY PLAN': string }>(`EXPLAIN ${sql}`, params);
      const plan = rows.map((r) => r['QUERY PLAN']).join('\n');
      assert.doesNotMatch(plan, /Seq Scan on events/, plan);
      assert.match(plan, /Index Scan using events_pkey on events e\b/, plan);
      assert.match(plan, /Index Scan using events_idempotency on events x\b/, plan);
    });
  }
});
