import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe } from 'node:test';
import Database from 'better-sqlite3';
import pg from 'pg';
import type { PostgresStorageConfig } from '../../src/config/schema.js';
import { PostgresChannelStore } from '../../src/storage/postgres/channels.js';
import { PostgresEventStore } from '../../src/storage/postgres/events.js';
import { PostgresGmailStore } from '../../src/storage/postgres/gmail.js';
import { SqliteChannelStore } from '../../src/storage/sqlite/channels.js';
import { SqliteEventStore } from '../../src/storage/sqlite/events.js';
import { SqliteGmailStore } from '../../src/storage/sqlite/gmail.js';
import { postgresDatabases, type PostgresDatabases } from '../helpers/postgres.js';
import { stateContract, type StateInstance } from './state-contract.js';

// The Gmail and channel state contracts, on a real SQLite file and on a real PostgreSQL database.

describe('Gmail and channel state on SQLite', () => {
  let dir: string | undefined;
  const file = () => path.join(dir!, 'gatehouse.db');
  const instance = (): StateInstance => {
    const events = new SqliteEventStore(file());
    const channels = new SqliteChannelStore(file());
    return {
      events,
      gmail: new SqliteGmailStore(events),
      channels,
      async close() {
        await channels.close();
        await events.close();
      },
    };
  };
  stateContract({
    driver: 'sqlite',
    sharedByInstances: false,
    async open() {
      dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-state-'));
      return instance();
    },
    async other() {
      return instance();
    },
    async ageSeenIds(ms) {
      const db = new Database(file());
      try {
        db.pragma('busy_timeout = 5000');
        db.prepare('UPDATE gmail_seen SET seen_at = seen_at - ?').run(ms);
      } finally {
        db.close();
      }
    },
    async endLockHolders() {
      throw new Error('SQLite: one server per file');
    },
    async reset() {
      if (dir) rmSync(dir, { recursive: true, force: true });
      dir = undefined;
    },
  });
});

const cluster = await postgresDatabases();
const skip = 'skip' in cluster ? cluster.skip : false;
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

describe('Gmail and channel state on PostgreSQL', { skip }, () => {
  let url: string | undefined;
  const storage = (): PostgresStorageConfig => ({ driver: 'postgres', url: url!, pool: { max: 4 } });
  const instance = async (migrate: boolean): Promise<StateInstance> => {
    const events = await PostgresEventStore.open(storage(), { migrate });
    const channels = await PostgresChannelStore.open(storage());
    return {
      events,
      gmail: new PostgresGmailStore(events),
      channels,
      async close() {
        await channels.close();
        await events.close();
      },
    };
  };
  const sql = async (text: string, params: unknown[] = []) => {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      await client.query(text, params);
    } finally {
      await client.end();
    }
  };
  stateContract({
    driver: 'postgres',
    sharedByInstances: true,
    async open() {
      url = await (cluster as PostgresDatabases).createDatabase();
      return instance(true);
    },
    other: () => instance(false),
    ageSeenIds: (ms) => sql('UPDATE gmail_seen SET seen_at = seen_at - $1', [ms]),
    // This database's holders only: the cluster is shared with the run's other files.
    endLockHolders: () =>
      sql(`SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`),
    async reset() {
      url = undefined;
    },
  });
});
