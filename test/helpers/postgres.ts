import { execFile } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';

const run = promisify(execFile);

/**
 * A throwaway PostgreSQL cluster for one test run, one test file or one bench run: initdb into a
 * temporary folder, or a copy of `npm test`'s template (fsync off unless `durable`, trust auth, a
 * Unix socket in that folder), started on a free port of 127.0.0.1. As root (CI), the server runs as the `postgres` user (initdb refuses
 * root). The binaries are found under /usr/lib/postgresql/<version>/bin (Debian's layout;
 * .ci/run installs the package), or in GATEHOUSE_PG_BIN.
 */
export interface PostgresCluster {
  port: number;
  /** A new, empty database; its URL. */
  createDatabase(name?: string): Promise<string>;
  /** pg_ctl stop (fast: connections are cut, as in a crash of the server's clients' view) / start again on the same port and data. */
  stop(): Promise<void>;
  start(): Promise<void>;
  /**
   * SIGSTOP / SIGCONT of every process of the cluster (the postmaster first, so it spawns nothing
   * while its backends stop): a server that hangs without closing a socket, as a stalled VM does.
   */
  freeze(): Promise<void>;
  thaw(): Promise<void>;
  /** Stops the cluster and removes its folder. */
  destroy(): Promise<void>;
}

/** Why a cluster cannot be started here, or undefined when the binaries are there. */
export function findPostgresBin(): string | undefined {
  if (process.env.GATEHOUSE_PG_BIN) return process.env.GATEHOUSE_PG_BIN;
  const root = '/usr/lib/postgresql';
  if (!existsSync(root)) return undefined;
  const versions = readdirSync(root)
    .filter((v) => existsSync(path.join(root, v, 'bin', 'initdb')))
    .sort((a, b) => Number(b) - Number(a));
  return versions[0] !== undefined ? path.join(root, versions[0], 'bin') : undefined;
}

let databases = 0;

/** The environment variables `npm test` (scripts/test.ts) sets for the test files it runs. */
export const TEST_PG_ENV = {
  /** A running cluster shared by the run's files (each creates its own databases on it). */
  url: 'GATEHOUSE_TEST_PG_URL',
  /** A stopped, freshly initdb'd data folder that a file's own cluster copies instead of running initdb. */
  template: 'GATEHOUSE_TEST_PG_TEMPLATE',
} as const;

export interface StartPostgresOptions {
  /** fsync and full-page writes on, as a production server runs (the benchmark); off by default (tests: faster). */
  durable?: boolean;
  /** What cannot run without it, for the loud line. Default: "PostgreSQL tests". */
  purpose?: string;
  /** A missing PostgreSQL throws instead of returning a skip. Default: on CI (CI=true), where .ci/run installs it. */
  required?: boolean;
  /**
   * A stopped data folder to copy instead of running initdb (several seconds on a loaded machine; a copy
   * takes a fraction of that). Default: $GATEHOUSE_TEST_PG_TEMPLATE unless `durable`.
   */
  template?: string;
  /** The server's max_connections. Default 200. */
  maxConnections?: number;
}

/** How a tool of the cluster is run: as the `postgres` user when we are root (initdb and the server refuse root). */
function toolRunner(bin: string) {
  const asPostgres = process.getuid?.() === 0;
  const command = (tool: string, args: string[]) =>
    asPostgres
      ? run('runuser', ['-u', 'postgres', '--', path.join(bin, tool), ...args])
      : run(path.join(bin, tool), args);
  return { asPostgres, command };
}

/** A temporary folder the `postgres` user owns when we are root. */
async function clusterRoot(asPostgres: boolean): Promise<string> {
  const root = mkdtempSync(path.join(tmpdir(), 'gh-pg-'));
  if (asPostgres) {
    const { stdout } = await run('id', ['-u', 'postgres']);
    const { stdout: gid } = await run('id', ['-g', 'postgres']);
    chownSync(root, Number(stdout.trim()), Number(gid.trim()));
  }
  return root;
}

const INITDB_ARGS = ['-A', 'trust', '-U', 'postgres', '--no-sync', '--no-locale', '-E', 'UTF8'];

/**
 * initdb into a new temporary folder, not started: the template `npm test` copies for every cluster of
 * its run. Its data folder, or the reason it cannot be made (printed loudly, as startPostgres does).
 */
export async function initTemplate(
  options: Pick<StartPostgresOptions, 'purpose' | 'required'> = {},
): Promise<{ data: string; remove(): void } | { skip: string }> {
  const unavailable = (reason: string) =>
    cannotStart(reason, options.purpose ?? 'PostgreSQL tests', options.required ?? Boolean(process.env.CI));
  const bin = findPostgresBin();
  if (!bin)
    return unavailable(
      'no PostgreSQL binaries under /usr/lib/postgresql/*/bin (apt-get install postgresql, or set GATEHOUSE_PG_BIN)',
    );
  const { asPostgres, command } = toolRunner(bin);
  const root = await clusterRoot(asPostgres);
  const data = path.join(root, 'data');
  try {
    await command('initdb', ['-D', data, ...INITDB_ARGS]);
  } catch (err) {
    rmSync(root, { recursive: true, force: true });
    return unavailable(`initdb failed: ${(err as Error).message}`);
  }
  return { data, remove: () => rmSync(root, { recursive: true, force: true }) };
}

/**
 * Starts a cluster, or returns the reason it cannot (printed loudly, for the caller to skip).
 * Shared by the tests and `npm run bench` (bench/run.ts).
 */
