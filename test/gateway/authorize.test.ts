import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseConfig } from '../../src/config/load.js';
import { configWarnings } from '../../src/config/warnings.js';
import { ConfigError } from '../../src/errors.js';
import { compileAuthorizer } from '../../src/gateway/authorize.js';
import { scopesOfClaims, type Identity } from '../../src/gateway/credentials/authenticate.js';
import { compilePathPatterns, matchablePath } from '../../src/gateway/path-pattern.js';

const identity = (scopes: string[], claims?: Record<string, unknown>): Identity => ({
  methods: claims ? ['bearer'] : ['api-key'],
  subject: 's',
  keyId: claims ? undefined : 'k',
  scopes,
  claims,
  keyRateLimit: undefined,
});

function authorizerFor(rules: unknown[], defaultAllow?: boolean) {
  const config = parseConfig({
    gateway: {
      upstream: { target: 'http://127.0.0.1:1' },
      auth: { rules, ...(defaultAllow === undefined ? {} : { defaultAllow }) },
    },
  });
  return compileAuthorizer(config.gateway.auth);
}

function configProblems(gateway: Record<string, unknown>): string[] {
  try {
    parseConfig({ gateway: { upstream: { target: 'http://127.0.0.1:1' }, ...gateway } });
  } catch (err) {
    if (err instanceof ConfigError) return [...err.problems];
    throw err;
  }
  return [];
}

