import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { formatPath, loadConfig, parseConfig } from '../../src/config/load.js';
import { ConfigError, UsageError } from '../../src/errors.js';

const TARGET = 'http://127.0.0.1:9000';
const TLS_FIXTURES = fileURLToPath(new URL('../fixtures/tls/', import.meta.url));
const GOOD_KEY = 'config-test-key-0123456789abcdefghijklmn';
const PUBLIC_KEY = '-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----';

/** A minimal valid config (loopback, no credentials) with `gateway` fields merged over it. */
function withGateway(gateway: Record<string, unknown>, rest: Record<string, unknown> = {}) {
  return { ...rest, gateway: { upstream: { target: TARGET }, ...gateway } };
}

/** Parses a config that must be rejected and returns its problem lines. */
function problemsOf(raw: unknown, options?: Parameters<typeof parseConfig>[1]): readonly string[] {
  try {
    parseConfig(raw, options);
  } catch (err) {
    assert.ok(err instanceof ConfigError, `expected ConfigError, got ${String(err)}`);
    return err.problems;
  }
  assert.fail('config was accepted');
}

/** Asserts a problem line for exactly `at` (`at: reason`) and returns it. */
function assertProblemAt(problems: readonly string[], at: string): string {
  const line = problems.find((p) => p.startsWith(`${at}: `));
  assert.ok(line, `no problem at ${at}; got:\n${problems.join('\n')}`);
  return line;
}

describe('config: a minimal config gets its defaults', () => {
  it('loopback gateway with only an upstream target', () => {
    const config = parseConfig(withGateway({}), { baseDir: '/srv/gatehouse' });
    assert.equal(config.gateway.listen.host, '127.0.0.1');
    assert.equal(config.gateway.listen.port, 8080);
    assert.equal(config.gateway.auth.enabled, true);
    assert.deepEqual(config.gateway.auth.apiKeys, []);
    assert.deepEqual(config.gateway.auth.failures, { max: 10, windowSeconds: 60, lockoutSeconds: 300 });
    assert.equal(config.webhooks.enabled, false);
    assert.deepEqual(config.storage, { driver: 'sqlite', path: path.resolve('/srv/gatehouse', 'data/gatehouse.db') });
  });

  it('the jwt algorithms default from the key source', () => {
    const hs = parseConfig(withGateway({ auth: { bearer: { jwt: { secret: 's'.repeat(32) } } } }));
    assert.deepEqual(hs.gateway.auth.bearer?.jwt.algorithms, ['HS256']);
    const rs = parseConfig(withGateway({ auth: { bearer: { jwt: { publicKey: PUBLIC_KEY } } } }));
    assert.deepEqual(rs.gateway.auth.bearer?.jwt.algorithms, ['RS256']);
  });
});

