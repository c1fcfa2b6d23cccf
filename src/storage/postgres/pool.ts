import pg from 'pg';
import type { Logger } from 'pino';
import { redactUrlCredentials } from '../../config/redact.js';
import type { PostgresStorageConfig } from '../../config/schema.js';

/** int8 (bigint) columns hold millisecond times and counts: well inside a double's exact range. */
const INT8_OID = 20;
const types = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
    oid === INT8_OID
      ? (value: string) => Number(value)
      : pg.types.getTypeParser(oid, format as 'text')) as pg.CustomTypesConfig['getTypeParser'],
};

/** Connection settings every gatehouse connection shares (the pool's and the LISTEN client's). */
export function connectionOptions(url: string): pg.ClientConfig {
  return {
    connectionString: url,
    types,
    application_name: 'gatehouse',
    keepAlive: true,
    // A Postgres that does not answer must fail requests (503) rather than hang them.
    connectionTimeoutMillis: 5_000,
    query_timeout: 30_000,
  };
}

/**
 * The one pool of a process's storage driver. A connection Postgres drops while idle is
 * reported and discarded (pg emits 'error' on the pool: unhandled, it would crash the process);
 * the next query opens a new one, so the pool reconnects by itself once Postgres is back.
 */
export function createPool(storage: PostgresStorageConfig, logger?: Pick<Logger, 'warn'>): pg.Pool {
  return reportingLostConnections(new pg.Pool(poolConfig(storage)), logger);
}

/** The settings of a storage driver's pool (createPool's; a gated one's too). */
export function poolConfig(storage: PostgresStorageConfig): pg.PoolConfig {
  return { ...connectionOptions(storage.url), max: storage.pool.max, idleTimeoutMillis: 30_000 };
}

/** See createPool: an idle connection lost is reported, not a crash. */
export function reportingLostConnections<P extends pg.Pool>(pool: P, logger?: Pick<Logger, 'warn'>): P {
  pool.on('error', (err) =>
    logger?.warn({ err: err.message }, 'postgres: an idle connection was lost; the pool opens a new one when needed'),
  );
  return pool;
}

/**
 * Runs `work` on one pooled connection (a transaction, the advisory lock). A checked-out
 * connection has no 'error' listener of pg-pool's: one is attached here, so a connection lost
 * between two statements fails `work` instead of crashing the process.
 */
export async function withClient<T>(pool: pg.Pool, work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let lost: Error | undefined;
  const onError = (err: Error) => (lost = err);
  client.on('error', onError);
  try {
    return await work(client);
  } catch (err) {
    lost ??= isConnectionError(err) ? (err as Error) : undefined;
    throw err;
  } finally {
    client.off('error', onError);
    client.release(lost); // a broken connection is destroyed, not returned to the pool
  }
}

/** Runs `work` in a transaction on one connection: COMMIT when it resolves, ROLLBACK when it throws. */
export async function inTransaction<T>(pool: pg.Pool, work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  return withClient(pool, async (client) => {
    await client.query('BEGIN');
    try {
      const result = await work(client);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {});
      throw err;
    }
  });
}

/** Errors that say the connection itself is gone (not a statement's own failure). */
function isConnectionError(err: unknown): boolean {
  const code = (err as { code?: string }).code;
  return (
    code === undefined ||
    code.startsWith('08') ||
    code === '57P01' ||
    code === '57P02' ||
    code === '57P03' ||
    /^E[A-Z]+$/.test(code)
  );
}

/** Deadlocks and serialization failures: the transaction did nothing and may simply run again. */
export function isRetryableTransactionError(err: unknown): boolean {
  const code = (err as { code?: string }).code;
  return code === '40P01' || code === '40001';
}

/**
 * The URL as logs and `storage status` may show it: no password, in the userinfo or in the query
 * (`?password=`, `?sslpassword=`: node-postgres and libpq read them there too).
 */
export function describeUrl(url: string): string {
  return redactUrlCredentials(url);
}
