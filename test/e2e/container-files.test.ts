import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import JSON5 from 'json5';
import { hashApiKey } from '../../src/gateway/credentials/api-key.js';
import { request } from '../helpers/http.js';
import { postgresDatabases, type PostgresDatabases } from '../helpers/postgres.js';
import { ROOT, runCli, startServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

const run = promisify(execFile);

const read = (file: string) => readFileSync(path.join(ROOT, file), 'utf8');
const EXAMPLE = 'examples/container.json5';
const API_KEY = 'container-files-key-0123456789abcdefghij';
const ADMIN_TOKEN = 'container-admin-token-0123456789';
const HOOK_SECRET = 'container-hook-secret-0123456789';

/** The variables compose.yaml passes to gatehouse (its header lists them), with test values. */
function containerEnv(extra: Record<string, string> = {}): Record<string, string> {
  return {
    DATABASE_URL: 'postgres://gatehouse:secret@127.0.0.1:5432/gatehouse',
    UPSTREAM_URL: 'http://127.0.0.1:3000',
    GATEHOUSE_API_KEY_HASH: hashApiKey(API_KEY),
    DEPLOY_HOOK_SECRET: HOOK_SECRET,
    ACTION_TARGET_URL: 'http://127.0.0.1:3000/events',
    ADMIN_TOKEN,
    ...extra,
  };
}

/** The gatehouse service's block of compose.yaml (up to the next top-level or service key). */
function composeService(name: string): string {
  const text = read('compose.yaml');
  const start = text.indexOf(`\n  ${name}:\n`);
  assert.ok(start >= 0, `compose.yaml has a ${name} service`);
  const rest = text.slice(start + 1);
  const end = rest.slice(1).search(/\n(?: {2})?[a-z]/);
  return end < 0 ? rest : rest.slice(0, end + 1);
}

/**
 * The container files agree with the docs (issue 28): examples/container.json5 has an admin
 * listener reachable inside the container network (0.0.0.0, with a token from the environment, as
 * a non-loopback admin requires), compose.yaml passes the token, exposes the port to the compose
 * network only and points the health check at /readyz, and the Dockerfile exposes the port.
 */
describe('container files: examples/container.json5, compose.yaml, Dockerfile', () => {
  const example = JSON5.parse(read(EXAMPLE)) as {
    admin?: { listen?: { host?: string; port?: number }; token?: unknown };
  };
  const adminPort = example.admin?.listen?.port;

  it('examples/container.json5 has admin on 0.0.0.0 with its token from ${ADMIN_TOKEN}', () => {
    assert.equal(example.admin?.listen?.host, '0.0.0.0');
    assert.equal(typeof adminPort, 'number');
    assert.equal(example.admin?.token, '${ADMIN_TOKEN}');
  });

  it('gatehouse config check: valid with the variables compose.yaml sets, admin included; refused without ADMIN_TOKEN', async () => {
    const ok = await runCli(['config', 'check', '--config', path.join(ROOT, EXAMPLE)], { env: containerEnv() });
    assert.equal(ok.code, 0, ok.stderr);
    assert.match(ok.stdout, /^ok: /);
    const { ADMIN_TOKEN: _omitted, ...withoutToken } = containerEnv();
    assert.equal(process.env.ADMIN_TOKEN, undefined, 'the test runs without ADMIN_TOKEN of its own');
    const missing = await runCli(['config', 'check', '--config', path.join(ROOT, EXAMPLE)], { env: withoutToken });
    assert.equal(missing.code, 1, missing.stdout);
    assert.match(missing.stderr, /admin\.token: environment variable ADMIN_TOKEN is not set/);
  });

  it('compose.yaml: the token passed, every variable the example uses set, the admin port exposed to the compose network and not published, the health check on /readyz', () => {
    const service = composeService('gatehouse');
    const variables = new Set([...read(EXAMPLE).matchAll(/\$\{([A-Z_]+)\}/g)].map((m) => m[1]!));
    assert.ok(variables.has('ADMIN_TOKEN'));
    for (const name of variables)
      assert.match(service, new RegExp(`^ {6}${name}: `, 'm'), `compose.yaml sets ${name} for gatehouse`);
    assert.match(service, /^ {6}ADMIN_TOKEN: \$\{ADMIN_TOKEN:\?/m, 'ADMIN_TOKEN is required, not defaulted');
    assert.match(service, new RegExp(`^ {4}expose:\\n {6}- "${adminPort}"$`, 'm'));
    const published = /^ {4}ports:\n((?: {6}.*\n)+)/m.exec(service)?.[1] ?? '';
    assert.doesNotMatch(published, new RegExp(`:${adminPort}"`), 'the admin port is not published to the host');
    assert.match(service, new RegExp(`^ {6}HEALTHCHECK_URL: http://127\\.0\\.0\\.1:${adminPort}/readyz$`, 'm'));
  });

  it('Dockerfile: exposes the admin port, and no longer says Gmail or channels are SQLite-only', () => {
    const dockerfile = read('Dockerfile');
    const exposed = /^EXPOSE (.+)$/m.exec(dockerfile)?.[1]?.split(/\s+/) ?? [];
    assert.ok(exposed.includes(String(adminPort)), `EXPOSE ${exposed.join(' ')}`);
    assert.doesNotMatch(dockerfile, /SQLite only/i);
  });

  describe('started as the container starts it (ports made free, on the test cluster)', () => {
    let databases: PostgresDatabases | { skip: string };
    let upstream: RecordingServer;
    let dir: string;

    before(async () => {
      databases = await postgresDatabases();
      upstream = await startRecordingUpstream();
      dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-container-'));
    });

    after(async () => {
      await upstream?.close();
      if (databases && !('skip' in databases)) await databases.destroy();
      rmSync(dir, { recursive: true, force: true });
    });

    it("the image's health check command with compose's HEALTHCHECK_URL passes on a ready instance; /metrics asks for ADMIN_TOKEN", async (t) => {
      if ('skip' in databases) return t.skip(databases.skip);
      // The example as shipped, but on loopback and free ports: a test must not take 8080 on every interface.
      const config = path.join(dir, 'gateway.json5');
      writeFileSync(
        config,
        read(EXAMPLE)
          .replaceAll('host: "0.0.0.0"', 'host: "127.0.0.1"')
          .replace(/port: \d+/g, 'port: 0'),
      );
      const env = containerEnv({
        DATABASE_URL: await databases.createDatabase(),
        UPSTREAM_URL: upstream.url,
        ACTION_TARGET_URL: `${upstream.url}/events`,
      });
      const server = startServerProcess(config, { env });
      try {
        const admin = (await server.waitFor((l) => l.msg?.startsWith('admin listener'), 60_000)).url as string;
        const api = server.lines.find((l) => l.msg === 'gateway listening')!.url;
        assert.equal((await request(api, '/api/x', { headers: { 'x-api-key': API_KEY } })).status, 200);

        const healthcheck = JSON.parse(/^ {2}CMD (\[.+\])$/m.exec(read('Dockerfile'))![1]!) as string[];
        assert.equal(healthcheck[0], 'node');
        const readyz = read('compose.yaml')
          .match(/HEALTHCHECK_URL: (\S+)/)![1]!
          .replace(/^http:\/\/127\.0\.0\.1:\d+/, admin);
        const passed = await run(process.execPath, healthcheck.slice(1), {
          env: { ...process.env, HEALTHCHECK_URL: readyz },
        }).then(
          () => true,
          () => false,
        );
        assert.ok(passed, `the health check passes on ${readyz}`);
        const notThere = await run(process.execPath, healthcheck.slice(1), {
          env: { ...process.env, HEALTHCHECK_URL: `${admin}/no-such-path` },
        }).then(
          () => true,
          () => false,
        );
        assert.equal(notThere, false, 'and fails on an answer that is not 2xx');

        assert.equal((await request(admin, '/metrics')).status, 401);
        const metrics = await request(admin, '/metrics', { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
        assert.equal(metrics.status, 200);
      } finally {
        assert.equal(await server.stop(), 0);
      }
    });
  });
});