describe('path patterns', () => {
  it('* is one segment, ** any rest (nothing included)', () => {
    const m = compilePathPatterns(['/api/orders/**', '/api/users/*/profile']);
    for (const yes of [
      '/api/orders',
      '/api/orders/',
      '/api/orders/1',
      '/api/orders/1/lines/2',
      '/api/users/42/profile',
    ])
      assert.ok(m(yes), yes);
    for (const no of [
      '/api/ordersx',
      '/api/order',
      '/api/users/42/profile/x',
      '/api/users//profile',
      '/api/users/1/2/profile',
      '/api/x/orders',
    ])
      assert.ok(!m(no), no);
  });

  it('a pattern covers the spellings upstreams read as the same path: any ASCII case, a trailing slash, line breaks inside a segment', () => {
    // Found by an outside attack: Express routes case-insensitively and ignores a trailing slash,
    // and `/api/admin/x%0a` decoded to a path the rule's `.` did not cover.
    const m = compilePathPatterns(['/api/admin/**', '/api/reports', '/api/users/*', '/api/teams/']);
    for (const yes of [
      '/api/ADMIN/x',
      '/api/Admin',
      '/api/admin/x\n',
      '/api/admin/\r\n',
      '/api/admin/x\u2028',
      '/api/reports/',
      '/api/REPORTS',
      '/api/users/7/',
      '/api/users/7\n',
      '/api/Users/7',
      '/api/teams',
      '/api/teams/',
    ])
      assert.ok(m(yes), JSON.stringify(yes));
    for (const no of [
      '/api/reports/x',
      '/api/reports//',
      '/api/users/7/x',
      '/api/users/',
      '/api/adminx',
      '/api/\u0130dmin/x',
      '/api/teams/x',
    ])
      assert.ok(!m(no), JSON.stringify(no));
  });

  it('literal characters are literal (no regex leaks)', () => {
    const m = compilePathPatterns(['/api/v1.0/(x)+']);
    assert.ok(m('/api/v1.0/(x)+'));
    assert.ok(!m('/api/v1x0/(x)+'));
    assert.ok(!m('/api/v1.0/xx'));
  });

  it('the matched path is decoded, so encoded letters cannot dodge a rule; non-UTF-8 is refused', () => {
    assert.equal(matchablePath('/api/%6Frders/1?x=%41'), '/api/orders/1');
    assert.equal(matchablePath('/api/plain?q=1'), '/api/plain');
    const bad = matchablePath('/api/%ff');
    assert.equal(typeof bad === 'string' ? bad : bad.code, 'invalid_path');
  });

  it('config refuses bad patterns with the exact path and reason', () => {
    const problems = configProblems({
      auth: {
        rules: [
          { paths: ['/api/a/**/b'], scopes: ['x'] },
          { paths: ['/other/*'], scopes: ['x'] },
          { paths: ['/api/v*'], scopes: ['x'] },
          { paths: ['/api/x'] },
        ],
      },
    });
    assert.equal(problems.length, 4, problems.join('\n'));
    assert.match(problems[0]!, /gateway\.auth\.rules\[0\]\.paths\[0\].*"\*\*" must be the last segment/);
    assert.match(problems[1]!, /gateway\.auth\.rules\[1\]\.paths\[0\].*must start with \/api\/ or \/_gatehouse\//);
    assert.match(problems[2]!, /gateway\.auth\.rules\[2\]\.paths\[0\].*stand alone/);
    assert.match(problems[3]!, /gateway\.auth\.rules\[3\].*needs scopes or claims/);
  });

  it("rules and rate limits may name gatehouse's own API under /_gatehouse/ (the channel send API)", () => {
    assert.deepEqual(
      configProblems({
        auth: { rules: [{ paths: ['/_gatehouse/channels/tg/**'], scopes: ['channels:send'] }] },
        rateLimits: [{ by: 'ip', requests: 1, per: '1m', paths: ['/_gatehouse/channels/*/messages'] }],
      }),
      [],
    );
    const authorize = authorizerFor(
      [{ paths: ['/_gatehouse/channels/tg/**'], methods: ['POST'], scopes: ['channels:send'] }],
      false,
    );
    assert.equal(authorize('POST', '/_gatehouse/channels/tg/messages', identity(['channels:send'])), undefined);
    assert.equal(
      authorize('POST', '/_gatehouse/channels/tg/messages', identity([]))?.detail,
      'rules[0]: scope "channels:send" not granted',
    );
    assert.equal(
      authorize('POST', '/_gatehouse/channels/other/messages', identity(['channels:send']))?.code,
      'insufficient_scope',
    );
  });

  it("implied rules (a channel's send.scopes) require and grant like listed ones, and are named in the detail", () => {
    const config = parseConfig({
      gateway: {
        upstream: { target: 'http://127.0.0.1:1' },
        auth: { defaultAllow: false, rules: [{ paths: ['/api/**'], scopes: ['api'] }] },
      },
    });
    const authorize = compileAuthorizer(config.gateway.auth, [
      { name: 'channels.tg.send', rule: { paths: ['/_gatehouse/channels/tg/messages'], scopes: ['channels:send:tg'] } },
    ]);
    assert.equal(authorize('POST', '/_gatehouse/channels/tg/messages', identity(['channels:send:tg'])), undefined);
    const refused = authorize('POST', '/_gatehouse/channels/TG/messages/', identity(['api']));
    assert.equal(refused?.detail, 'channels.tg.send: scope "channels:send:tg" not granted');
    assert.equal(
      refused?.headers?.['www-authenticate'],
      'Bearer realm="gatehouse", error="insufficient_scope", scope="channels:send:tg"',
    );
    assert.equal(authorize('GET', '/api/x', identity(['api'])), undefined);
    assert.equal(
      authorize('GET', '/api/x', identity(['channels:send:tg']))?.detail,
      'rules[0]: scope "api" not granted',
    );
  });

  it('config refuses two route prefixes that differ only in case (a path is matched in any case)', () => {
    const problems = configProblems({
      routes: [
        { prefix: '/api/billing/', upstream: { target: 'http://127.0.0.1:2' } },
        { prefix: '/api/Billing/', upstream: { target: 'http://127.0.0.1:3' } },
      ],
    });
    assert.deepEqual(problems, [
      'gateway.routes[1].prefix: duplicate prefix "/api/Billing/" (also at routes[0], as "/api/billing/": prefixes are compared in any case)',
    ]);
  });

  it('config refuses routes and limits that cannot work', () => {
    const problems = configProblems({
      routes: [
        { prefix: '/api/billing', upstream: { target: 'http://127.0.0.1:2' } },
        { prefix: '/api/b/', upstream: { target: 'http://127.0.0.1:2' }, stripPrefix: '/ap' },
        { prefix: '/api/', upstream: { target: 'http://127.0.0.1:2' } },
      ],
      rateLimits: [
        { by: 'user', requests: 1, per: '1m' },
        { by: 'ip', requests: 1, per: '1 minute' },
      ],
    });
    assert.equal(problems.length, 5, problems.join('\n'));
    assert.match(problems.join('\n'), /gateway\.routes\[0\]\.prefix.*end with "\/"/);
    assert.match(problems.join('\n'), /gateway\.routes\[1\]\.stripPrefix.*leading part of prefix/);
    assert.match(problems.join('\n'), /gateway\.routes\[2\]\.prefix.*gateway\.upstream/);
    assert.match(problems.join('\n'), /gateway\.rateLimits\[0\]\.by/);
    assert.match(problems.join('\n'), /gateway\.rateLimits\[1\]\.per.*"1m"/);
  });
});

describe('config warnings', () => {
  it('a claims rule without bearer JWTs, a by-key limit without keys', () => {
    const config = parseConfig({
      gateway: {
        upstream: { target: 'http://127.0.0.1:1' },
        rateLimits: [{ by: 'key', requests: 1, per: '1s' }],
        auth: { rules: [{ paths: ['/api/**'], claims: { g: 'a' } }] },
      },
    });
    // (No credential at all is a warning of its own, tested with the others in test/e2e.)
    assert.deepEqual(
      configWarnings(config).filter((w) => !w.startsWith('gateway.auth: no credential')),
      [
        'gateway.auth.rules[0].claims: no bearer JWT is configured, so no request has claims and this rule refuses every request it matches',
        'gateway.rateLimits[0]: by "key" with no API key configured limits nothing',
      ],
    );
  });
});

describe('authorizer', () => {
  const rules = [
    { paths: ['/api/orders/**'], methods: ['GET', 'HEAD'], scopes: ['orders:read'] },
    { paths: ['/api/orders/**'], methods: ['POST', 'PUT', 'PATCH', 'DELETE'], scopes: ['orders:write'] },
    { paths: ['/api/admin/**'], claims: { groups: 'admins' } },
    { paths: ['/api/tenant/*/**'], claims: { tenant: 'acme' }, scopes: ['tenant'] },
  ];
  const authorize = authorizerFor(rules);

  it('every matching rule must be satisfied; a request no rule matches passes by default', () => {
    assert.equal(authorize('GET', '/api/orders/1', identity(['orders:read'])), undefined);
    const refused = authorize('POST', '/api/orders/1', identity(['orders:read']))!;
    assert.equal(refused.code, 'insufficient_scope');
    assert.equal(refused.status, 403);
    assert.equal(
      refused.headers!['www-authenticate'],
      'Bearer realm="gatehouse", error="insufficient_scope", scope="orders:write"',
    );
    assert.match(refused.detail!, /rules\[1\]/);
    assert.equal(authorize('DELETE', '/api/orders', identity(['orders:write'])), undefined);
    assert.equal(authorize('GET', '/api/elsewhere', identity([])), undefined);
    assert.equal(authorize('OPTIONS', '/api/orders/1', identity([])), undefined, 'no rule names OPTIONS');
    const head = authorizerFor([{ paths: ['/api/orders/**'], methods: ['GET'], scopes: ['orders:read'] }]);
    assert.equal(head('HEAD', '/api/orders/1', identity([]))?.code, 'insufficient_scope', 'a rule on GET covers HEAD');
  });

  it('claims: a string claim must equal, an array claim must contain; missing or other types refuse', () => {
    assert.equal(authorize('GET', '/api/admin/x', identity([], { groups: 'admins' })), undefined);
    assert.equal(authorize('GET', '/api/admin/x', identity([], { groups: ['dev', 'admins'] })), undefined);
    for (const groups of ['dev', ['dev'], undefined, 1, { admins: true }, ['admins-x'], 'admins dev']) {
      assert.equal(
        authorize('GET', '/api/admin/x', identity([], groups === undefined ? {} : { groups }))?.code,
        'insufficient_scope',
        JSON.stringify(groups),
      );
    }
    assert.equal(
      authorize('GET', '/api/admin/x', identity([]))?.code,
      'insufficient_scope',
      'an API key has no claims',
    );
    assert.equal(
      authorize('GET', '/api/admin/x', identity([], Object.create({ groups: 'admins' })))?.code,
      'insufficient_scope',
      'inherited properties are not claims',
    );
  });

  it('scopes and claims in one rule: both needed', () => {
    assert.equal(authorize('GET', '/api/tenant/1/x', identity(['tenant'], { tenant: 'acme' })), undefined);
    assert.equal(authorize('GET', '/api/tenant/1/x', identity([], { tenant: 'acme' }))?.code, 'insufficient_scope');
    assert.equal(
      authorize('GET', '/api/tenant/1/x', identity(['tenant'], { tenant: 'other' }))?.code,
      'insufficient_scope',
    );
  });

  it('defaultAllow: false refuses what no rule matches', () => {
    const closed = authorizerFor([{ paths: ['/api/public/**'], scopes: ['read'] }], false);
    assert.equal(closed('GET', '/api/public/x', identity(['read'])), undefined);
    const refused = closed('GET', '/api/private', identity(['read']))!;
    assert.equal(refused.code, 'insufficient_scope');
    assert.equal(refused.headers!['www-authenticate'], 'Bearer realm="gatehouse", error="insufficient_scope"');
  });

  it("a spelling in another case or with a trailing slash brings a rule's requirements, never its permission (found by review)", () => {
    const closed = authorizerFor(
      [
        { paths: ['/api/public/**'], scopes: ['public'] },
        { paths: ['/api/reports'], scopes: ['read'] },
        { paths: ['/api/admin/**'], scopes: ['admin'] },
      ],
      false,
    );
    assert.equal(closed('GET', '/api/public/x', identity(['public'])), undefined);
    const otherCase = closed('GET', '/api/PUBLIC/x', identity(['public']))!;
    assert.equal(otherCase.code, 'insufficient_scope', 'a rule satisfied does not open other spellings');
    assert.equal(
      otherCase.detail,
      'no rule matches this spelling of the path (rules[0] covers it only in another case or with a trailing slash) and gateway.auth.defaultAllow is false',
    );
    assert.equal(closed('GET', '/api/reports', identity(['read'])), undefined);
    assert.equal(closed('GET', '/api/reports/', identity(['read']))?.code, 'insufficient_scope');
    assert.match(
      closed('GET', '/api/Admin/x', identity([]))!.detail!,
      /rules\[2\]: scope "admin" not granted/,
      'the requirement applies',
    );
    const open = authorizerFor([{ paths: ['/api/admin/**'], scopes: ['admin'] }]);
    assert.equal(open('DELETE', '/api/ADMIN/users/1', identity([]))?.code, 'insufficient_scope');
    assert.equal(open('DELETE', '/api/admin/users/1', identity(['admin'])), undefined);
  });
});

describe('scopes of a JWT', () => {
  it('scope (space-separated) and scp (array or string), together; non-scope-tokens dropped', () => {
    assert.deepEqual(scopesOfClaims({ scope: 'a b  c' }), ['a', 'b', 'c']);
    assert.deepEqual(scopesOfClaims({ scp: ['a', 'd'], scope: 'a' }), ['a', 'd']);
    assert.deepEqual(scopesOfClaims({ scp: 'x y' }), ['x', 'y']);
    assert.deepEqual(scopesOfClaims({ scp: ['ok', 'has space', 'quo"te', 7, 'bad\\'] }), ['ok']);
    assert.deepEqual(scopesOfClaims({ scope: 42 as never }), []);
  });
});
