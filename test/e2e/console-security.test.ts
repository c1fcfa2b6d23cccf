import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { CONSOLE_ASSETS_DIR } from '../../src/admin/console/static.js';
import { webhookActions } from '../../src/config/schema.js';
import { errorCatalogue } from '../../src/errors.js';
import { start, type Started } from '../helpers/admin.js';
import { startTestGatehouse, testConfig, type TestGatehouse } from '../helpers/gatehouse.js';
import { request, type Reply } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

// The console's security over plain HTTP (no browser): the headers of every console response, the
// page without inline script, the session cookie's flags, CSRF and origin checks on changes made
// with the cookie, sign-out and a token rotation (SIGHUP) ending sessions on the server, sign-in
// failures refused, logged and throttled. A real `gatehouse start` with a dead event to retry: what
// the target receives says whether a refused retry was refused.

const TOKEN = 'console-sec-token-0123456789abcdef';
const NEW_TOKEN = 'console-sec-rotated-0123456789abcdef';
const HOOK_SECRET = 'console-sec-hook-secret-0123456789';
const CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
  "form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-console-sec-'));

let target: RecordingServer;
let s: Started;
let configFile: string;
let eventId: string;

function writeConfig(token: string): void {
  writeFileSync(
    configFile,
    `{
    gateway: { listen: { port: 0 }, upstream: { target: "http://127.0.0.1:1" }, auth: { apiKey: "${'k'.repeat(40)}" } },
    webhooks: { enabled: true, listen: { port: 0 },
      endpoints: [{ path: "/webhook/deploys", secret: "${HOOK_SECRET}", action: "message" }],
      targets: { message: { url: "${target.url}/hook" } },
      delivery: { maxAttempts: 1, initialBackoffMs: 20, maxBackoffMs: 50, timeoutMs: 5000 } },
    storage: { path: "${path.join(dir, 'events.db')}" },
    admin: { listen: { port: 0 }, token: "${token}" },
  }`,
  );
}

before(async () => {
  // A target that always fails: each retry is one more request it records, and the event dies again.
  target = await startRecordingUpstream((_req, res) => {
    res.writeHead(503, { 'content-type': 'application/json' });
    res.end('{"error":"down"}');
  });
  configFile = path.join(dir, 'gateway.json5');
  writeConfig(TOKEN);
  s = await start(configFile);
  const hook = await request(s.webhooks, '/webhook/deploys', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-webhook-secret': HOOK_SECRET },
    body: '{"n":1}',
  });
  assert.equal(hook.status, 202, hook.body);
  eventId = hook.json().id;
  await waitFor(
    async () => (await admin('GET', `/admin/api/events/${eventId}`, bearer(TOKEN))).json().status === 'dead',
    { what: 'the event dead after its one failed attempt', timeoutMs: 30_000 },
  );
});
after(async () => {
  await s?.server.stop('SIGKILL');
  await target?.close();
});

const bearer = (token: string) => ({ authorization: `Bearer ${token}` });
const code = (reply: Reply) => reply.json().error.code as string;