describe('config: each problem names its exact path', () => {
  it('an invalid CIDR in allowedIPs', () => {
    const problems = problemsOf(withGateway({ auth: { allowedIPs: ['10.0.0.0/8', '::1', '10.0.0.0/33'] } }));
    assert.deepEqual(problems, ['gateway.auth.allowedIPs[2]: invalid CIDR "10.0.0.0/33"']);
  });

  it('an invalid CIDR in trustProxy', () => {
    assertProblemAt(problemsOf(withGateway({ trustProxy: ['127.1'] })), 'gateway.trustProxy[0]');
  });

  it('unknown keys, at any depth', () => {
    assert.deepEqual(problemsOf(withGateway({ auth: { bogus: true } })), ['gateway.auth.bogus: unknown key']);
    assertProblemAt(problemsOf({ ...withGateway({}), extra: 1 }), 'extra');
    assertProblemAt(problemsOf(withGateway({ upstream: { target: TARGET, timeout: 5 } })), 'gateway.upstream.timeout');
    assertProblemAt(problemsOf(withGateway({}, { webhooks: { endpoint: [] } })), 'webhooks.endpoint');
  });

  it('a key of another branch says which (found by a newcomer: `path` beside driver "postgres" said only "unknown key")', () => {
    assert.deepEqual(
      problemsOf(withGateway({}, { storage: { driver: 'postgres', url: 'postgres://u@h/db', path: 'x.db' } })),
      ['storage.path: unknown key (only with driver "sqlite")'],
    );
    assert.deepEqual(problemsOf(withGateway({}, { storage: { path: 'x.db', url: 'postgres://u@h/db' } })), [
      'storage.url: unknown key (only with driver "postgres")',
    ]);
    assert.deepEqual(
      problemsOf(withGateway({}, { storage: { driver: 'postgres', url: 'postgres://u@h/db', pol: {} } })),
      ['storage.pol: unknown key (did you mean "pool"?)'],
    );
    // Found by review: names every object inherits matched every branch, the user's own included.
    assert.deepEqual(problemsOf(withGateway({}, { storage: { path: 'x.db', toString: 1 } })), [
      'storage.toString: unknown key',
    ]);
    const verify = problemsOf(
      withGateway(
        {},
        {
          webhooks: {
            enabled: true,
            targets: { message: { url: TARGET } },
            endpoints: [
              {
                path: '/webhook/a',
                action: 'message',
                verify: { type: 'secret', secret: 's'.repeat(24), toleranceSeconds: 60 },
              },
            ],
          },
        },
      ),
    );
    assert.equal(verify.length, 1, verify.join('\n'));
    assert.match(
      verify[0]!,
      /^webhooks\.endpoints\[0\]\.verify\.toleranceSeconds: unknown key \(only with type "[a-z-]+"( or type "[a-z-]+")*\)$/,
    );
  });

  it('wrong types', () => {
    assertProblemAt(problemsOf(withGateway({ listen: { port: '8080' } })), 'gateway.listen.port');
    assertProblemAt(problemsOf(withGateway({ listen: { port: 70000 } })), 'gateway.listen.port');
    assertProblemAt(problemsOf(withGateway({ auth: { enabled: 'yes' } })), 'gateway.auth.enabled');
    assertProblemAt(problemsOf(withGateway({ trustProxy: '10.0.0.0/8' })), 'gateway.trustProxy');
    assertProblemAt(problemsOf(withGateway({ auth: { failures: { max: 0 } } })), 'gateway.auth.failures.max');
    assertProblemAt(
      problemsOf(withGateway({ upstream: { target: TARGET, timeoutMs: 1.5 } })),
      'gateway.upstream.timeoutMs',
    );
    assertProblemAt(problemsOf(withGateway({}, { log: { level: 'verbose' } })), 'log.level');
  });

  it('a missing gateway or upstream target', () => {
    assertProblemAt(problemsOf({}), 'gateway');
    assertProblemAt(problemsOf({ gateway: {} }), 'gateway.upstream');
    assertProblemAt(problemsOf({ gateway: { upstream: {} } }), 'gateway.upstream.target');
  });

  it('a relative or non-http upstream URL', () => {
    for (const target of ['/internal', 'localhost:9000', 'ftp://h/x', 'file:///etc/passwd']) {
      assertProblemAt(problemsOf(withGateway({ upstream: { target } })), 'gateway.upstream.target');
    }
  });

  it('duplicate api key ids point at the second one', () => {
    const hash = `sha256:${'a'.repeat(64)}`;
    const problems = problemsOf(
      withGateway({
        auth: {
          apiKeys: [
            { id: 'ci', hash },
            { id: 'other', hash },
            { id: 'ci', hash },
          ],
        },
      }),
    );
    assertProblemAt(problems, 'gateway.auth.apiKeys[2].id');
    assert.equal(problems.length, 1);
  });

  it('an apiKeys id "default" beside the plain apiKey (its id) is refused: two keys would share one identity', () => {
    const hash = `sha256:${'a'.repeat(64)}`;
    const problems = problemsOf(
      withGateway({
        auth: {
          apiKey: GOOD_KEY,
          apiKeys: [
            { id: 'ci', hash },
            { id: 'default', hash: `sha256:${'b'.repeat(64)}` },
          ],
        },
      }),
    );
    assert.match(assertProblemAt(problems, 'gateway.auth.apiKeys[1].id'), /the plain apiKey's/);
    assert.equal(problems.length, 1);
    // Without a plain key the id is free.
    assert.equal(
      parseConfig(withGateway({ auth: { apiKeys: [{ id: 'default', hash }] } })).gateway.auth.apiKeys[0]!.id,
      'default',
    );
  });

  it('an api key entry with a bad hash or expiresAt', () => {
    assertProblemAt(
      problemsOf(withGateway({ auth: { apiKeys: [{ id: 'ci', hash: 'a'.repeat(64) }] } })),
      'gateway.auth.apiKeys[0].hash',
    );
    assertProblemAt(
      problemsOf(withGateway({ auth: { apiKeys: [{ id: 'ci', hash: `sha256:${'A'.repeat(64)}` }] } })),
      'gateway.auth.apiKeys[0].hash',
    );
    assertProblemAt(
      problemsOf(
        withGateway({ auth: { apiKeys: [{ id: 'ci', hash: `sha256:${'a'.repeat(64)}`, expiresAt: 'next year' }] } }),
      ),
      'gateway.auth.apiKeys[0].expiresAt',
    );
    assertProblemAt(
      problemsOf(withGateway({ auth: { apiKeys: [{ id: 'has space', hash: `sha256:${'a'.repeat(64)}` }] } })),
      'gateway.auth.apiKeys[0].id',
    );
  });

  it('an apiKey shorter than 32 characters', () => {
    assertProblemAt(problemsOf(withGateway({ auth: { apiKey: 'x'.repeat(31) } })), 'gateway.auth.apiKey');
    assert.equal(parseConfig(withGateway({ auth: { apiKey: 'x'.repeat(32) } })).gateway.auth.apiKey, 'x'.repeat(32));
  });

  it('an apiKey with blanks or commas (it would not survive a header list)', () => {
    assertProblemAt(problemsOf(withGateway({ auth: { apiKey: `${GOOD_KEY},x` } })), 'gateway.auth.apiKey');
    assertProblemAt(problemsOf(withGateway({ auth: { apiKey: `${GOOD_KEY} x` } })), 'gateway.auth.apiKey');
  });

  it('several problems are all listed at once', () => {
    const problems = problemsOf(
      withGateway(
        {
          upstream: { target: '/relative' },
          auth: { bogus: 1, apiKey: 'short', allowedIPs: ['nope'] },
        },
        { log: { level: 'loud' } },
      ),
    );
    for (const at of [
      'gateway.upstream.target',
      'gateway.auth.bogus',
      'gateway.auth.apiKey',
      'gateway.auth.allowedIPs[0]',
      'log.level',
    ]) {
      assertProblemAt(problems, at);
    }
  });

  it('formatPath quotes keys that are not identifiers', () => {
    assert.equal(formatPath(['webhooks', 'targets', 'system-event', 'url']), 'webhooks.targets["system-event"].url');
    assert.equal(formatPath(['gateway', 'auth', 'allowedIPs', 2]), 'gateway.auth.allowedIPs[2]');
    assert.equal(formatPath([]), '(root)');
  });
});

describe('config: ${VAR} expansion', () => {
  it('replaces ${VAR} from the given environment, inside longer strings too', () => {
    const config = parseConfig(
      withGateway({
        upstream: { target: 'http://${UP_HOST}:${UP_PORT}/base' },
        auth: { apiKey: '${GH_KEY}' },
      }),
      { env: { UP_HOST: '10.1.2.3', UP_PORT: '9001', GH_KEY: GOOD_KEY } },
    );
    assert.equal(config.gateway.upstream.target, 'http://10.1.2.3:9001/base');
    assert.equal(config.gateway.auth.apiKey, GOOD_KEY);
  });

  it('does not expand references found in a variable value (no second pass)', () => {
    const config = parseConfig(withGateway({ auth: { apiKey: '${GH_KEY}' } }), {
      env: { GH_KEY: `${GOOD_KEY}\${OTHER}`, OTHER: 'x' },
    });
    assert.equal(config.gateway.auth.apiKey, `${GOOD_KEY}\${OTHER}`);
  });

  it('a missing variable is named, with the path that uses it', () => {
    const problems = problemsOf(withGateway({ auth: { apiKey: '${GH_MISSING_KEY}' } }), { env: {} });
    assert.ok(
      problems.some((p) => p.startsWith('gateway.auth.apiKey: ') && p.includes('GH_MISSING_KEY')),
      problems.join('\n'),
    );
  });

  it("a reference to a name of Object.prototype (${constructor}) is a missing variable, not a function's text", () => {
    for (const name of ['constructor', 'toString', '__proto__', 'hasOwnProperty']) {
      const problems = problemsOf(withGateway({ auth: { apiKey: `\${${name}}` } }), { env: { OTHER: 'x' } });
      assert.ok(
        problems.some((p) => p.startsWith('gateway.auth.apiKey: ') && p.includes(`${name} is not set`)),
        problems.join('\n'),
      );
    }
  });

  it('missing variables inside arrays name the element', () => {
    const problems = problemsOf(withGateway({ auth: { allowedIPs: ['10.0.0.0/8', '${OFFICE_NET}'] } }), { env: {} });
    assert.ok(
      problems.some((p) => p.startsWith('gateway.auth.allowedIPs[1]: ') && p.includes('OFFICE_NET')),
      problems.join('\n'),
    );
  });
});

describe('config: { file } secrets', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'gatehouse-config-'));
    writeFileSync(path.join(dir, 'api.key'), `${GOOD_KEY}\n`);
    writeFileSync(path.join(dir, 'jwt.secret'), `${'j'.repeat(40)}\r\n`);
    writeFileSync(path.join(dir, 'hook.secret'), 'webhook-secret-0123456789');
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('apiKey: { file } reads the file relative to the config folder, trailing newline dropped', () => {
    const config = parseConfig(withGateway({ auth: { apiKey: { file: 'api.key' } } }), { baseDir: dir });
    assert.equal(config.gateway.auth.apiKey, GOOD_KEY);
  });

  it('secret: { file } works for jwt (absolute path, CRLF dropped) and for webhook endpoints', () => {
    const config = parseConfig(
      withGateway(
        { auth: { bearer: { jwt: { secret: { file: path.join(dir, 'jwt.secret') } } } } },
        {
          webhooks: {
            endpoints: [{ path: '/webhook/a', secret: { file: 'hook.secret' }, action: 'message' }],
            targets: { message: { url: 'http://127.0.0.1:9100/hook' } },
          },
        },
      ),
      { baseDir: dir },
    );
    assert.equal(config.gateway.auth.bearer?.jwt.secret, 'j'.repeat(40));
    assert.deepEqual(config.webhooks.endpoints[0]?.verify, { type: 'secret', secret: 'webhook-secret-0123456789' });
  });

  it('the file path may use ${VAR}', () => {
    const config = parseConfig(withGateway({ auth: { apiKey: { file: '${SECRETS}/api.key' } } }), {
      env: { SECRETS: dir },
    });
    assert.equal(config.gateway.auth.apiKey, GOOD_KEY);
  });

  it('an unreadable file is a problem at the key that references it', () => {
    const problems = problemsOf(withGateway({ auth: { apiKey: { file: 'missing.key' } } }), { baseDir: dir });
    const line = assertProblemAt(problems, 'gateway.auth.apiKey');
    assert.equal(line, `gateway.auth.apiKey: secret file ${path.join(dir, 'missing.key')} does not exist`);
  });
});

