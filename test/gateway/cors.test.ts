import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseConfig } from '../../src/config/load.js';
import { configWarnings } from '../../src/config/warnings.js';
import { ConfigError } from '../../src/errors.js';
import {
  allowedRequestHeaders,
  compileCorsPolicy,
  compileOriginMatcher,
  parseOriginPattern,
  replaceUpstreamCors,
} from '../../src/gateway/cors.js';

// The pure parts of src/gateway/cors.ts: origin patterns and matching (the part an attacker
// probes), the preflight's Allow-Headers, the upstream header replacement, and the config rules.
// What a running gatehouse answers is in test/e2e/cors.test.ts.

const gatewayWith = (cors: unknown, routes: unknown[] = []) => ({
  storage: { path: './data/unused.db' },
  gateway: { upstream: { target: 'http://127.0.0.1:3000' }, auth: { apiKey: 'k'.repeat(32) }, cors, routes },
});

function configProblems(raw: unknown): string[] {
  try {
    parseConfig(raw);
    return [];
  } catch (err) {
    if (err instanceof ConfigError) return [...err.problems];
    throw err;
  }
}

describe('cors: origin patterns are parsed and normalized as browsers serialize origins', () => {
  it('normalizes case and the default port, so the configured origin equals what a browser sends', () => {
    assert.deepEqual(parseOriginPattern('https://App.Example.com:443'), {
      kind: 'exact',
      origin: 'https://app.example.com',
    });
    assert.deepEqual(parseOriginPattern('HTTP://localhost:5173'), { kind: 'exact', origin: 'http://localhost:5173' });
    assert.deepEqual(parseOriginPattern('http://[::1]:8080'), { kind: 'exact', origin: 'http://[::1]:8080' });
    // IDN: browsers send the punycode form.
    assert.deepEqual(parseOriginPattern('https://bücher.example'), {
      kind: 'exact',
      origin: 'https://xn--bcher-kva.example',
    });
  });

  it('keeps a subdomain pattern as a key with the port', () => {
    assert.deepEqual(parseOriginPattern('https://*.example.com'), { kind: 'subdomain', key: 'https://*.example.com' });
    assert.deepEqual(parseOriginPattern('https://*.Example.com:8443'), {
      kind: 'subdomain',
      key: 'https://*.example.com:8443',
    });
  });

  it('refuses what is not an origin, the null origin, other schemes and wildcards anywhere but the first label', () => {
    for (const text of [
      'https://app.example.com/',
      'https://app.example.com/path',
      'https://app.example.com?x',
      'https://user@app.example.com',
      'app.example.com',
      'null',
      'NULL',
      'ftp://example.com',
      'chrome-extension://abcdef',
      'https://*example.com',
      'https://app.*.com',
      'https://*.*.example.com',
      'https://*',
      'https://*.com',
      'https://*.localhost',
      'https://*.10.0.0.1',
      'http://*.[::1]',
      'https://app.example.com:99999',
      '',
    ]) {
      assert.equal(typeof parseOriginPattern(text), 'string', text);
    }
  });
});

describe('cors: origin matching is exact, never by suffix', () => {
  const matches = compileOriginMatcher([
    'https://app.example.com',
    'https://*.example.com',
    'http://localhost:5173',
    'https://*.corp.example.org:8443',
  ]);

  it('allows the listed origins and direct subdomains of a wildcard', () => {
    for (const origin of [
      'https://app.example.com',
      'https://x.example.com',
      'https://a-1.example.com',
      'https://xn--bcher-kva.example.com',
      'http://localhost:5173',
      'https://eu.corp.example.org:8443',
    ]) {
      assert.equal(matches(origin), true, origin);
    }
  });

  it('refuses look-alikes: other suffixes, schemes, ports, depths, cases, and the apex', () => {
    for (const origin of [
      'https://evil-example.com',
      'https://x.example.com.evil.com',
      'https://example.com',
      'https://a.b.example.com',
      'http://x.example.com',
      'https://x.example.com:444',
      'https://x.example.com:443',
      'https://X.example.com',
      'https://app.example.com/',
      'https://app.example.com.',
      'https://.example.com',
      'https://-x.example.com',
      'https://x_y.example.com',
      'https://a@x.example.com',
      'http://localhost:5174',
      'http://localhost',
      'https://eu.corp.example.org',
      'null',
      '',
      'https://app.example.com, https://evil.com',
      'https://x.example.com%2f.evil.com',
      'https://evil.com/.example.com',
    ]) {
      assert.equal(matches(origin), false, origin);
    }
  });

  it('"*" allows every origin, null included', () => {
    const any = compileOriginMatcher(['https://app.example.com', '*']);
    assert.equal(any('null'), true);
    assert.equal(any('https://anything.test'), true);
  });

  it('an exact-only list is one Set lookup (no subdomain parsing)', () => {
    const exact = compileOriginMatcher(['https://app.example.com']);
    assert.equal(exact('https://app.example.com'), true);
    assert.equal(exact('https://x.app.example.com'), false);
  });
});