export async function startPostgres(options: StartPostgresOptions = {}): Promise<PostgresCluster | { skip: string }> {
  const unavailable = (reason: string) =>
    cannotStart(reason, options.purpose ?? 'PostgreSQL tests', options.required ?? Boolean(process.env.CI));
  const bin = findPostgresBin();
  if (!bin)
    return unavailable(
      'no PostgreSQL binaries under /usr/lib/postgresql/*/bin (apt-get install postgresql, or set GATEHOUSE_PG_BIN)',
    );
  const { asPostgres, command } = toolRunner(bin);
  const template = options.template ?? (options.durable ? undefined : process.env[TEST_PG_ENV.template]);
  const root = await clusterRoot(asPostgres);
  const data = path.join(root, 'data');
  try {
    // cp -a keeps the owner (postgres) and the 0700 mode the server insists on.
    if (template) await run('cp', ['-a', template, data]);
    else await command('initdb', ['-D', data, ...INITDB_ARGS]);
  } catch (err) {
    rmSync(root, { recursive: true, force: true });
    return unavailable(`${template ? `copying the template ${template}` : 'initdb'} failed: ${(err as Error).message}`);
  }
  const port = await freePort();
  const start = async () => {
    await command('pg_ctl', [
      '-D',
      data,
      '-l',
      path.join(root, 'log'),
      '-w',
      '-t',
      '30',
      'start',
      '-o',
      `-k ${root} -p ${port} -c listen_addresses=127.0.0.1 ${options.durable ? '' : '-c fsync=off -c full_page_writes=off '}-c max_connections=${options.maxConnections ?? 200}`,
    ]);
  };
  const stop = async () => {
    await command('pg_ctl', ['-D', data, '-w', '-t', '30', '-m', 'fast', 'stop']);
  };
  try {
    await start();
  } catch (err) {
    const log = existsSync(path.join(root, 'log')) ? readFileSync(path.join(root, 'log'), 'utf8').slice(-2000) : '';
    rmSync(root, { recursive: true, force: true });
    return unavailable(`pg_ctl start failed: ${(err as Error).message}\n${log}`);
  }
  const postmasterPid = () => Number(readFileSync(path.join(data, 'postmaster.pid'), 'utf8').split('\n')[0]);
  return {
    port,
    createDatabase: (name) => createDatabase(`postgres://postgres@127.0.0.1:${port}/postgres`, name),
    stop,
    start,
    async freeze() {
      const postmaster = postmasterPid();
      process.kill(postmaster, 'SIGSTOP');
      for (const pid of childrenOf(postmaster)) signalIfAlive(pid, 'SIGSTOP');
    },
    async thaw() {
      const postmaster = postmasterPid();
      for (const pid of childrenOf(postmaster)) signalIfAlive(pid, 'SIGCONT');
      process.kill(postmaster, 'SIGCONT');
    },
    async destroy() {
      // A frozen server would not stop.
      try {
        const postmaster = postmasterPid();
        for (const pid of childrenOf(postmaster)) signalIfAlive(pid, 'SIGCONT');
        signalIfAlive(postmaster, 'SIGCONT');
      } catch {
        // no postmaster.pid: not running
      }
      await command('pg_ctl', ['-D', data, '-w', '-t', '30', '-m', 'immediate', 'stop']).catch(() => {});
      rmSync(root, { recursive: true, force: true });
    },
  };
}

/** Creates a database on the cluster whose maintenance database is `adminUrl`; its URL. */
async function createDatabase(adminUrl: string, name = `gh_test_${process.pid}_${++databases}`): Promise<string> {
  if (!/^[a-z_][a-z0-9_]*$/.test(name)) throw new Error(`bad database name ${name}`);
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name}`); // an identifier: cannot be a bound parameter; checked above
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return url.toString();
}

/** What a test file needs of PostgreSQL when it never stops the server: fresh databases. */
export interface PostgresDatabases {
  /** A new, empty database (named uniquely across the run's processes unless `name` is given); its URL. */
  createDatabase(name?: string): Promise<string>;
  /** Releases what this file started (its own cluster); the run's shared cluster is left to the runner. */
  destroy(): Promise<void>;
}

/**
 * Databases for a test file that does not stop, restart or freeze PostgreSQL: on the run's shared
 * cluster when `npm test` started one ($GATEHOUSE_TEST_PG_URL), else on a cluster of the file's own
 * (one file run by hand). A file that stops the server must use startPostgres: it would stop every file's.
 */
export async function postgresDatabases(
  options: Pick<StartPostgresOptions, 'purpose' | 'required'> = {},
): Promise<PostgresDatabases | { skip: string }> {
  const shared = process.env[TEST_PG_ENV.url];
  if (!shared) return startPostgres(options);
  return {
    createDatabase: (name) => createDatabase(shared, name),
    async destroy() {},
  };
}

/** The pids whose parent is `parent` (from /proc: Linux only, as the cluster's binaries are found). */
function childrenOf(parent: number): number[] {
  const children: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      // The fields after the command's closing parenthesis: state, then the parent pid.
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === parent) children.push(Number(entry));
    } catch {
      // gone since the listing
    }
  }
  return children;
}

function signalIfAlive(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // a backend that ended since the listing
  }
}

function cannotStart(reason: string, purpose: string, required: boolean): { skip: string } {
  const message = `${purpose} cannot run: ${reason}`;
  if (required) throw new Error(`${message} (on CI this is a failure: .ci/run installs PostgreSQL)`);
  process.stderr.write(`\n!!! ${message}: SKIPPED !!!\n\n`);
  return { skip: message };
}

/** A free TCP port on 127.0.0.1 (free when asked: another process may take it before it is bound). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}