describe('config: secure by default', () => {
  for (const host of ['0.0.0.0', '::', '192.168.1.10']) {
    it(`listening on ${host} without a credential is refused at gateway.auth`, () => {
      assertProblemAt(problemsOf(withGateway({ listen: { host } })), 'gateway.auth');
    });
    it(`listening on ${host} with auth disabled is refused at gateway.auth`, () => {
      assertProblemAt(
        problemsOf(withGateway({ listen: { host }, auth: { enabled: false, apiKey: GOOD_KEY } })),
        'gateway.auth',
      );
    });
  }

  it('allowInsecure: true lets an open non-loopback gateway start', () => {
    const config = parseConfig(
      withGateway({ listen: { host: '0.0.0.0' }, auth: { enabled: false, allowInsecure: true } }),
    );
    assert.equal(config.gateway.auth.enabled, false);
    parseConfig(withGateway({ listen: { host: '0.0.0.0' }, auth: { allowInsecure: true } }));
  });

  it('a non-loopback gateway with any credential is fine', () => {
    const hash = `sha256:${'a'.repeat(64)}`;
    parseConfig(withGateway({ listen: { host: '0.0.0.0' }, auth: { apiKey: GOOD_KEY } }));
    parseConfig(withGateway({ listen: { host: '0.0.0.0' }, auth: { apiKeys: [{ id: 'ci', hash }] } }));
    parseConfig(
      withGateway({
        listen: { host: '0.0.0.0' },
        auth: { bearer: { jwt: { jwksUri: 'https://idp.example/jwks.json' } } },
      }),
    );
  });

  for (const host of ['127.0.0.1', '127.0.0.2', 'localhost', '::1']) {
    it(`loopback ${host} without credentials is allowed`, () => {
      assert.equal(parseConfig(withGateway({ listen: { host } })).gateway.listen.host, host);
      parseConfig(withGateway({ listen: { host }, auth: { enabled: false } }));
    });
  }
});

