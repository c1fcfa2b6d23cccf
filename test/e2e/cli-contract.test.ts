import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { hashApiKey } from '../../src/gateway/credentials/api-key.js';
import { POSTGRES_SCHEMA_VERSION } from '../../src/storage/postgres/migrations.js';
import { SQLITE_SCHEMA_VERSION } from '../../src/storage/sqlite/events.js';
import { ROOT, runCli, startServerProcess } from '../helpers/process.js';

// The CLI as a new team meets it: one exit-code rule, quiet pipes, the pid to signal, warnings,
// machine-readable checks, the effective config without its secrets.
const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-cli-contract-'));
after(() => rmSync(dir, { recursive: true, force: true }));
function writeConfig(name: string, text: string): string {
  const file = path.join(dir, name);
  writeFileSync(file, text);
  return file;
}
const TARGET = 'http://127.0.0.1:3999';

describe('exit codes: 0 ok, 2 an unknown command or flag, 1 every other problem', () => {
  it('holds for every kind of mistake', async () => {
    const config = writeConfig('ok.json5', `{ gateway: { upstream: { target: "${TARGET}" } } }`);
    const cases: [string[], number][] = [
      [['frobnicate'], 2],
      [['config', 'frob'], 2],
      [['start', '--bogus'], 2],
      [['webhooks', 'deliveries', 'list', '--nope', '--config', config], 2],
      [['webhooks', 'deliveries', 'show', '--config', config], 1], // missing argument
      [['webhooks', 'deliveries', 'purge', '--delivered', '--config', config], 1], // missing required option
      [['config', 'check', '--config'], 1], // option without its value
      [['webhooks', 'deliveries', 'list', '--limit', 'x', '--config', config], 1], // bad flag value
      [['gateway', 'api-key', 'generate', '--expires', 'soon'], 1],
      [['config', 'check', '--config', path.join(dir, 'absent.json5')], 1],
      [[], 1], // no command at all
      [['config', 'check', '--config', config], 0],
      [['--version'], 0],
    ];
    // Three at a time: each is a tsx start, and the machine is shared.
    const results = [];
    for (let i = 0; i < cases.length; i += 3)
      results.push(...(await Promise.all(cases.slice(i, i + 3).map(([args]) => runCli(args)))));
    results.forEach((result, i) =>
      assert.equal(result.code, cases[i]![1], `gatehouse ${cases[i]![0].join(' ')}: ${result.stderr}`),
    );
  });

  it('--version prints the version, then the storage schema versions this build knows', async () => {
    const { version } = JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string };
    const result = await runCli(['--version']);
    assert.equal(result.code, 0, result.stderr);
    assert.equal(
      result.stdout,
      `${version}\nstorage schema versions: sqlite ${SQLITE_SCHEMA_VERSION}, postgres ${POSTGRES_SCHEMA_VERSION}\n`,
    );
  });
});

describe('storage that cannot be reached', () => {
  it('every command that reads the store says so in one line, without a stack (README: "Problems are printed to stderr, one line each")', async () => {
    // Found by a newcomer following the README: `deliveries list` printed pg-pool's stack.
    const closedPort = 'postgres://gatehouse@127.0.0.1:9/gatehouse';
    const config = writeConfig(
      'unreachable.json5',
      `{
      gateway: { upstream: { target: "${TARGET}" } },
      storage: { driver: "postgres", url: "${closedPort}" },
      webhooks: { enabled: true, targets: { message: { url: "${TARGET}" } } },
      channels: { tg: { kind: "qr" } },
    }`,
    );
    const commands = [
      ['webhooks', 'deliveries', 'list'],
      ['webhooks', 'deliveries', 'show', 'evt_x'],
      ['webhooks', 'deliveries', 'retry', 'evt_x'],
      ['webhooks', 'deliveries', 'retry', '--dead'],
      ['webhooks', 'deliveries', 'purge', '--delivered', '--older-than', '30d'],
      ['storage', 'status'],
      ['storage', 'migrate'],
      ['storage', 'reseal'],
      ['channels', 'list'],
    ];
    const env = { GATEHOUSE_SECRET_KEY: Buffer.alloc(32, 7).toString('base64') }; // storage reseal needs one before it looks at the store
    const results = [];
    for (let i = 0; i < commands.length; i += 3)
      results.push(
        ...(await Promise.all(commands.slice(i, i + 3).map((args) => runCli([...args, '--config', config], { env })))),
      );
    results.forEach((result, i) => {
      const label = `gatehouse ${commands[i]!.join(' ')}`;
      assert.equal(result.code, 1, `${label}: ${result.stderr}`);
      assert.match(
        result.stderr,
        /^gatehouse: postgres: cannot reach postgres:\/\/gatehouse@127\.0\.0\.1:9\/gatehouse \(storage\.url\): .*ECONNREFUSED.*\n$/,
        label,
      );
    });
  });
});

