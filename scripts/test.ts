/**
 * `npm test` after the build: the test files under node:test (two at a time, each in its own process)
 * with one PostgreSQL for the whole run. node:test on Node 20 has no global setup, so this runs it:
 *
 * - initdb once into a template folder ($GATEHOUSE_TEST_PG_TEMPLATE); every cluster of the run copies it
 *   instead of running initdb again (several seconds each on a loaded machine);
 * - one cluster shared by the run ($GATEHOUSE_TEST_PG_URL): a file that only needs databases creates its
 *   own there (test/helpers/postgres.ts, postgresDatabases); a file that stops or restarts the server
 *   starts a cluster of its own, from the template;
 * - then `node --import tsx --test --test-concurrency=2 <files>`, its exit code ours; the cluster and
 *   the template are removed after it, also on SIGINT/SIGTERM. The spec reporter, not TAP (node's default
 *   when stdout is not a terminal): it repeats every failure at the end, where a CI log's tail shows it.
 *
 * Arguments: options are passed to node before the files (`npm test -- --test-name-pattern=lockout`);
 * file arguments replace the default test/*\/*.test.ts. Without PostgreSQL installed the files skip
 * their PostgreSQL tests loudly, as they do when run alone (on CI, CI=true, that is a failure).
 */
import { spawn } from 'node:child_process';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  findPostgresBin,
  initTemplate,
  startPostgres,
  TEST_PG_ENV,
  type PostgresCluster,
} from '../test/helpers/postgres.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const args = process.argv.slice(2);
const options = args.filter((a) => a.startsWith('-'));
const named = args.filter((a) => !a.startsWith('-'));
const files = named.length > 0 ? named : defaultFiles();

/** test/*\/*.test.ts, in the order the shell's glob gave them. */
function defaultFiles(): string[] {
  const test = path.join(root, 'test');
  return readdirSync(test, { withFileTypes: true })
    .filter((d) => d.isDirectory())
    .flatMap((d) =>
      readdirSync(path.join(test, d.name))
        .filter((f) => f.endsWith('.test.ts'))
        .map((f) => path.join(test, d.name, f)),
    )
    .sort()
    .map((f) => path.relative(process.cwd(), f));
}

const cleanups: (() => Promise<void> | void)[] = [];
let cleaned: Promise<void> | undefined;
/** Stops the cluster, then removes the template; once, whichever way the run ends. */
const cleanUp = () =>
  (cleaned ??= (async () => {
    for (const step of cleanups.reverse())
      await Promise.resolve()
        .then(step)
        .catch((err) => console.error('test runner: cleanup:', err));
  })());

let child: ReturnType<typeof spawn> | undefined;
let stopping = false;
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    child?.kill(signal);
    void cleanUp().then(() => process.exit(128 + (signal === 'SIGINT' ? 2 : 15)));
  });
}

const env: NodeJS.ProcessEnv = { ...process.env };
if (findPostgresBin()) {
  const started = Date.now();
  const template = await initTemplate({ purpose: 'the PostgreSQL tests' });
  if (!('skip' in template)) {
    cleanups.push(() => template.remove());
    env[TEST_PG_ENV.template] = template.data;
    // More connections than a file's own cluster: two files at a time, each with several instances' pools.
    const cluster = await startPostgres({
      template: template.data,
      purpose: 'the PostgreSQL tests',
      maxConnections: 400,
    });
    if (!('skip' in cluster)) {
      cleanups.push(() => (cluster as PostgresCluster).destroy());
      env[TEST_PG_ENV.url] = `postgres://postgres@127.0.0.1:${cluster.port}/postgres`;
      console.log(`test runner: PostgreSQL for the run on port ${cluster.port} (${Date.now() - started} ms)`);
    }
  }
}
// else: each file reports the missing binaries itself (and fails on CI), as when run alone.

if (stopping) {
  await cleanUp();
} else {
  const reporter = options.some((o) => o.startsWith('--test-reporter')) ? [] : ['--test-reporter=spec'];
  child = spawn(
    process.execPath,
    ['--import', 'tsx', '--test', '--test-concurrency=2', ...reporter, ...options, ...files],
    {
      env,
      stdio: 'inherit',
    },
  );
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
    child!.on('exit', (c, s) => resolve([c, s])),
  );
  await cleanUp();
  process.exitCode = code ?? (signal ? 128 + (signal === 'SIGINT' ? 2 : 15) : 1);
}