describe('config: jwt key sources and algorithms', () => {
  it('both secret and jwksUri is refused at gateway.auth.bearer.jwt', () => {
    assertProblemAt(
      problemsOf(
        withGateway({
          auth: { bearer: { jwt: { secret: 's'.repeat(32), jwksUri: 'https://idp.example/jwks.json' } } },
        }),
      ),
      'gateway.auth.bearer.jwt',
    );
  });

  it('no key source is refused at gateway.auth.bearer.jwt', () => {
    assertProblemAt(
      problemsOf(withGateway({ auth: { bearer: { jwt: { issuer: 'https://idp.example' } } } })),
      'gateway.auth.bearer.jwt',
    );
  });

  it('HS256 with a public key is refused (algorithm confusion), naming the algorithm entry', () => {
    assertProblemAt(
      problemsOf(withGateway({ auth: { bearer: { jwt: { publicKey: PUBLIC_KEY, algorithms: ['RS256', 'HS256'] } } } })),
      'gateway.auth.bearer.jwt.algorithms[1]',
    );
  });

  it('RS256 with an HMAC secret is refused', () => {
    assertProblemAt(
      problemsOf(withGateway({ auth: { bearer: { jwt: { secret: 's'.repeat(32), algorithms: ['RS256'] } } } })),
      'gateway.auth.bearer.jwt.algorithms[0]',
    );
  });

  it('a short HMAC secret, a non-PEM public key and a relative jwksUri are refused', () => {
    assertProblemAt(
      problemsOf(withGateway({ auth: { bearer: { jwt: { secret: 's'.repeat(31) } } } })),
      'gateway.auth.bearer.jwt.secret',
    );
    assertProblemAt(
      problemsOf(withGateway({ auth: { bearer: { jwt: { publicKey: 'abc' } } } })),
      'gateway.auth.bearer.jwt.publicKey',
    );
    assertProblemAt(
      problemsOf(withGateway({ auth: { bearer: { jwt: { jwksUri: '/jwks.json' } } } })),
      'gateway.auth.bearer.jwt.jwksUri',
    );
  });
});

