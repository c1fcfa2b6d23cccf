import { z } from 'zod';

/**
 * `storage`: where durable state lives. `sqlite` (the default; `{ path }` alone means it): one
 * server per file. `postgres`: several gatehouse instances share one database (src/storage/postgres/).
 */
const DEFAULT_STORAGE_PATH = './data/gatehouse.db';
const storageDriver = z.discriminatedUnion(
  'driver',
  [
    z.strictObject({
      driver: z.literal('sqlite').meta({
        description: '`"sqlite"`: one SQLite file, for one gatehouse server. A `storage` without `driver` is SQLite.',
        docsDefault: '`"sqlite"`',
      }),
      path: z
        .string()
        .min(1)
        .default(DEFAULT_STORAGE_PATH)
        .describe(
          "The SQLite file (webhook events, Gmail, channels); its folder is created. Relative to the config file's folder.",
        ),
    }),
    z.strictObject({
      driver: z
        .literal('postgres')
        .describe('`"postgres"`: one PostgreSQL database that several gatehouse instances share.'),
      url: z
        .string({
          error: (issue) =>
            issue.input === undefined
              ? 'required with driver "postgres": a postgres:// connection URL, e.g. "${DATABASE_URL}"'
              : undefined,
        })
        .regex(
          /^postgres(ql)?:\/\/./,
          'url must be a postgres:// (or postgresql://) connection URL, e.g. "${DATABASE_URL}"',
        )
        .meta({
          description:
            'The connection URL, `postgres://user:password@host:5432/db` (parameters such as `?sslmode=require` go in it), normally `"${DATABASE_URL}"`.',
          docsType: 'postgres:// URL',
        }),
      pool: z
        .strictObject({
          max: z
            .number()
            .int()
            .min(2)
            .max(1000)
            .default(10)
            .describe(
              'Connections per pool, opened as needed, plus one kept for LISTEN. An instance has a pool for webhooks and Gmail and one for the shared lockout; with `channels`, the receiver and each gateway process have one more for their state.',
            ),
        })
        .prefault({})
        .describe('The connection pools gatehouse keeps to the database.'),
      // Optional rather than defaulted: the stores' callers build this object by hand too (storage copy, tests).
      requireAtStart: z.boolean().optional().meta({
        docsDefault: '`false`',
        description:
          '`true`: `gatehouse start` exits (one line, status 1) when the database cannot be reached or its schema is newer. `false`: it starts without it: `/api/` serves (lockout and rate limits count locally), webhooks answer 503 `store_unavailable`, `/readyz` fails `store`, Gmail and channels wait, and it connects (and migrates) with backoff, logging each change once.',
      }),
    }),
  ],
  { error: (issue) => (issue.code === 'invalid_union' ? 'must be "sqlite" (the default) or "postgres"' : undefined) },
);
export const storage = z
  .preprocess(
    // No driver: the SQLite of every earlier config (`storage: { path }`, or nothing at all).
    (value) =>
      value !== null && typeof value === 'object' && !Array.isArray(value) && !('driver' in value)
        ? { ...value, driver: 'sqlite' }
        : value,
    storageDriver,
  )
  .prefault({})
  .describe(
    'Where durable state lives: webhook events and their deliveries, the Gmail and channel grants, and with PostgreSQL the lockout and rate limits that instances share. A change needs a restart.',
  );
