import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { rmSync } from 'node:fs';
import { runCli } from '../helpers/process.js';

// What a new team meets first: a config for containers (environment), every problem at once,
// messages that say what to do. All through the CLI, as a user runs it.
const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-config-env-'));
after(() => rmSync(dir, { recursive: true, force: true }));
function writeConfig(name: string, text: string): string {
  const file = path.join(dir, name);
  writeFileSync(file, text);
  return file;
}
/** Only the variables a test gives: none of the runner's own leak into the expansion. */
const clean = (env: Record<string, string>) =>
  ({ PORT: undefined, UPSTREAM: undefined, ...env }) as unknown as NodeJS.ProcessEnv;

describe('config from the environment (containers)', () => {
  it('a whole-string ${VAR} becomes the number or boolean the schema expects; ${VAR:-default} fills in', async () => {
    const file = writeConfig(
      'env.json5',
      `{
      gateway: {
        listen: { host: "127.0.0.1", port: "\${PORT}" },
        upstream: { target: "\${UPSTREAM:-http://127.0.0.1:3999}", timeoutMs: "\${TIMEOUT:-2500}" },
        workers: "\${WORKERS}",
        auth: { enabled: "\${AUTH_ENABLED}", apiKey: "\${KEY_PREFIX:-k}-0123456789abcdefghijklmnopqrstuvwxyz" },
      },
    }`,
    );
    const ok = await runCli(['config', 'check', '--config', file], {
      env: clean({ PORT: '8123', WORKERS: '2', AUTH_ENABLED: 'true' }),
    });
    assert.equal(ok.code, 0, ok.stderr);
    assert.match(ok.stdout, /gateway 127\.0\.0\.1:8123 -> http:\/\/127\.0\.0\.1:3999, auth api-key \(1\)/);
    const printed = await runCli(['config', 'print', '--config', file], {
      env: clean({ PORT: '8123', WORKERS: '2', AUTH_ENABLED: 'false', UPSTREAM: 'http://10.1.2.3:80' }),
    });
    assert.equal(printed.code, 0, printed.stderr);
    const config = JSON.parse(printed.stdout);
    assert.equal(config.gateway.listen.port, 8123);
    assert.equal(config.gateway.workers, 2);
    assert.equal(config.gateway.auth.enabled, false);
    assert.equal(config.gateway.upstream.timeoutMs, 2500);
    assert.equal(config.gateway.upstream.target, 'http://10.1.2.3:80');
  });

  it('not coerced where the schema wants a string, and a non-number stays an error naming the path', async () => {
    const file = writeConfig(
      'env-bad.json5',
      `{ gateway: { listen: { port: "\${PORT}" }, upstream: { target: "http://127.0.0.1:3999" } } }`,
    );
    const bad = await runCli(['config', 'check', '--config', file], { env: clean({ PORT: 'eighty' }) });
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /gateway\.listen\.port: .*expected number/);
  });

  it('${VAR:?message} and an unset ${VAR} are errors naming the config path', async () => {
    const file = writeConfig(
      'env-required.json5',
      `{ gateway: { upstream: { target: "\${UPSTREAM:?set it to the internal API URL}" }, auth: { apiKey: "\${API_KEY}" } } }`,
    );
    const result = await runCli(['config', 'check', '--config', file], { env: clean({}) });
    assert.equal(result.code, 1, `${result.stdout}\n${result.stderr}`);
    assert.match(
      result.stderr,
      /gateway\.upstream\.target: environment variable UPSTREAM is not set: set it to the internal API URL/,
    );
    assert.match(result.stderr, /gateway\.auth\.apiKey: environment variable API_KEY is not set/);
  });

  it('a reference inside a default (${A:-${B}}) is refused, not read as the literal "${B" plus a stray "}"', async () => {
    const file = writeConfig(
      'env-nested.json5',
      `{ gateway: { upstream: { target: "http://127.0.0.1:3999" }, auth: { apiKey: "\${PRIMARY_KEY:-\${FALLBACK_KEY}}" } } }`,
    );
    const result = await runCli(['config', 'check', '--config', file], {
      env: clean({ FALLBACK_KEY: 'fallback-key-0123456789abcdefghijklmn' }),
    });
    assert.equal(result.code, 1, `${result.stdout}\n${result.stderr}`);
    assert.match(
      result.stderr,
      /gateway\.auth\.apiKey: a reference inside the default of \$\{PRIMARY_KEY:-…\} is not supported/,
    );
    assert.ok(!result.stderr.includes('fallback-key'), result.stderr);
  });

  it('GATEHOUSE_CONFIG names the file when --config is absent; a missing file names its absolute path and both ways', async () => {
    const file = writeConfig(
      'via-env.json5',
      `{ gateway: { listen: { port: 8124 }, upstream: { target: "http://127.0.0.1:3999" } } }`,
    );
    const [found, missing] = await Promise.all([
      runCli(['config', 'check'], { env: { GATEHOUSE_CONFIG: file } }),
      runCli(['config', 'check'], { env: { GATEHOUSE_CONFIG: path.join(dir, 'absent', 'gateway.json5') } }),
    ]);
    assert.equal(found.code, 0, found.stderr);
    assert.match(found.stdout, /127\.0\.0\.1:8124/);
    assert.equal(missing.code, 1);
    assert.ok(
      missing.stderr.includes(
        `${path.join(dir, 'absent', 'gateway.json5')}: cannot read config file: it does not exist`,
      ),
      missing.stderr,
    );
    assert.match(missing.stderr, /--config/);
    assert.match(missing.stderr, /GATEHOUSE_CONFIG/);
  });
});