describe('config: the result is deep-frozen', () => {
  it('no level of the config can be changed', () => {
    const config = parseConfig(
      withGateway({
        auth: {
          apiKey: GOOD_KEY,
          allowedIPs: ['10.0.0.0/8'],
          apiKeys: [{ id: 'ci', hash: `sha256:${'a'.repeat(64)}` }],
        },
      }),
    );
    for (const part of [
      config,
      config.gateway,
      config.gateway.auth,
      config.gateway.auth.allowedIPs,
      config.gateway.auth.apiKeys,
      config.gateway.auth.apiKeys[0],
      config.gateway.listen,
      config.webhooks.targets,
      config.storage,
    ]) {
      assert.ok(Object.isFrozen(part));
    }
    assert.throws(() => {
      (config.gateway.listen as { port: number }).port = 1;
    }, TypeError);
    assert.throws(() => {
      (config.gateway.auth.allowedIPs as string[]).push('0.0.0.0/0');
    }, TypeError);
    assert.equal(config.gateway.listen.port, 8080);
  });
});

describe('config: webhooks', () => {
  const target = { url: 'http://127.0.0.1:9100/hook' };
  const endpoint = { path: '/webhook/github', secret: 'webhook-secret-0123456789', action: 'message' };
  const withWebhooks = (webhooks: Record<string, unknown>) => withGateway({}, { webhooks });

  it('a valid webhooks section parses with its defaults', () => {
    const config = parseConfig(withWebhooks({ enabled: true, endpoints: [endpoint], targets: { message: target } }));
    assert.equal(config.webhooks.listen.port, 8081);
    assert.equal(config.webhooks.endpoints[0]?.path, '/webhook/github');
    assert.equal(config.webhooks.delivery.retryFor, 72 * 3_600_000);
    assert.equal(config.webhooks.delivery.maxAttempts, undefined);
  });

  it('an endpoint path not under /webhook/', () => {
    for (const bad of ['/hooks/github', '/webhook/', 'webhook/github', '/webhook/a b', '/webhook/a?x=1']) {
      assertProblemAt(
        problemsOf(withWebhooks({ endpoints: [{ ...endpoint, path: bad }], targets: { message: target } })),
        'webhooks.endpoints[0].path',
      );
    }
  });

  it('an endpoint under /webhook/channels/ (reserved for channels)', () => {
    for (const bad of ['/webhook/channels', '/webhook/channels/tg', '/webhook/channels/phone/pair/x']) {
      assertProblemAt(
        problemsOf(withWebhooks({ endpoints: [{ ...endpoint, path: bad }], targets: { message: target } })),
        'webhooks.endpoints[0].path',
      );
    }
  });

  it('a duplicate endpoint path points at the second one', () => {
    const problems = problemsOf(
      withWebhooks({
        endpoints: [endpoint, { ...endpoint, path: '/webhook/other' }, endpoint],
        targets: { message: target },
      }),
    );
    assertProblemAt(problems, 'webhooks.endpoints[2].path');
    assert.equal(problems.length, 1);
  });

  it('an endpoint secret shorter than 16 characters', () => {
    assertProblemAt(
      problemsOf(withWebhooks({ endpoints: [{ ...endpoint, secret: 'x'.repeat(15) }], targets: { message: target } })),
      'webhooks.endpoints[0].secret',
    );
  });

  it('an action without a target', () => {
    assertProblemAt(
      problemsOf(withWebhooks({ endpoints: [{ ...endpoint, action: 'agent' }], targets: { message: target } })),
      'webhooks.endpoints[0].action',
    );
  });

  it('an unknown action', () => {
    assertProblemAt(
      problemsOf(withWebhooks({ endpoints: [{ ...endpoint, action: 'email' }], targets: { message: target } })),
      'webhooks.endpoints[0].action',
    );
  });

  it('a relative target URL', () => {
    assertProblemAt(
      problemsOf(withWebhooks({ targets: { message: { url: '/hook' } } })),
      'webhooks.targets.message.url',
    );
    assertProblemAt(
      problemsOf(withWebhooks({ targets: { 'system-event': { url: 'hook' } } })),
      'webhooks.targets["system-event"].url',
    );
  });

  it('maxJsonDepth: 64 by default, a whole number from 1 to 1000', () => {
    assert.equal(parseConfig(withWebhooks({})).webhooks.maxJsonDepth, 64);
    assert.equal(parseConfig(withWebhooks({ maxJsonDepth: 8 })).webhooks.maxJsonDepth, 8);
    for (const bad of [0, 1001, 2.5, '64'])
      assertProblemAt(problemsOf(withWebhooks({ maxJsonDepth: bad })), 'webhooks.maxJsonDepth');
  });

  it('a target secret shorter than 16 characters', () => {
    assertProblemAt(
      problemsOf(withWebhooks({ targets: { message: { ...target, secret: 'short' } } })),
      'webhooks.targets.message.secret',
    );
  });
});