describe('a SQLite store that does not exist yet', () => {
  it('commands that read it say so and how to make it, create nothing (found by a newcomer: "the directory does not exist")', async () => {
    const db = path.join(dir, 'not-yet', 'gatehouse.db');
    const config = writeConfig(
      'not-yet.json5',
      `{ gateway: { upstream: { target: "${TARGET}" } }, storage: { path: "${db}" } }`,
    );
    const env = { GATEHOUSE_SECRET_KEY: Buffer.alloc(32, 7).toString('base64') };
    for (const args of [
      ['storage', 'status'],
      ['storage', 'reseal'],
      ['webhooks', 'deliveries', 'list'],
      ['channels', 'list'],
      ['channels', 'status'],
    ]) {
      const result = await runCli([...args, '--config', config], { env });
      assert.equal(result.code, 1, args.join(' '));
      assert.equal(
        result.stderr,
        `gatehouse: no store at ${db} (storage.path) yet: gatehouse creates it at its first start, or run \`gatehouse storage migrate\`\n`,
        args.join(' '),
      );
    }
    assert.equal(existsSync(path.dirname(db)), false, 'nothing created');
  });
});

describe('a storage.path that cannot be a SQLite store, a config that is not an object', () => {
  it('one line, no stack, exit 1, for migrate, status and start (found by an outside attack)', async () => {
    const folder = path.join(dir, 'a-folder.db');
    mkdirSync(folder, { recursive: true });
    const notSqlite = path.join(dir, 'not-sqlite.db');
    writeFileSync(notSqlite, 'just text, no database');
    const cases: [string[], string, RegExp][] = [
      [
        ['storage', 'migrate'],
        folder,
        /^gatehouse: cannot open the event store .*a-folder\.db \(storage\.path\): unable to open database file\n$/,
      ],
      [
        ['storage', 'migrate'],
        notSqlite,
        /^gatehouse: cannot open the event store .*not-sqlite\.db \(storage\.path\): file is not a database\n$/,
      ],
      [
        ['storage', 'migrate'],
        path.join(notSqlite, 'under-a-file.db'),
        /^gatehouse: cannot open the event store .*under-a-file\.db \(storage\.path\): E(EXIST|NOTDIR)[^\n]*\n$/,
      ],
    ];
    for (const [args, db, expected] of cases) {
      const config = writeConfig(
        'bad-path.json5',
        `{ gateway: { upstream: { target: "${TARGET}" } }, storage: { path: ${JSON.stringify(db)} } }`,
      );
      const result = await runCli([...args, '--config', config]);
      assert.equal(result.code, 1, `${args.join(' ')} ${db}`);
      assert.match(result.stderr, expected);
    }
    const start = await runCli([
      'start',
      '--config',
      writeConfig(
        'bad-start.json5',
        `{ gateway: { listen: { port: 0 }, upstream: { target: "${TARGET}" } }, storage: { path: ${JSON.stringify(folder)} },
      webhooks: { enabled: true, listen: { port: 0 }, targets: { message: { url: "${TARGET}" } } } }`,
      ),
    ]);
    assert.equal(start.code, 1);
    assert.match(
      start.stderr,
      /^gatehouse: cannot open the event store .*a-folder\.db \(storage\.path\): unable to open database file\n$/,
    );
    for (const text of ['[]', 'null', '42']) {
      const result = await runCli(['storage', 'status', '--config', writeConfig('not-object.json5', text)]);
      assert.equal(result.code, 1, text);
      assert.match(result.stderr, /\(root\): Invalid input: expected object, received (array|null|number)/, text);
    }
  });
});