describe('cors: Access-Control-Allow-Headers for a preflight', () => {
  const base = {
    origins: ['https://app.example.com'],
    methods: ['GET'],
    exposeHeaders: [],
    credentials: false,
    maxAge: 600_000,
  };

  it("without allowHeaders: gatehouse's credential headers, then every requested token, lower case, once", () => {
    const policy = compileCorsPolicy({ ...base });
    assert.equal(allowedRequestHeaders(policy, undefined), 'Authorization, X-API-Key');
    assert.equal(
      allowedRequestHeaders(policy, 'authorization,content-type,x-api-key'),
      'Authorization, X-API-Key, content-type',
    );
    assert.equal(
      allowedRequestHeaders(policy, ' X-Trace , x-trace,,bad header, a"b ,content-type'),
      'Authorization, X-API-Key, x-trace, content-type',
    );
  });

  it('with allowHeaders: only the requested ones listed, compared in any case', () => {
    const policy = compileCorsPolicy({ ...base, allowHeaders: ['Content-Type'] });
    assert.equal(allowedRequestHeaders(policy, 'content-type,x-other'), 'Authorization, X-API-Key, content-type');
    assert.equal(allowedRequestHeaders(policy, 'x-other'), 'Authorization, X-API-Key');
  });

  it("exposes gatehouse's headers first, then the configured ones, without repeats", () => {
    const policy = compileCorsPolicy({ ...base, exposeHeaders: ['ETag', 'retry-after'] });
    assert.equal(policy.exposeHeaders, 'RateLimit, RateLimit-Policy, Retry-After, X-Request-Id, ETag');
    assert.equal(policy.maxAge, '600');
  });
});

describe("cors: the upstream's Access-Control-* headers are replaced", () => {
  it('drops every access-control-* header and keeps Origin in Vary', () => {
    const headers: Record<string, string | string[]> = {
      'access-control-allow-origin': '*',
      'access-control-allow-credentials': 'true',
      'access-control-expose-headers': 'X-Secret',
      'content-type': 'application/json',
      vary: 'Accept-Encoding',
    };
    replaceUpstreamCors(headers);
    assert.deepEqual(headers, { 'content-type': 'application/json', vary: 'Accept-Encoding, Origin' });
  });

  it('leaves a Vary that already names Origin, or is *, as it is', () => {
    for (const vary of ['Origin', 'accept, origin', '*']) {
      const headers: Record<string, string> = { vary };
      replaceUpstreamCors(headers);
      assert.equal(headers.vary, vary);
    }
    const none: Record<string, string> = {};
    replaceUpstreamCors(none);
    assert.deepEqual(none, {});
  });
});

describe('cors: config', () => {
  it('is off unless configured, with defaults when it is', () => {
    assert.equal(parseConfig(gatewayWith(undefined)).gateway.cors, undefined);
    const cors = parseConfig(gatewayWith({ origins: ['https://app.example.com'] })).gateway.cors!;
    assert.deepEqual(cors, {
      origins: ['https://app.example.com'],
      methods: ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'],
      exposeHeaders: [],
      credentials: false,
      maxAge: 600_000,
    });
  });

  it('refuses "*" with credentials, and says where', () => {
    const problems = configProblems(gatewayWith({ origins: ['https://app.example.com', '*'], credentials: true }));
    assert.equal(problems.length, 1, problems.join('\n'));
    assert.match(problems[0]!, /gateway\.cors\.origins\[1\].*"\*" cannot be combined with credentials/);
    assert.match(
      configProblems(gatewayWith({ origins: ['https://a.example.com'], credentials: true, exposeHeaders: ['*'] }))[0]!,
      /exposeHeaders\[0\]/,
    );
    assert.deepEqual(configProblems(gatewayWith({ origins: ['*'], exposeHeaders: ['*'] })), []);
  });

  it('refuses bad origins, "*" in allowHeaders, a maxAge past 24 h or in milliseconds, on a route too', () => {
    assert.match(
      configProblems(gatewayWith({ origins: ['https://app.example.com/'] }))[0]!,
      /gateway\.cors\.origins\[0\].*no path/,
    );
    assert.match(configProblems(gatewayWith({ origins: ['null'] }))[0]!, /sandboxed/);
    assert.match(configProblems(gatewayWith({ origins: [] }))[0]!, /gateway\.cors\.origins/);
    assert.match(configProblems(gatewayWith({ origins: ['*'], allowHeaders: ['*'] }))[0]!, /allowHeaders\[0\]/);
    assert.match(configProblems(gatewayWith({ origins: ['*'], maxAge: '25h' }))[0]!, /maxAge/);
    assert.match(configProblems(gatewayWith({ origins: ['*'], maxAge: '1500ms' }))[0]!, /maxAge/);
    const route = { prefix: '/api/billing/', upstream: { target: 'http://127.0.0.1:3001' } };
    assert.match(
      configProblems(gatewayWith(undefined, [{ ...route, cors: { origins: ['https://*.com'] } }]))[0]!,
      /gateway\.routes\[0\]\.cors\.origins\[0\]/,
    );
    assert.equal(parseConfig(gatewayWith(undefined, [{ ...route, cors: false }])).gateway.routes[0]!.cors, false);
  });

  it('warns on plain-http origins other than loopback', () => {
    const config = parseConfig(
      gatewayWith(
        {
          origins: [
            'http://app.example.com',
            'http://localhost:5173',
            'http://127.0.0.1:8080',
            'http://[::1]:3000',
            'http://app.localhost:3000',
            'https://secure.example.com',
          ],
        },
        [
          {
            prefix: '/api/b/',
            upstream: { target: 'http://127.0.0.1:3001' },
            cors: { origins: ['http://*.example.org:8080'] },
          },
        ],
      ),
    );
    const warnings = configWarnings(config).filter((w) => w.includes('cors'));
    assert.equal(warnings.length, 2, warnings.join('\n'));
    assert.match(warnings[0]!, /^gateway\.cors\.origins\[0\]: "http:\/\/app\.example\.com" is plain http/);
    assert.match(warnings[1]!, /^gateway\.routes\[0\]\.cors\.origins\[0\]/);
  });
});