describe('config: loadConfig reads a JSON5 file', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'gatehouse-load-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('parses JSON5 and resolves relative paths against the config file folder', () => {
    const file = path.join(dir, 'gatehouse.json5');
    writeFileSync(path.join(dir, 'api.key'), GOOD_KEY);
    mkdirSync(path.join(dir, 'certs'), { recursive: true });
    copyFileSync(path.join(TLS_FIXTURES, 'cert.pem'), path.join(dir, 'certs', 'gw.crt'));
    const absoluteKey = path.join(dir, 'elsewhere-gw.key');
    copyFileSync(path.join(TLS_FIXTURES, 'key.pem'), absoluteKey);
    writeFileSync(
      file,
      `// comments and trailing commas are fine
{
  storage: { path: './state/gatehouse.db' },
  gateway: {
    upstream: { target: '${TARGET}', },
    tls: { cert: 'certs/gw.crt', key: '${absoluteKey}' },
    auth: { apiKey: { file: 'api.key' } },
  },
}`,
    );
    const { config, file: loadedFrom } = loadConfig(file, {});
    assert.equal(loadedFrom, file);
    assert.deepEqual(config.storage, { driver: 'sqlite', path: path.join(dir, 'state', 'gatehouse.db') });
    assert.equal(config.gateway.tls?.cert, path.join(dir, 'certs', 'gw.crt'));
    assert.equal(config.gateway.tls?.key, absoluteKey);
    assert.equal(config.gateway.auth.apiKey, GOOD_KEY);
    assert.ok(Object.isFrozen(config.storage));
  });

  it("gateway.tls: each file readable, PEM, and the key the certificate's (found by a newcomer: a missing one passed the check, then start failed with a stack)", () => {
    const otherKey = path.join(dir, 'other.key');
    writeFileSync(
      otherKey,
      generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'pem' }),
    );
    writeFileSync(path.join(dir, 'not.pem'), 'hello');
    const cert = path.join(TLS_FIXTURES, 'cert.pem');
    const tlsProblems = (tls: { cert: string; key: string }) => problemsOf(withGateway({ tls }), { baseDir: dir });
    assert.equal(
      parseConfig(withGateway({ tls: { cert, key: path.join(TLS_FIXTURES, 'key.pem') } })).gateway.tls?.cert,
      cert,
      'the fixture pair passes',
    );
    assert.deepEqual(tlsProblems({ cert: 'missing.crt', key: 'missing.key' }), [
      `gateway.tls.cert: ${path.join(dir, 'missing.crt')} does not exist`,
      `gateway.tls.key: ${path.join(dir, 'missing.key')} does not exist`,
    ]);
    const [notPem] = tlsProblems({ cert: 'not.pem', key: path.join(TLS_FIXTURES, 'key.pem') });
    assert.match(notPem!, /^gateway\.tls\.cert: \S+not\.pem is not a PEM certificate/);
    assert.deepEqual(tlsProblems({ cert, key: otherKey }), [
      `gateway.tls.key: ${otherKey} is not the private key of the certificate in ${cert}`,
    ]);
  });

  it('a TLS file gone between the check and the start: the listener says so in one line (a UsageError), not with a stack', async () => {
    const { listen } = await import('../../src/http/listener.js');
    const config = parseConfig(withGateway({}));
    const missing = path.join(dir, 'gone.crt');
    await assert.rejects(
      listen(
        'gateway.listen',
        { host: '127.0.0.1', port: 0 },
        { cert: missing, key: missing },
        config.gateway.limits,
        () => {},
      ),
      (err: unknown) =>
        err instanceof UsageError &&
        err.message.startsWith(`gateway.listen: cannot serve TLS with ${missing} and ${missing}: ENOENT`),
    );
  });

  it('a missing file is a ConfigError naming the file', () => {
    const file = path.join(dir, 'nope.json5');
    assert.throws(
      () => loadConfig(file, {}),
      (err: unknown) => {
        assert.ok(err instanceof ConfigError);
        assert.equal(err.problems.length, 1);
        assert.ok(err.problems[0]?.startsWith(`${file}: `), err.problems[0]);
        assert.ok(err.problems[0]?.includes('does not exist'), err.problems[0]);
        return true;
      },
    );
  });

  it('invalid JSON5 is a ConfigError naming the file', () => {
    const file = path.join(dir, 'broken.json5');
    writeFileSync(file, '{ gateway: { upstream: ');
    assert.throws(
      () => loadConfig(file, {}),
      (err: unknown) => {
        assert.ok(err instanceof ConfigError);
        assert.equal(err.problems.length, 1);
        assert.ok(err.problems[0]?.startsWith(`${file}: `), err.problems[0]);
        return true;
      },
    );
  });

  it('schema problems from a file are reported as paths', () => {
    const file = path.join(dir, 'bad.json5');
    writeFileSync(file, `{ gateway: { upstream: { target: '${TARGET}' }, auth: { allowedIPs: ['10.0.0.0/33'] } } }`);
    assert.throws(
      () => loadConfig(file, {}),
      (err: unknown) => {
        assert.ok(err instanceof ConfigError);
        assert.deepEqual(err.problems, ['gateway.auth.allowedIPs[0]: invalid CIDR "10.0.0.0/33"']);
        return true;
      },
    );
  });
});

