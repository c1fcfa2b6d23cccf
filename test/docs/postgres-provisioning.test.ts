import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { request } from '../helpers/http.js';
import { findPostgresBin, startPostgres, TEST_PG_ENV, type PostgresCluster } from '../helpers/postgres.js';
import { runCli, startServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';
import { readDoc, splitFences } from './markdown.js';

const PAGE = 'docs/operations/several-instances.md';
const API_KEY = 'provisioning-key-0123456789abcdefghijklm';
const HOOK_SECRET = 'provisioning-hook-secret-0123';

/** The fenced sql blocks of the page's "Provisioning the database" section, in order. */
function provisioningBlocks(): string[] {
  const text = readDoc(PAGE);
  const lines = text.split('\n');
  const start = lines.indexOf('## Provisioning the database');
  assert.ok(start >= 0, `${PAGE} has a "Provisioning the database" section`);
  const end = lines.findIndex((l, i) => i > start && l.startsWith('## '));
  return splitFences(text)
    .blocks.filter((b) => b.lang === 'sql' && b.line > start && b.line < end)
    .map((b) => b.lines.join('\n') + '\n');
}

/**
 * The PostgreSQL provisioning commands of docs/operations/several-instances.md, run as written
 * (psql, as a superuser) on a real cluster; then `gatehouse storage migrate`, a start, a request
 * through /api/ and a webhook accepted and delivered, all as the new role, which is no superuser and
 * may create neither databases nor roles: what the page says suffices does (issue 28). The test
 * cluster trusts every local connection, so the password itself is not what is checked here.
 */
describe(`${PAGE}: the PostgreSQL provisioning commands, run as written`, () => {
  let own: PostgresCluster | undefined;
  let adminUrl: string | undefined;
  let skip: string | undefined;
  let psqlBin: string;
  let upstream: RecordingServer;
  let dir: string;
  const [ownedDatabase, ownSchema] = provisioningBlocks();

  const superuser = async <T extends pg.QueryResultRow>(sql: string, database = 'postgres') => {
    const url = new URL(adminUrl!);
    url.pathname = `/${database}`;
    const client = new pg.Client({ connectionString: url.toString() });
    await client.connect();
    try {
      return (await client.query<T>(sql)).rows;
    } finally {
      await client.end();
    }
  };

  /** psql as the superuser, the block on stdin, stopping at the first error (as a person pasting it would see). */
  const psql = (sql: string, database: string) =>
    new Promise<string>((resolve, reject) => {
      const url = new URL(adminUrl!);
      const child = execFile(
        psqlBin,
        [
          '-X',
          '-v',
          'ON_ERROR_STOP=1',
          '-h',
          url.hostname,
          '-p',
          url.port,
          '-U',
          'postgres',
          '-d',
          database,
          '-f',
          '-',
        ],
        { timeout: 60_000 },
        (err, stdout, stderr) => (err ? reject(new Error(`psql: ${err.message}\n${stderr}`)) : resolve(stdout)),
      );
      child.stdin!.end(sql);
    });

  /** The role and its database gone (also before a run, after one that was interrupted); the tests drop the others they make. */
  const dropRole = async () => {
    await superuser('DROP DATABASE IF EXISTS gatehouse WITH (FORCE)');
    await superuser('DROP ROLE IF EXISTS gatehouse');
  };

  before(async () => {
    const bin = findPostgresBin();
    if (process.env[TEST_PG_ENV.url]) adminUrl = process.env[TEST_PG_ENV.url];
    else {
      const cluster = await startPostgres({ purpose: 'the PostgreSQL provisioning test' });
      if ('skip' in cluster) skip = cluster.skip;
      else {
        own = cluster;
        adminUrl = `postgres://postgres@127.0.0.1:${cluster.port}/postgres`;
      }
    }
    if (!skip && !bin) skip = 'no psql (PostgreSQL binaries)';
    psqlBin = path.join(bin ?? '', 'psql');
    upstream = await startRecordingUpstream();
    dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-provisioning-'));
    if (!skip) await dropRole();
  });

  after(async () => {
    if (adminUrl && !skip) await dropRole();
    await own?.destroy();
    await upstream?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** The URL the page says to use, for this cluster: the role, its password from the block, the database. */
  const roleUrl = (block: string, database: string) => {
    const password = /PASSWORD '([^']+)'/.exec(block)?.[1];
    assert.ok(password, 'the block sets a password');
    const url = new URL(adminUrl!);
    url.username = 'gatehouse';
    url.password = password;
    url.pathname = `/${database}`;
    return url.toString();
  };

  /** migrate, start, /api/, a webhook accepted and delivered: all as the role, through `url`. */
  async function runAsRole(url: string, name: string): Promise<void> {
    const config = path.join(dir, `${name}.json5`);
    writeFileSync(
      config,
      `{
  storage: { driver: "postgres", url: "${url}" },
  gateway: { listen: { host: "127.0.0.1", port: 0 }, upstream: { target: "${upstream.url}" }, auth: { apiKey: "${API_KEY}" } },
  webhooks: {
    enabled: true,
    listen: { host: "127.0.0.1", port: 0 },
    endpoints: [{ path: "/webhook/${name}", secret: "${HOOK_SECRET}", action: "system-event" }],
    targets: { "system-event": { url: "${upstream.url}/events/${name}" } },
  },
}
`,
    );
    const migrated = await runCli(['storage', 'migrate', '--config', config]);
    assert.equal(migrated.code, 0, migrated.stderr);
    assert.match(migrated.stdout, /schema at version \d+/);

    const server = startServerProcess(config);
    try {
      const api = (await server.waitFor((l) => l.msg === 'gateway listening')).url;
      const hooks = (await server.waitFor((l) => l.msg === 'webhook receiver listening')).url;
      assert.equal((await request(api, '/api/provisioned', { headers: { 'x-api-key': API_KEY } })).status, 200);
      const accepted = await request(hooks, `/webhook/${name}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-webhook-secret': HOOK_SECRET },
        body: '{"provisioned":true}',
      });
      assert.equal(accepted.status, 202, accepted.body);
      await waitFor(() => upstream.received.some((r) => r.url === `/events/${name}`), {
        timeoutMs: 30_000,
        what: `the webhook on /webhook/${name} delivered`,
      });
    } finally {
      assert.equal(await server.stop(), 0);
    }
  }

  it('the page has the two blocks: a database the role owns, and a schema of its own', () => {
    assert.match(ownedDatabase ?? '', /CREATE DATABASE gatehouse OWNER gatehouse;/);
    assert.match(ownSchema ?? '', /CREATE SCHEMA gatehouse AUTHORIZATION gatehouse;/);
  });

  it('a role that can only log in cannot create the schema in another role\'s database (PostgreSQL 15+: "permission denied for schema public"): the commands are needed', async (t) => {
    if (skip) return t.skip(skip);
    const [{ version }] = (await superuser<{ version: number }>(
      "SELECT current_setting('server_version_num')::int AS version",
    )) as [{ version: number }];
    if (version < 150000) return t.skip(`PostgreSQL ${version}: public is still writable by every role before 15`);
    const database = `gh_provisioning_bare_${process.pid}`;
    await superuser(`CREATE DATABASE ${database}`);
    await superuser("CREATE ROLE gatehouse LOGIN PASSWORD 'bare'");
    try {
      const config = path.join(dir, 'bare.json5');
      writeFileSync(config, `{ storage: { driver: "postgres", url: "${roleUrl("PASSWORD 'bare'", database)}" } }`);
      const refused = await runCli(['storage', 'migrate', '--config', config]);
      assert.equal(refused.code, 1, refused.stdout);
      assert.match(refused.stderr, /permission denied for schema public/);
    } finally {
      await superuser(`DROP DATABASE ${database} WITH (FORCE)`);
      await dropRole();
    }
  });

  it('CREATE ROLE … ; CREATE DATABASE … OWNER …: migrate, start, /api/ and a delivered webhook as that role, no superuser; its tables in public, owned by it', async (t) => {
    if (skip) return t.skip(skip);
    await psql(ownedDatabase!, 'postgres');
    const [role] = await superuser<{ rolsuper: boolean; rolcreatedb: boolean; rolcreaterole: boolean }>(
      "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = 'gatehouse'",
    );
    assert.deepEqual(role, { rolsuper: false, rolcreatedb: false, rolcreaterole: false });

    await runAsRole(roleUrl(ownedDatabase!, 'gatehouse'), 'owned');
    const tables = await superuser<{ schemaname: string; tableowner: string }>(
      "SELECT DISTINCT schemaname, tableowner FROM pg_tables WHERE tablename IN ('events', 'schema_migrations')",
      'gatehouse',
    );
    assert.deepEqual(tables, [{ schemaname: 'public', tableowner: 'gatehouse' }]);
    await dropRole();
  });

  it("CREATE ROLE … ; CREATE SCHEMA … AUTHORIZATION … in another application's database: the same, its tables in its own schema", async (t) => {
    if (skip) return t.skip(skip);
    const database = `gh_provisioning_shared_${process.pid}`;
    await superuser(`CREATE DATABASE ${database}`);
    try {
      await psql(ownSchema!, database);
      await runAsRole(roleUrl(ownSchema!, database), 'schema');
      const tables = await superuser<{ schemaname: string; tableowner: string }>(
        "SELECT DISTINCT schemaname, tableowner FROM pg_tables WHERE tablename IN ('events', 'schema_migrations')",
        database,
      );
      assert.deepEqual(tables, [{ schemaname: 'gatehouse', tableowner: 'gatehouse' }]);
    } finally {
      await superuser(`DROP DATABASE ${database} WITH (FORCE)`);
      await dropRole();
    }
  });
});
