import assert from 'node:assert/strict';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Page } from 'playwright-core';
import {
  BROWSER_MISSING,
  hs256,
  JWT_SECRET,
  launchBrowser,
  startPageServer,
  type PageServer,
  type TestBrowser,
} from '../helpers/browser.js';
import { startTestGatehouse, testConfig, TEST_PLAIN_KEY, type TestGatehouse } from '../helpers/gatehouse.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// A real browser (Debian's chromium, driven by playwright-core; no browser is ever downloaded) on a
// page served from one origin, calling gatehouse on another: what an SPA behind gatehouse lives
// through. The browser, the page server and tokens are in test/helpers/browser.ts (the WebSocket and
// EventSource cases in browser-websocket.test.ts use them too).

/**
 * The browser app: `call(url, init)` is `fetch` that reports what the page could read (status,
 * the headers CORS exposes, the body) or the error it got, and lists each outcome on the page.
 */
export const APP_PAGE = `<!doctype html>
<html><head><meta charset="utf-8"><title>gatehouse browser test</title>
<style>body{font:14px system-ui,sans-serif;margin:24px} li{margin:4px 0;font-family:monospace} .ok{color:#07632b} .refused{color:#9a5b00} .blocked{color:#b00020}</style>
</head><body><h1>An app on another origin</h1><ul id="log"></ul>
<script>
  const READABLE = ['content-type', 'x-request-id', 'ratelimit', 'ratelimit-policy', 'retry-after', 'x-upstream'];
  function note(text, kind) {
    const item = document.createElement('li');
    item.className = kind;
    item.textContent = text;
    document.getElementById('log').append(item);
  }
  window.call = async (url, init) => {
    try {
      const reply = await fetch(url, init);
      const headers = {};
      for (const name of READABLE) if (reply.headers.get(name) !== null) headers[name] = reply.headers.get(name);
      const body = await reply.text();
      note((init?.method ?? 'GET') + ' ' + url + ' → ' + reply.status + ' ' + JSON.stringify(headers), reply.ok ? 'ok' : 'refused');
      return { status: reply.status, headers, body };
    } catch (err) {
      note((init?.method ?? 'GET') + ' ' + url + ' → blocked: ' + err.name + ': ' + err.message, 'blocked');
      return { error: err.name, message: err.message };
    }
  };
</script></body></html>`;

/** What `call` resolves to in the page. */
export type CallResult =
  { status: number; headers: Record<string, string>; body: string } | { error: string; message: string };

export function call(
  page: Page,
  url: string,
  init: { method?: string; headers?: Record<string, string>; body?: string } = {},
): Promise<CallResult> {
  return page.evaluate(
    ([u, i]) => (globalThis as unknown as { call(url: string, init: unknown): Promise<CallResult> }).call(u, i),
    [url, init] as const,
  );
}