function admin(method: string, p: string, headers: Record<string, string> = {}, body?: unknown): Promise<Reply> {
  return request(s.admin, p, {
    method,
    headers: body === undefined ? headers : { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

interface Session {
  cookie: string;
  csrf: string;
  setCookie: string;
}

async function signIn(token = TOKEN, headers: Record<string, string> = {}): Promise<Session> {
  const reply = await admin('POST', '/console/session', headers, { token });
  assert.equal(reply.status, 200, reply.body);
  const setCookie = String(reply.headers['set-cookie']);
  return { cookie: setCookie.split(';')[0]!, csrf: reply.json().csrfToken, setCookie };
}

const sameOrigin = () => ({ origin: s.admin, 'sec-fetch-site': 'same-origin' });

/** A cookie-authenticated retry of the dead event, with these extra headers. */
const cookieRetry = (session: Session, headers: Record<string, string>) =>
  admin('POST', '/admin/api/events/retry', { cookie: session.cookie, ...headers }, { ids: [eventId] });

describe('console: what every response carries', () => {
  it('every /console/ response has the strict CSP, nosniff and no-referrer, errors and redirects included', async () => {
    const session = await signIn();
    const replies: [string, Reply][] = [
      ['GET /console/', await admin('GET', '/console/')],
      ['GET /console/app.js', await admin('GET', '/console/app.js')],
      ['GET /console/style.css', await admin('GET', '/console/style.css')],
      ['GET /console/favicon.svg', await admin('GET', '/console/favicon.svg')],
      ['GET /console/missing.js', await admin('GET', '/console/missing.js')],
      ['GET /console/../package.json', await admin('GET', '/console/..%2fpackage.json')],
      ['GET /console', await admin('GET', '/console')],
      ['PUT /console/', await admin('PUT', '/console/')],
      ['GET /console/session (none)', await admin('GET', '/console/session')],
      ['GET /console/session', await admin('GET', '/console/session', { cookie: session.cookie })],
      ['POST /console/session (wrong)', await admin('POST', '/console/session', {}, { token: 'x'.repeat(30) })],
      ['POST /console/session (text)', await admin('POST', '/console/session', { 'content-type': 'text/plain' })],
    ];
    const statuses = replies.map(([what, r]) => `${what} ${r.status}`);
    assert.deepEqual(statuses, [
      'GET /console/ 200',
      'GET /console/app.js 200',
      'GET /console/style.css 200',
      'GET /console/favicon.svg 200',
      'GET /console/missing.js 404',
      'GET /console/../package.json 404',
      'GET /console 308',
      'PUT /console/ 405',
      'GET /console/session (none) 401',
      'GET /console/session 200',
      'POST /console/session (wrong) 401',
      'POST /console/session (text) 415',
    ]);
    for (const [what, reply] of replies) {
      assert.equal(reply.headers['content-security-policy'], CSP, what);
      assert.equal(reply.headers['x-content-type-options'], 'nosniff', what);
      assert.equal(reply.headers['referrer-policy'], 'no-referrer', what);
      assert.equal(reply.headers['x-frame-options'], 'DENY', what);
    }
    assert.match(String(replies[0]![1].headers['content-type']), /^text\/html; charset=utf-8$/);
    assert.match(String(replies[1]![1].headers['content-type']), /^text\/javascript; charset=utf-8$/);
    assert.equal(replies[6]![1].headers.location, '/console/');
    assert.equal(replies[0]![1].headers['cache-control'], 'no-cache', 'revalidated, so an upgrade is seen at once');
    assert.ok(!replies[5]![1].body.includes('"name"'), 'no file outside console/');
  });

  it('an asset is revalidated by its ETag (304)', async () => {
    const first = await admin('GET', '/console/app.js');
    const again = await admin('GET', '/console/app.js', { 'if-none-match': String(first.headers.etag) });
    assert.equal(again.status, 304);
    assert.equal(again.body, '');
  });

  it('the page has no inline script or style, and every module it loads is served', async () => {
    const html = (await admin('GET', '/console/')).body;
    for (const tag of html.match(/<script\b[^>]*>/g) ?? []) assert.match(tag, /\bsrc="[a-z0-9-]+\.js"/, tag);
    assert.doesNotMatch(html, /<script\b[^>]*>[^<]+<\/script>/, 'no script body');
    assert.doesNotMatch(html, /<style\b|\sstyle=|\son[a-z]+=/i, 'no inline style or handler');
    // Every module reachable from app.js, by its static imports, is served as JavaScript.
    const seen = new Set<string>();
    const queue = ['app.js'];
    while (queue.length > 0) {
      const name = queue.shift()!;
      if (seen.has(name)) continue;
      seen.add(name);
      const reply = await admin('GET', `/console/${name}`);
      assert.equal(reply.status, 200, name);
      assert.match(String(reply.headers['content-type']), /^text\/javascript/, name);
      assert.doesNotMatch(reply.body, /\binnerHTML\b|\bouterHTML\b|insertAdjacentHTML|\beval\(|new Function\(/, name);
      for (const m of reply.body.matchAll(/^import [^;]*? from '\.\/([a-z0-9-]+\.js)';$/gm)) queue.push(m[1]!);
    }
    assert.ok(seen.size >= 6, [...seen].join());
  });

  it("the console's action filter offers the schema's actions", () => {
    const source = readFileSync(path.join(CONSOLE_ASSETS_DIR, 'deliveries.js'), 'utf8');
    const listed = /export const ACTIONS = (\[[^\]]*\]);/.exec(source)?.[1];
    assert.deepEqual(JSON.parse(listed!.replaceAll("'", '"')), [...webhookActions]);
  });
});

describe('console: the session', () => {
  it('sign-in sets an HttpOnly, SameSite=Strict cookie with an expiry; Secure behind a TLS proxy', async () => {
    const plain = await signIn();
    assert.match(
      plain.setCookie,
      /^gatehouse_console=[A-Za-z0-9_-]{43}; Path=\/; Max-Age=43200; HttpOnly; SameSite=Strict$/,
    );
    const proxied = await signIn(TOKEN, { 'x-forwarded-proto': 'https' });
    assert.match(proxied.setCookie, /; HttpOnly; SameSite=Strict; Secure$/);
    assert.notEqual(plain.cookie, proxied.cookie);
    assert.notEqual(plain.csrf, proxied.csrf);
    const session = await admin('GET', '/console/session', { cookie: plain.cookie });
    assert.equal(session.json().csrfToken, plain.csrf);
    assert.equal(session.headers['cache-control'], 'no-store');
  });

  it('a wrong token is 401, logged at info as a refused admin request, and never logged itself', async () => {
    const wrong = 'wrong-console-token-0123456789';
    const reply = await admin('POST', '/console/session', {}, { token: wrong });
    assert.equal(reply.status, 401);
    assert.equal(code(reply), 'invalid_admin_token');
    assert.equal(reply.headers['set-cookie'], undefined);
    const line = await s.server.waitFor(
      (l) => l.msg === 'admin request refused' && l.path === '/console/session' && l.status === 401,
    );
    assert.equal(line.level, 'info');
    assert.ok(!JSON.stringify(s.server.lines).includes(wrong), 'the guess is not in the log');
    for (const body of [{ token: 1 }, { token: TOKEN, extra: 1 }, [TOKEN]])
      assert.equal((await admin('POST', '/console/session', {}, body)).status, 400, JSON.stringify(body));
  });

  it('a sign-in from a page of another origin is refused', async () => {
    const crossSite: Record<string, string>[] = [{ origin: 'http://evil.example' }, { 'sec-fetch-site': 'cross-site' }];
    for (const headers of crossSite) {
      const reply = await admin('POST', '/console/session', headers, { token: TOKEN });
      assert.equal(reply.status, 403, JSON.stringify(headers));
      assert.equal(code(reply), 'cross_site_request');
      assert.equal(reply.headers['set-cookie'], undefined);
    }
  });

  it('the cookie reads the admin API, but not /metrics', async () => {
    const session = await signIn();
    const list = await admin('GET', '/admin/api/events?status=dead', { cookie: session.cookie });
    assert.equal(list.status, 200, list.body);
    assert.deepEqual(
      list.json().events.map((e: { id: string }) => e.id),
      [eventId],
    );
    const metrics = await admin('GET', '/metrics', { cookie: session.cookie });
    assert.equal(metrics.status, 401, 'Prometheus uses the Bearer token; the console needs no metrics');
    for (const cookie of [
      `${session.cookie}x`,
      'gatehouse_console=' + 'A'.repeat(43),
      `${session.cookie}; ${session.cookie}`,
    ]) {
      const reply = await admin('GET', '/admin/api/events', { cookie });
      assert.equal(reply.status, 401, cookie);
      assert.equal(code(reply), 'invalid_admin_token');
    }
    // An Authorization header is judged alone: a wrong one is not rescued by a good cookie.
    const both = await admin('GET', '/admin/api/events', {
      cookie: session.cookie,
      ...bearer('not-the-token-0123456789'),
    });
    assert.equal(both.status, 401);
  });
});

describe('console: changes made with the cookie', () => {
  it('a retry needs the CSRF token and this origin; refused ones send nothing, the accepted one sends once', async () => {
    const session = await signIn();
    const other = await signIn();
    const refused: [string, Record<string, string>, string][] = [
      ['no CSRF header', sameOrigin(), 'csrf_token_invalid'],
      ['a wrong CSRF token', { ...sameOrigin(), 'x-csrf-token': 'A'.repeat(43) }, 'csrf_token_invalid'],
      ["another session's CSRF token", { ...sameOrigin(), 'x-csrf-token': other.csrf }, 'csrf_token_invalid'],
      ['a malformed CSRF token', { ...sameOrigin(), 'x-csrf-token': session.csrf.slice(1) }, 'csrf_token_invalid'],
      ['a cross-site Origin', { origin: 'http://evil.example', 'x-csrf-token': session.csrf }, 'cross_site_request'],
      ['Origin "null"', { origin: 'null', 'x-csrf-token': session.csrf }, 'cross_site_request'],
      [
        'Sec-Fetch-Site: cross-site',
        { 'sec-fetch-site': 'cross-site', 'x-csrf-token': session.csrf },
        'cross_site_request',
      ],
      [
        'Sec-Fetch-Site: same-site',
        { 'sec-fetch-site': 'same-site', 'x-csrf-token': session.csrf },
        'cross_site_request',
      ],
    ];
    const seen = target.received.length;
    for (const [what, headers, expected] of refused) {
      const reply = await cookieRetry(session, headers);
      assert.equal(reply.status, 403, `${what}: ${reply.body}`);
      assert.equal(code(reply), expected, what);
      assert.equal(reply.json().error.message, errorCatalogue[expected as keyof typeof errorCatalogue].message);
    }
    assert.equal((await admin('GET', `/admin/api/events/${eventId}`, bearer(TOKEN))).json().status, 'dead');
    // The explicit signal: the first accepted retry; the target then holds exactly one more request.
    const accepted = await cookieRetry(session, { ...sameOrigin(), 'x-csrf-token': session.csrf });
    assert.equal(accepted.status, 200, accepted.body);
    assert.deepEqual(accepted.json(), { requeued: 1 });
    // Logged with who: the session (its log label), not the token it was signed in with.
    const logged = await s.server.waitFor((l) => l.msg === 'admin: events requeued' && l.requeued === 1);
    assert.match(String(logged.who), /^console session [\w-]{8}$/);
    await waitFor(() => target.received.length > seen, { what: 'the accepted retry at the target' });
    await waitFor(
      async () => (await admin('GET', `/admin/api/events/${eventId}`, bearer(TOKEN))).json().status === 'dead',
      { what: 'the event dead again (the target still fails)' },
    );
    assert.equal(target.received.length, seen + 1, 'only the accepted retry reached the target');
  });

  it('a Bearer request needs no CSRF token', async () => {
    const reply = await admin('POST', '/admin/api/events/retry', bearer(TOKEN), { ids: [eventId] });
    assert.equal(reply.status, 200, reply.body);
    assert.deepEqual(reply.json(), { requeued: 1 });
    await waitFor(
      async () => (await admin('GET', `/admin/api/events/${eventId}`, bearer(TOKEN))).json().status === 'dead',
      { what: 'the event dead again' },
    );
  });

  it('sign-out needs the CSRF token, then the cookie is refused everywhere', async () => {
    const session = await signIn();
    const refused = await admin('DELETE', '/console/session', { cookie: session.cookie, ...sameOrigin() });
    assert.equal(refused.status, 403);
    assert.equal(code(refused), 'csrf_token_invalid');
    assert.equal((await admin('GET', '/console/session', { cookie: session.cookie })).status, 200, 'still signed in');
    const out = await admin('DELETE', '/console/session', {
      cookie: session.cookie,
      ...sameOrigin(),
      'x-csrf-token': session.csrf,
    });
    assert.equal(out.status, 204);
    assert.match(
      String(out.headers['set-cookie']),
      /^gatehouse_console=; Path=\/; Max-Age=0; HttpOnly; SameSite=Strict$/,
    );
    // The browser would forget the cookie; one kept (stolen, copied) is refused by the server.
    assert.equal((await admin('GET', '/console/session', { cookie: session.cookie })).status, 401);
    assert.equal((await admin('GET', '/admin/api/events', { cookie: session.cookie })).status, 401);
    const retry = await cookieRetry(session, { ...sameOrigin(), 'x-csrf-token': session.csrf });
    assert.equal(retry.status, 401);
    await s.server.waitFor((l) => l.msg === 'console: signed out');
    // Signing out again is harmless.
    assert.equal((await admin('DELETE', '/console/session', { cookie: session.cookie, ...sameOrigin() })).status, 204);
  });

  it('a token rotation (SIGHUP) ends every session; the new token signs in, the old one does not', async () => {
    const sessions = [await signIn(), await signIn()];
    writeConfig(NEW_TOKEN);
    const reloads = s.server.lines.filter((l) => l.msg === 'configuration reloaded').length;
    s.server.child.kill('SIGHUP');
    await waitFor(() => s.server.lines.filter((l) => l.msg === 'configuration reloaded').length > reloads, {
      what: 'the reload',
    });
    const ended = s.server.lines.find((l) => l.msg === 'console: every session ended');
    assert.equal(ended?.why, 'admin.token changed');
    for (const session of sessions) {
      assert.equal((await admin('GET', '/admin/api/events', { cookie: session.cookie })).status, 401);
      assert.equal((await admin('GET', '/console/session', { cookie: session.cookie })).status, 401);
    }
    assert.equal((await admin('POST', '/console/session', {}, { token: TOKEN })).status, 401);
    const fresh = await signIn(NEW_TOKEN);
    assert.equal((await admin('GET', '/admin/api/events', { cookie: fresh.cookie })).status, 200);
  });

  it('a sign-in and a Bearer retry begun before a rotation and finished after it are refused: nothing runs with the old token', async () => {
    // The token is NEW_TOKEN since the test above. Both requests send their headers and half a body now.
    const signInBody = JSON.stringify({ token: NEW_TOKEN });
    const retryBody = JSON.stringify({ ids: [eventId] });
    const signInExchange = halfSent(
      `POST /console/session HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: ${signInBody.length}\r\nConnection: close\r\n\r\n`,
      signInBody,
    );
    const retryExchange = halfSent(
      `POST /admin/api/events/retry HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${NEW_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: ${retryBody.length}\r\nConnection: close\r\n\r\n`,
      retryBody,
    );
    await new Promise((r) => setTimeout(r, 300)); // both admitted on their headers meanwhile
    const sentBefore = target.received.length;
    writeConfig(TOKEN);
    const reloads = s.server.lines.filter((l) => l.msg === 'configuration reloaded').length;
    s.server.child.kill('SIGHUP');
    await waitFor(() => s.server.lines.filter((l) => l.msg === 'configuration reloaded').length > reloads, {
      what: 'the reload',
    });
    const [signInReply, retryReply] = await Promise.all([signInExchange.finish(), retryExchange.finish()]);
    assert.match(signInReply, /^HTTP\/1\.1 401 /, signInReply);
    assert.doesNotMatch(signInReply, /set-cookie/i);
    assert.match(retryReply, /^HTTP\/1\.1 401 /, retryReply);
    assert.match(retryReply, /"invalid_admin_token"/);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(target.received.length, sentBefore, 'the retry reached the target');
    assert.equal((await signIn(TOKEN)).csrf.length, 43, 'the current token signs in');
  });
});

/** A request whose head and first half of body are sent now; finish() sends the rest and resolves with the raw answer. */
function halfSent(head: string, body: string): { finish(): Promise<string> } {
  const socket = net.connect(Number(new URL(s.admin).port), '127.0.0.1');
  const half = Math.floor(body.length / 2);
  socket.write(head + body.slice(0, half));
  let answer = '';
  socket.setEncoding('utf8');
  socket.on('data', (d: string) => (answer += d));
  const ended = new Promise<string>((resolve) => socket.once('close', () => resolve(answer)));
  return {
    finish() {
      socket.write(body.slice(half));
      return ended;
    },
  };
}

describe('console: without admin.token, and many failed sign-ins', () => {
  let upstream: RecordingServer;
  let open: TestGatehouse;
  let guarded: TestGatehouse;
  before(async () => {
    upstream = await startRecordingUpstream();
    const storage = (name: string) => ({ path: path.join(dir, `${name}.db`) });
    open = await startTestGatehouse(
      testConfig(upstream.url, { storage: storage('open'), admin: { listen: { host: '127.0.0.1', port: 0 } } }),
    );
    guarded = await startTestGatehouse(
      testConfig(upstream.url, {
        storage: storage('guarded'),
        admin: { listen: { host: '127.0.0.1', port: 0 }, token: TOKEN },
      }),
    );
  });
  after(async () => {
    await open?.close();
    await guarded?.close();
    await upstream?.close();
  });

  it('refuses sign-in (403 admin_api_disabled) but serves the page that says so', async () => {
    const reply = await request(open.admin!.url, '/console/session', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ token: TOKEN }),
    });
    assert.equal(reply.status, 403);
    assert.equal(code(reply), 'admin_api_disabled');
    assert.equal(reply.headers['set-cookie'], undefined);
    assert.equal((await request(open.admin!.url, '/console/session')).status, 403);
    assert.equal((await request(open.admin!.url, '/console/')).status, 200);
  });

  it('ten wrong tokens from an address within a minute, sent side by side: only ten are compared, then 429 even for the right token', async () => {
    const url = guarded.admin!.url;
    const post = (token: string) =>
      request(url, '/console/session', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ token }),
      });
    const guesses = await Promise.all(
      Array.from({ length: 30 }, (_, i) => post(`wrong-token-${i}-0123456789abcdef`).then((r) => r.status)),
    );
    assert.deepEqual(
      [guesses.filter((s) => s === 401).length, guesses.filter((s) => s === 429).length],
      [10, 20],
      'ten compared and refused, the rest throttled',
    );
    const throttled = await post(TOKEN);
    assert.equal(throttled.status, 429);
    assert.equal(code(throttled), 'too_many_failures');
    assert.match(String(throttled.headers['retry-after']), /^\d+$/);
    assert.equal(throttled.headers['set-cookie'], undefined);
    // One count for every way of guessing the token: Bearer from that address waits out the minute too.
    assert.equal((await request(url, '/metrics', { headers: bearer(TOKEN) })).status, 429);
    assert.equal((await request(url, '/admin/api/events', { headers: bearer(TOKEN) })).status, 429);
  });

  it('ten wrong Bearer tokens from an address within a minute (on /metrics and the admin API): then 429 for every token and the sign-in', async () => {
    const other = await startTestGatehouse(
      testConfig(upstream.url, {
        storage: { path: path.join(dir, 'bearer-guessed.db') },
        admin: { listen: { host: '127.0.0.1', port: 0 }, token: TOKEN },
      }),
    );
    try {
      const url = other.admin!.url;
      const statuses = [];
      for (let i = 0; i < 12; i++)
        statuses.push(
          (
            await request(url, i % 2 ? '/metrics' : '/admin/api/events', {
              headers: bearer(`guess-${i}-0123456789abcdef`),
            })
          ).status,
        );
      assert.deepEqual(statuses, [...Array(10).fill(401), 429, 429]);
      assert.equal((await request(url, '/admin/api/events', { headers: bearer(TOKEN) })).status, 429);
      const signIn = await request(url, '/console/session', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ token: TOKEN }),
      });
      assert.equal(signIn.status, 429);
      assert.equal((await request(url, '/healthz')).status, 200, 'what needs no token still answers');
    } finally {
      await other.close();
    }
  });
});