describe('--help names GATEHOUSE_CONFIG', () => {
  it('the program, start and config check say where the config file comes from without --config', async () => {
    const [program, start, check] = await Promise.all([
      runCli(['--help']),
      runCli(['start', '--help']),
      runCli(['config', 'check', '--help']),
    ]);
    assert.match(program.stdout, /GATEHOUSE_CONFIG +the config file of a command run without --config/);
    for (const help of [start, check]) {
      assert.equal(help.code, 0, help.stderr);
      assert.match(
        help.stdout.replace(/\s+/g, ' '),
        /-c, --config <file> config file \(default: \$GATEHOUSE_CONFIG, else \.\/gateway\.json5\)/,
      );
      assert.match(help.stdout, /--env-file <file>/);
    }
  });
});

describe('config check summarises each part, one line each, nothing secret', () => {
  it('routes, rules, rate limits, cors and admin', async () => {
    const file = writeConfig(
      'summary.json5',
      `{
      gateway: {
        upstream: { target: "http://svc:Upstr3amPW@127.0.0.1:3999" },
        auth: {
          apiKey: "summary-key-0123456789abcdefghijklmnopq",
          rules: [{ paths: ["/api/admin/**"], scopes: ["admin"] }, { paths: ["/api/team/**"], claims: { team: "a" } }],
          defaultAllow: false,
        },
        routes: [
          { prefix: "/api/billing/", upstream: { target: "http://127.0.0.1:4001" }, stripPrefix: "/api" },
          { prefix: "/api/files/", upstream: { target: "http://127.0.0.1:4002" }, cors: false },
        ],
        rateLimits: [{ by: "ip", requests: 100, per: "1m" }, { by: "key", requests: 5, per: "1s", burst: 10, paths: ["/api/x"] }],
        cors: { origins: ["https://app.example.com", "https://*.example.org"], credentials: true },
      },
      admin: { token: "Adm1nT0ken-0123456789" },
    }`,
    );
    const result = await runCli(['config', 'check', '--config', file]);
    assert.equal(result.code, 0, result.stderr);
    assert.deepEqual(result.stdout.split('\n').slice(1), [
      '  routes: /api/billing/ -> http://127.0.0.1:4001 (strip /api), /api/files/ -> http://127.0.0.1:4002',
      '  rules: 2 (1 with scopes, 1 with claims); a request no rule matches is refused',
      '  rate limits: 100/1m by ip, 5/1s by key burst 10 (some requests)',
      '  cors: https://app.example.com, https://*.example.org, credentials on; 1 route(s) with their own',
      '  admin: 127.0.0.1:9090, /metrics behind a token',
      '',
    ]);
    assert.match(
      result.stdout,
      /^ok: .*summary\.json5: gateway 127\.0\.0\.1:8080 -> http:\/\/svc:\[redacted\]@127\.0\.0\.1:3999,/,
    );
    for (const secret of ['Upstr3amPW', 'Adm1nT0ken', 'summary-key'])
      assert.ok(!result.stdout.includes(secret), secret);

    const bare = await runCli([
      'config',
      'check',
      '--config',
      writeConfig('bare.json5', `{ gateway: { upstream: { target: "http://127.0.0.1:3999" } } }`),
    ]);
    assert.equal(bare.code, 0, bare.stderr);
    assert.deepEqual(bare.stdout.split('\n').slice(1), [
      '  routes: none',
      '  rules: none; a request no rule matches is allowed',
      '  rate limits: none',
      '  cors: off',
      '  admin: off',
      '',
    ]);
  });
});