describe('browser: a page on another origin calls gatehouse with fetch (CORS)', { skip: BROWSER_MISSING }, () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  let app: PageServer;
  let stranger: PageServer;
  let browser: TestBrowser;
  let page: Page;

  before(async () => {
    upstream = await startRecordingUpstream((req, res) => {
      res.writeHead(200, {
        'content-type': 'application/json',
        'x-upstream': 'yes',
        'access-control-allow-origin': '*',
      });
      res.end(JSON.stringify({ subject: req.headers['x-gatehouse-subject'] }));
    });
    app = await startPageServer(APP_PAGE);
    stranger = await startPageServer(APP_PAGE);
    gatehouse = await startTestGatehouse(
      testConfig(upstream.url, {
        gateway: {
          auth: { bearer: { jwt: { secret: JWT_SECRET, algorithms: ['HS256'] } } },
          rateLimits: [{ by: 'subject', requests: 1, per: '1h', paths: ['/api/limited/**'] }],
          cors: { origins: [app.origin], exposeHeaders: ['X-Upstream'] },
        },
      }),
    );
    browser = await launchBrowser();
    page = await browser.open(app.origin);
  });
  after(async () => {
    await browser?.close();
    await gatehouse?.close();
    await app?.close();
    await stranger?.close();
    await upstream?.close();
  });

  it('fetch with Authorization: Bearer succeeds, after a preflight the upstream never saw', async () => {
    const seen = upstream.received.length;
    const result = await call(page, `${gatehouse.url}/api/orders`, {
      headers: { Authorization: `Bearer ${await hs256('ana')}` },
    });
    assert.ok('status' in result, JSON.stringify(result));
    assert.equal(result.status, 200);
    assert.deepEqual(JSON.parse(result.body), { subject: 'ana' });
    assert.ok(result.headers['x-request-id'], 'X-Request-Id is exposed');
    assert.equal(result.headers['x-upstream'], 'yes', 'exposeHeaders');
    assert.deepEqual(
      upstream.received.slice(seen).map((r) => r.method),
      ['GET'],
      'only the real request reached the upstream',
    );
    const preflights = gatehouse.logs.filter(
      (l) => l.msg === 'request' && l.method === 'OPTIONS' && l.path === '/api/orders',
    );
    assert.equal(preflights.at(-1)?.status, 204, 'the browser sent a preflight, answered at the edge');
  });

  it('fetch with X-API-Key (a JSON POST) succeeds', async () => {
    const result = await call(page, `${gatehouse.url}/api/orders`, {
      method: 'POST',
      headers: { 'X-API-Key': TEST_PLAIN_KEY, 'Content-Type': 'application/json' },
      body: '{"item":1}',
    });
    assert.ok('status' in result, JSON.stringify(result));
    assert.equal(result.status, 200);
    assert.deepEqual(JSON.parse(result.body), { subject: 'default' });
    assert.equal(upstream.received.at(-1)!.body, '{"item":1}');
  });

  it('the app reads why it was refused: a 401 and a 429 with its RateLimit headers', async () => {
    const refused = await call(page, `${gatehouse.url}/api/orders`, {
      headers: { 'X-API-Key': 'not-the-key-not-the-key-not-the-key' },
    });
    assert.ok('status' in refused, JSON.stringify(refused));
    assert.equal(refused.status, 401);
    assert.equal(JSON.parse(refused.body).error.code, 'invalid_api_key');

    const token = await hs256('bea');
    const first = await call(page, `${gatehouse.url}/api/limited/report`, {
      headers: { Authorization: `Bearer ${token}` },
    });
    assert.ok('status' in first && first.status === 200, JSON.stringify(first));
    const limited = await call(page, `${gatehouse.url}/api/limited/report`, {
      headers: { Authorization: `Bearer ${token}` },
    });
    assert.ok('status' in limited, JSON.stringify(limited));
    assert.equal(limited.status, 429);
    assert.equal(JSON.parse(limited.body).error.code, 'rate_limited');
    assert.match(limited.headers.ratelimit ?? '', /^"subject";r=0;t=\d+$/);
    assert.match(limited.headers['ratelimit-policy'] ?? '', /^"subject";q=1;w=3600$/);
    assert.match(limited.headers['retry-after'] ?? '', /^\d+$/);
  });

  it('from an origin not allowed the browser blocks the call (TypeError) and the upstream sees nothing', async () => {
    const other = await browser.open(stranger.origin);
    try {
      const seen = upstream.received.length;
      const result = await call(other, `${gatehouse.url}/api/orders`, {
        headers: { Authorization: `Bearer ${await hs256('eve')}` },
      });
      assert.ok('error' in result, JSON.stringify(result));
      assert.equal(result.error, 'TypeError');
      assert.equal(upstream.received.length, seen);
      const preflight = gatehouse.logs.findLast((l) => l.msg === 'request' && l.method === 'OPTIONS');
      assert.equal(preflight?.error, 'cors_origin_not_allowed');
      // A simple GET (no preflight, no credential) is answered 401 without CORS headers: the page cannot read it either.
      const simple = await call(other, `${gatehouse.url}/api/orders`);
      assert.ok('error' in simple, JSON.stringify(simple));
    } finally {
      await other.close();
    }
  });

  it('what a person sees on the app page (screenshot, not kept in the repository)', async (t) => {
    const file = path.join(tmpdir(), 'gatehouse-browser-cors.png');
    await page.screenshot({ path: file, fullPage: true });
    t.diagnostic(`screenshot: ${file}`);
    const lines = await page.locator('#log li').allTextContents();
    assert.ok(
      lines.some((line) => line.includes('→ 200')),
      lines.join('\n'),
    );
    assert.ok(
      lines.some((line) => line.includes('→ 429')),
      lines.join('\n'),
    );
  });
});
