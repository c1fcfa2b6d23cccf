import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import pg from 'pg';
import type { LockoutSettings } from '../../src/http/lockout.js';
import { PostgresLockoutStore } from '../../src/storage/postgres/lockout.js';
import { postgresDatabases, type PostgresDatabases } from '../helpers/postgres.js';
import { waitFor } from '../helpers/wait.js';

// An operator's lift of a lockout shared on PostgreSQL (the admin API's DELETE lockouts/<client>):
// two stores on one database stand for two instances. The lift spreads as a lock does: by NOTIFY
// at once, and by the periodic refresh when the NOTIFY never came.

const databases = await postgresDatabases();
const skip = 'skip' in databases ? databases.skip : false;
after(async () => {
  if (!('skip' in databases)) await databases.destroy();
});

const SETTINGS: LockoutSettings = { max: 3, windowSeconds: 60, lockoutSeconds: 300 };

describe('PostgresLockoutStore.lift', { skip, timeout: 60_000 }, () => {
  async function twoStores() {
    const url = await (databases as PostgresDatabases).createDatabase();
    const storage = { driver: 'postgres' as const, url, pool: { max: 2 } };
    const one = await PostgresLockoutStore.open(storage);
    const two = await PostgresLockoutStore.open(storage);
    const liftedAtTwo: string[] = [];
    const liftedAtOne: string[] = [];
    two.onLifted((key) => liftedAtTwo.push(key));
    one.onLifted((key) => liftedAtOne.push(key));
    return { url, one, two, liftedAtOne, liftedAtTwo, close: () => Promise.all([one.close(), two.close()]) };
  }

  /** `max` failures of `key` through the first store, each after the one before reached the database; until the second refuses it too. */
  async function lockOnBoth(s: Awaited<ReturnType<typeof twoStores>>, key: string): Promise<void> {
    for (let i = 0; i < SETTINGS.max; i++) {
      s.one.recordFailure(key, Date.now(), SETTINGS);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.ok(s.one.refusedFor(key, Date.now(), SETTINGS) > 0);
    await waitFor(() => s.two.refusedFor(key, Date.now(), SETTINGS) > 0, {
      what: 'the second instance learning the lock',
    });
  }

  it('lifts in the database and on the other instance (NOTIFY), which tells its listeners; the count starts afresh', async () => {
    const s = await twoStores();
    try {
      await lockOnBoth(s, 'gateway:192.0.2.1');
      const lifted = await s.one.lift(['gateway:192.0.2.1', 'webhooks:192.0.2.1'], Date.now());
      assert.deepEqual(
        lifted.map(([key]) => key),
        ['gateway:192.0.2.1'],
      );
      assert.equal(s.one.refusedFor('gateway:192.0.2.1', Date.now(), SETTINGS), 0, 'lifted here at once');
      await waitFor(() => s.two.refusedFor('gateway:192.0.2.1', Date.now(), SETTINGS) === 0, {
        what: 'the second instance lifting it',
      });
      // Both keys: a worker's share may hold a client the shared count does not.
      await waitFor(() => s.liftedAtTwo.length === 2, { what: 'the listeners told of both keys' });
      assert.deepEqual(s.liftedAtTwo.sort(), ['gateway:192.0.2.1', 'webhooks:192.0.2.1']);
      assert.deepEqual(s.liftedAtOne, [], 'its own lift is not news to the lifting instance');
      const db = new pg.Client({ connectionString: s.url });
      await db.connect();
      try {
        const { rows } = await db.query("SELECT key FROM lockouts WHERE key LIKE '%192.0.2.1'");
        assert.deepEqual(rows, [], 'the row is gone: counted afresh');
      } finally {
        await db.end();
      }
      assert.deepEqual(await s.two.lift(['gateway:192.0.2.1'], Date.now()), [], 'a second lift finds nothing');
    } finally {
      await s.close();
    }
  });

  it('a lift whose NOTIFY never came is found by the refresh: the lock gone from the database ends here too', async () => {
    const s = await twoStores();
    try {
      await lockOnBoth(s, 'gateway:192.0.2.2');
      // What a lift does in the database, without its NOTIFY: as if the LISTEN connection had been down.
      const db = new pg.Client({ connectionString: s.url });
      await db.connect();
      try {
        await db.query("DELETE FROM lockouts WHERE key = 'gateway:192.0.2.2'");
      } finally {
        await db.end();
      }
      // The refresh runs every 5 s.
      await waitFor(() => s.two.refusedFor('gateway:192.0.2.2', Date.now(), SETTINGS) === 0, {
        what: 'the refresh lifting the lock',
        timeoutMs: 12_000,
      });
      assert.deepEqual(s.liftedAtTwo, ['gateway:192.0.2.2'], 'its listeners (the gateway workers) are told');
    } finally {
      await s.close();
    }
  });
});