describe('output piped into a reader that stops early', () => {
  it('`… | head -1` prints no EPIPE stack and ends cleanly', async () => {
    // 70 kB of schema: more than a pipe holds, so writes continue after head has gone.
    const child = spawn(
      'bash',
      ['-c', `set -o pipefail; "${process.execPath}" --import tsx "${ROOT}src/bin.ts" config schema | head -1`],
      { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
    assert.equal(stdout, '{\n');
    assert.equal(stderr, '', 'no stack');
    assert.equal(code, 0);
  });
});

describe('config check: warnings, --json; config print', () => {
  const soon = new Date(Date.now() + 2 * 86_400_000).toISOString();
  const past = new Date(Date.now() - 86_400_000).toISOString();
  const warned = () =>
    writeConfig(
      'warned.json5',
      `{
    gateway: { upstream: { target: "${TARGET}" }, auth: { apiKeys: [
      { id: "old", hash: "${hashApiKey('a'.repeat(40))}", expiresAt: "${past}" },
      { id: "soon", hash: "${hashApiKey('b'.repeat(40))}", expiresAt: "${soon}" },
    ] } },
    webhooks: {
      enabled: false,
      endpoints: [{ path: "/webhook/a", secret: "0123456789abcdef0123", action: "message", template: "hello {{name" }],
      targets: { message: { url: "http://127.0.0.1:5100" } },
    },
  }`,
    );

  it('likely mistakes are warnings (exit 0): expired and expiring keys, endpoints while webhooks are off, an unbalanced template', async () => {
    const file = warned();
    const [text, json] = await Promise.all([
      runCli(['config', 'check', '--config', file]),
      runCli(['config', 'check', '--json', '--config', file]),
    ]);
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stderr, /^warning: gateway\.auth\.apiKeys\[0\]\.expiresAt: key "old" expired/m);
    assert.match(text.stderr, /^warning: gateway\.auth\.apiKeys\[1\]\.expiresAt: key "soon" expires in \d+ h/m);
    assert.match(text.stderr, /^warning: webhooks\.enabled: false, so the 1 configured endpoint\(s\) receive nothing/m);
    assert.match(text.stderr, /^warning: webhooks\.endpoints\[0\]\.template: unbalanced \{\{ \}\}/m);
    assert.equal(json.code, 0, json.stderr);
    const report = JSON.parse(json.stdout);
    assert.equal(report.ok, true);
    assert.deepEqual(report.problems, []);
    assert.deepEqual(
      report.warnings.map((w: { path: string }) => w.path),
      [
        'gateway.auth.apiKeys[0].expiresAt',
        'gateway.auth.apiKeys[1].expiresAt',
        'webhooks.enabled',
        'webhooks.endpoints[0].template',
      ],
    );
  });

  it('no credential configured is a warning; gateway and webhooks on one address and port is an error', async () => {
    const none = writeConfig('no-credential.json5', `{ gateway: { upstream: { target: "${TARGET}" } } }`);
    const clash = writeConfig(
      'clash.json5',
      `{ gateway: { listen: { port: 7080 }, upstream: { target: "${TARGET}" } },
      webhooks: { enabled: true, listen: { port: 7080 } } }`,
    );
    const [warning, error] = await Promise.all([
      runCli(['config', 'check', '--config', none]),
      runCli(['config', 'check', '--json', '--config', clash]),
    ]);
    assert.equal(warning.code, 0);
    assert.match(warning.stderr, /^warning: gateway\.auth: no credential is configured/m);
    assert.equal(error.code, 1);
    const report = JSON.parse(error.stdout);
    assert.equal(report.ok, false);
    assert.deepEqual(
      report.problems.map((p: { path: string }) => p.path),
      ['webhooks.listen.port'],
    );
    assert.match(report.problems[0].message, /cannot both listen on 127\.0\.0\.1:7080/);
  });

  it('config print: the effective config with defaults, every secret redacted (keys, secrets, tokens, database passwords)', async () => {
    const file = writeConfig(
      'secrets.json5',
      `{
      storage: { driver: "postgres", url: "postgres://gatehouse:db-pass-w0rd@db.internal:5432/gatehouse" },
      gateway: { upstream: { target: "${TARGET}" }, auth: { apiKey: "plain-api-key-0123456789abcdefghijkl", bearer: { jwt: { secret: "${'j'.repeat(40)}" } } } },
      webhooks: {
        enabled: true,
        endpoints: [
          { path: "/webhook/a", secret: "endpoint-secret-0123456789", action: "message" },
          { path: "/webhook/gh", verify: { type: "github", secrets: ["github-secret-one-0123", "github-secret-two-0123"] }, action: "message" },
          { path: "/webhook/tg", verify: { type: "telegram", secretToken: "telegram-token-0123456789" }, action: "message" },
        ],
        targets: { message: { url: "http://127.0.0.1:5100", secret: "target-secret-0123456789" } },
      },
    }`,
    );
    const result = await runCli(['config', 'print', '--config', file]);
    assert.equal(result.code, 0, result.stderr);
    for (const secret of [
      'db-pass-w0rd',
      'plain-api-key',
      'j'.repeat(40),
      'endpoint-secret',
      'github-secret',
      'telegram-token',
      'target-secret',
    ]) {
      assert.ok(!result.stdout.includes(secret), `${secret} printed`);
    }
    const config = JSON.parse(result.stdout);
    assert.equal(config.storage.url, 'postgres://gatehouse:[redacted]@db.internal:5432/gatehouse');
    // URL credentials beyond user:pass@ (the attack review): query parameters, an unescaped '@'.
    const odd = writeConfig(
      'url-secrets.json5',
      `{
      storage: { driver: "postgres", url: "postgres://u:P@SS-at@db.internal/gatehouse?sslpassword=ssl-pass-w0rd&password=query-pass-w0rd&application_name=gh" },
      gateway: { upstream: { target: "${TARGET}/?token=upstream-query-t0ken" }, auth: { apiKey: "plain-api-key-0123456789abcdefghijkl" } },
    }`,
    );
    const printed = await runCli(['config', 'print', '--config', odd]);
    assert.equal(printed.code, 0, printed.stderr);
    for (const secret of ['SS-at', 'ssl-pass-w0rd', 'query-pass-w0rd', 'upstream-query-t0ken'])
      assert.ok(!printed.stdout.includes(secret), `${secret} printed`);
    assert.equal(
      JSON.parse(printed.stdout).storage.url,
      'postgres://u:[redacted]@db.internal/gatehouse?sslpassword=[redacted]&password=[redacted]&application_name=gh',
    );
    // A malformed URL in an error message is redacted too (it reaches journald from start).
    const broken = writeConfig(
      'url-broken.json5',
      `{ gateway: { upstream: { target: "http://svc:Sup3rS3cretPW@target.internal:99999/x" } } }`,
    );
    const checked = await runCli(['config', 'check', '--json', '--config', broken]);
    assert.equal(checked.code, 1);
    assert.ok(!checked.stdout.includes('Sup3rS3cretPW') && !checked.stderr.includes('Sup3rS3cretPW'), checked.stdout);
    assert.match(checked.stdout, /svc:\[redacted\]@target\.internal/);
    assert.equal(config.gateway.auth.apiKey, '[redacted]');
    assert.deepEqual(config.webhooks.endpoints[1].verify.secrets, ['[redacted]', '[redacted]']);
    // Defaults are filled in.
    assert.equal(config.gateway.listen.port, 8080);
    assert.equal(config.webhooks.delivery.retryFor, 72 * 3_600_000);
    assert.equal(config.gateway.auth.failures.max, 10);
  });
});

describe('read-only commands need only what they read', () => {
  it('storage migrate and deliveries list work without the JWT or GitHub secrets in the environment; config check still needs them', async () => {
    const file = writeConfig(
      'partial-env.json5',
      `{
      storage: { path: "${path.join(dir, 'partial.db')}" },
      gateway: { upstream: { target: "${TARGET}" }, auth: { bearer: { jwt: { secret: "\${JWT_SECRET}" } } } },
      webhooks: { enabled: true, endpoints: [{ path: "/webhook/gh", verify: { type: "github", secret: "\${GITHUB_WEBHOOK_SECRET}" }, action: "message" }],
        targets: { message: { url: "http://127.0.0.1:5100" } } },
    }`,
    );
    const env = { JWT_SECRET: undefined, GITHUB_WEBHOOK_SECRET: undefined } as unknown as NodeJS.ProcessEnv;
    const migrate = await runCli(['storage', 'migrate', '--config', file], { env });
    assert.equal(migrate.code, 0, migrate.stderr);
    const [list, check] = await Promise.all([
      runCli(['webhooks', 'deliveries', 'list', '--config', file], { env }),
      runCli(['config', 'check', '--config', file], { env }),
    ]);
    assert.equal(list.code, 0, list.stderr);
    assert.equal(list.stdout, 'no events\n');
    assert.equal(check.code, 1);
    assert.match(check.stderr, /gateway\.auth\.bearer\.jwt\.secret: environment variable JWT_SECRET is not set/);
    assert.match(
      check.stderr,
      /webhooks\.endpoints\[0\]\.verify\.secret: environment variable GITHUB_WEBHOOK_SECRET is not set/,
    );
  });
});

describe('gatehouse start', () => {
  it('the start line carries the pid in its text (pretty terminal output drops the pid field)', async () => {
    const file = writeConfig(
      'start.json5',
      `{ storage: { path: "${path.join(dir, 'start.db')}" }, gateway: { listen: { port: 0 }, upstream: { target: "${TARGET}" }, auth: { apiKey: "start-line-key-0123456789abcdefghijklm" } } }`,
    );
    const server = startServerProcess(file);
    try {
      const line = await server.waitFor((l) => typeof l.msg === 'string' && l.msg.startsWith('gatehouse started'));
      assert.equal(line.msg, `gatehouse started (pid ${server.child.pid})`);
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });
});
