import { z } from 'zod';

/**
 * `storage`: where durable state lives. `sqlite` (the default; `{ path }` alone means it): one
 * server per file. `postgres`: several gatehouse instances share one database (src/storage/postgres/).
 */
const DEFAULT_STORAGE_PATH = './data/gatehouse.db';
const storageDriver = z.discriminatedUnion('driver', [
  z.strictObject({
    driver: z.literal('sqlite'),
    path: z.string().min(1).default(DEFAULT_STORAGE_PATH),
  }),
  z.strictObject({
    driver: z.literal('postgres'),
    url: z.string({ error: (issue) => (issue.input === undefined ? 'required with driver "postgres": a postgres:// connection URL, e.g. "${DATABASE_URL}"' : undefined) }).regex(/^postgres(ql)?:\/\/./, 'url must be a postgres:// (or postgresql://) connection URL, e.g. "${DATABASE_URL}"'),
    pool: z.strictObject({ max: z.number().int().min(2).max(1000).default(10) }).prefault({}),
  }),
], { error: (issue) => (issue.code === 'invalid_union' ? 'must be "sqlite" (the default) or "postgres"' : undefined) });
export const storage = z.preprocess(
  // No driver: the SQLite of every earlier config (`storage: { path }`, or nothing at all).
  (value) => (value !== null && typeof value === 'object' && !Array.isArray(value) && !('driver' in value) ? { ...value, driver: 'sqlite' } : value),
  storageDriver,
).prefault({});