describe('config: what a newcomer reads about a wrong value', () => {
  it('names the variable a value came from (its text only where a number or boolean was wanted, never a secret\'s), says "required", shows a duration\'s form', () => {
    const problems = problemsOf(
      {
        gateway: { listen: { port: '${PORT}' }, upstream: {}, auth: { apiKey: '${API_KEY}' } },
        webhooks: { enabled: true, delivery: { retryFor: 72 }, targets: { message: { url: 'http://127.0.0.1:1/' } } },
      },
      { env: { PORT: 'abc', API_KEY: 'short-secret-value' } },
    );
    assert.deepEqual(problems, [
      'gateway.listen.port: Invalid input: expected number, received string (PORT is "abc")',
      'gateway.upstream.target: required (expected string)',
      'gateway.auth.apiKey: apiKey must be at least 32 characters (from API_KEY)',
      'webhooks.delivery.retryFor: a duration as text, like "72h", "30m", "7d" or "90s"',
    ]);
    assert.ok(!problems.join('\n').includes('short-secret-value'), "a secret's value is never shown");
  });

  it('never shows a default written beside the variable, nor a miswired URL or token (found by review)', () => {
    const problems = problemsOf(
      {
        gateway: {
          listen: { port: '${DATABASE_URL}' },
          upstream: { target: TARGET },
          auth: { apiKey: '${API_KEY:-default-key-in-the-file}' },
        },
        webhooks: { enabled: '${ADMIN_TOKEN}' },
      },
      {
        env: { DATABASE_URL: 'postgres://gatehouse:S3cretPassw0rd@db/gatehouse', ADMIN_TOKEN: 'tok-0123456789abcdef' },
      },
    );
    const text = problems.join('\n');
    for (const secret of ['S3cretPassw0rd', 'default-key-in-the-file', 'tok-0123456789abcdef'])
      assert.ok(!text.includes(secret), `${secret} shown in:\n${text}`);
    assert.match(text, /^gateway\.listen\.port: .* \(from DATABASE_URL\)$/m);
    assert.match(text, /^gateway\.auth\.apiKey: .* \(from API_KEY\)$/m);
  });
});