describe('config check reports every problem at once', () => {
  it('a type error does not hide the cross-field checks', async () => {
    const file = writeConfig(
      'all-at-once.json5',
      `{
      gateway: { upstream: { target: "http://127.0.0.1:3999" } },
      webhooks: {
        enabled: true,
        maxBodyBytes: "big",
        endpoints: [{ path: "/webhook/a", secret: "0123456789abcdef0123", action: "message" }],
      },
    }`,
    );
    const result = await runCli(['config', 'check', '--config', file]);
    assert.equal(result.code, 1);
    assert.match(result.stderr, /webhooks\.maxBodyBytes: .*expected number/);
    assert.match(result.stderr, /webhooks\.endpoints\[0\]\.action: action "message" has no target/);
  });
});

describe('error messages say what to do', () => {
  it('unknown keys suggest the nearest known key, in any section', async () => {
    const file = writeConfig(
      'typos.json5',
      `{ gatway: {}, gateway: { upstream: { target: "http://127.0.0.1:3999", timout: 5 }, listen: { prot: 1 } }, storage: { pth: "x.db" } }`,
    );
    const result = await runCli(['config', 'check', '--config', file]);
    assert.equal(result.code, 1);
    assert.match(result.stderr, /^ {2}- gatway: unknown key \(did you mean "gateway"\?\)$/m);
    assert.match(result.stderr, /gateway\.upstream\.timout: unknown key \(did you mean "timeoutMs"\?\)/);
    assert.match(result.stderr, /gateway\.listen\.prot: unknown key \(did you mean "port"\?\)/);
    assert.match(result.stderr, /storage\.pth: unknown key \(did you mean "path"\?\)/);
  });

  it('secret files: the resolved path and "is a directory" / "is not readable", not EISDIR / EACCES', async (t) => {
    mkdirSync(path.join(dir, 'secret-dir'));
    writeFileSync(path.join(dir, 'locked.txt'), 'x'.repeat(40));
    chmodSync(path.join(dir, 'locked.txt'), 0o000);
    const file = writeConfig(
      'secret-files.json5',
      `{
      gateway: { upstream: { target: "http://127.0.0.1:3999" }, auth: { apiKey: { file: "secret-dir" } } },
      webhooks: { endpoints: [{ path: "/webhook/a", secret: { file: "locked.txt" }, action: "message" }], targets: { message: { url: "http://127.0.0.1:5100" } } },
    }`,
    );
    const result = await runCli(['config', 'check', '--config', file]);
    assert.equal(result.code, 1);
    assert.ok(
      result.stderr.includes(`gateway.auth.apiKey: secret file ${path.join(dir, 'secret-dir')} is a directory`),
      result.stderr,
    );
    if (process.getuid?.() === 0) t.diagnostic('running as root: every file is readable');
    else
      assert.ok(
        result.stderr.includes(
          `webhooks.endpoints[0].secret: secret file ${path.join(dir, 'locked.txt')} is not readable`,
        ),
        result.stderr,
      );
    assert.doesNotMatch(result.stderr, /EISDIR|EACCES/);
  });

  it('a URL without a scheme says the scheme is missing', async () => {
    const file = writeConfig(
      'no-scheme.json5',
      `{ gateway: { upstream: { target: "localhost:3000" } }, webhooks: { targets: { message: { url: "127.0.0.1:5100" } } } }`,
    );
    const result = await runCli(['config', 'check', '--config', file]);
    assert.equal(result.code, 1);
    assert.match(result.stderr, /gateway\.upstream\.target: .*scheme is missing.*http:\/\/localhost:3000/);
    assert.match(result.stderr, /webhooks\.targets\.message\.url: .*scheme is missing.*http:\/\/127\.0\.0\.1:5100/);
  });
});