describe('config: a missing variable is reported once', () => {
  it('no second complaint about the empty stand-in value', () => {
    try {
      parseConfig(
        { gateway: { upstream: { target: 'http://127.0.0.1:1' }, auth: { apiKey: '${GATEHOUSE_UNSET_FOR_TEST}' } } },
        { env: {} },
      );
      assert.fail('expected a ConfigError');
    } catch (err) {
      assert.ok(err instanceof ConfigError);
      assert.deepEqual(err.problems, ['gateway.auth.apiKey: environment variable GATEHOUSE_UNSET_FOR_TEST is not set']);
    }
  });

  it('a complaint about what contains it says it may only follow from that (found by a newcomer), and nothing is hidden (found by review)', () => {
    const problems = problemsOf(
      {
        gateway: {
          upstream: { target: 'http://127.0.0.1:1' },
          auth: { bearer: { jwt: { secret: '${JWT_SECRET}' } }, failures: { max: 0 } },
        },
        webhooks: {
          enabled: true,
          endpoints: [{ path: '/webhook/ci', secret: '${CI_HOOK_SECRET}', action: 'message' }],
          targets: { message: { url: 'http://127.0.0.1:1/' } },
        },
      },
      { env: {} },
    );
    const text = problems.join('\n');
    assert.match(text, /^gateway\.auth\.bearer\.jwt\.secret: environment variable JWT_SECRET is not set$/m);
    assert.match(text, /^webhooks\.endpoints\[0\]\.secret: environment variable CI_HOOK_SECRET is not set$/m);
    assert.match(
      text,
      /^gateway\.auth\.bearer\.jwt: .* \(perhaps only because of the problem at gateway\.auth\.bearer\.jwt\.secret\)$/m,
    );
    assert.match(
      text,
      /^webhooks\.endpoints\[0\]: .* \(perhaps only because of the problem at webhooks\.endpoints\[0\]\.secret\)$/m,
    );
    assert.match(text, /^gateway\.auth\.failures\.max: (?!.*perhaps)/m, 'an unrelated problem is said as it is');
  });
});
