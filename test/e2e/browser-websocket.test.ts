import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import type { Page } from 'playwright-core';
import { WebSocketServer } from 'ws';
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

// A real browser's WebSocket and EventSource, which cannot set headers: the credential goes in
// Sec-WebSocket-Protocol or in the query (gateway.auth.browser), and never reaches the upstream.

/** An upstream with a WebSocket echo and a server-sent event stream at /api/events; it records what it got. */
async function startStreamingUpstream() {
  const seen: { url: string; headers: http.IncomingHttpHeaders }[] = [];
  const server = http.createServer((req, res) => {
    seen.push({ url: req.url!, headers: req.headers });
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-store' });
    res.write(`data: hello ${req.headers['x-gatehouse-subject']}\n\n`);
    const timer = setInterval(() => res.write('data: tick\n\n'), 200);
    res.on('close', () => clearInterval(timer));
  });
  const wss = new WebSocketServer({ server });
  wss.on('connection', (ws, req) => {
    seen.push({ url: req.url!, headers: req.headers });
    ws.on('message', (data) => ws.send(`echo:${data.toString()} from ${req.headers['x-gatehouse-subject']}`));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        for (const client of wss.clients) client.terminate();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const STREAM_PAGE = `<!doctype html><html><head><meta charset="utf-8"><title>streams</title></head><body><h1>Streams from another origin</h1><ul id="log"></ul>
<script>
  const note = (text) => { const li = document.createElement('li'); li.textContent = text; document.getElementById('log').append(li); };
  window.chat = (url, protocols) => new Promise((resolve) => {
    const ws = new WebSocket(url, protocols);
    ws.onopen = () => ws.send('hi');
    ws.onmessage = (event) => { note('websocket: ' + event.data + ' (protocol ' + ws.protocol + ')'); resolve({ protocol: ws.protocol, message: event.data }); ws.close(); };
    ws.onerror = () => { note('websocket: refused'); resolve({ error: 'refused' }); };
  });
  window.listen = (url) => new Promise((resolve) => {
    const source = new EventSource(url);
    source.onmessage = (event) => { note('eventsource: ' + event.data); resolve({ message: event.data }); source.close(); };
    source.onerror = () => { note('eventsource: error'); resolve({ error: 'error' }); source.close(); };
  });
</script></body></html>`;

describe(
  'browser: WebSocket and EventSource with the credential forms a browser can send',
  { skip: BROWSER_MISSING },
  () => {
    let upstream: Awaited<ReturnType<typeof startStreamingUpstream>>;
    let gatehouse: TestGatehouse;
    let app: PageServer;
    let browser: TestBrowser;
    let page: Page;

    before(async () => {
      upstream = await startStreamingUpstream();
      app = await startPageServer(STREAM_PAGE);
      gatehouse = await startTestGatehouse(
        testConfig(upstream.url, {
          gateway: {
            auth: {
              bearer: { jwt: { secret: JWT_SECRET, algorithms: ['HS256'] } },
              browser: { websocketProtocol: true, queryParameter: 'access_token' },
            },
            cors: { origins: [app.origin] },
          },
        }),
      );
      browser = await launchBrowser();
      page = await browser.open(app.origin);
    });
    after(async () => {
      await browser?.close();
      await gatehouse?.close(100);
      await app?.close();
      await upstream?.close();
    });

    const wsBase = () => gatehouse.url.replace(/^http/, 'ws');

    it('new WebSocket(url, ["gatehouse", "gatehouse.bearer." + token]) echoes, and the upstream never sees the token', async () => {
      const token = await hs256('ana');
      const result = await page.evaluate(([url, protocols]) => (globalThis as any).chat(url, protocols), [
        `${wsBase()}/api/chat`,
        ['gatehouse', `gatehouse.bearer.${token}`],
      ] as const);
      assert.deepEqual(result, { protocol: 'gatehouse', message: 'echo:hi from ana' });
      const handshake = upstream.seen.at(-1)!;
      assert.equal(handshake.headers['sec-websocket-protocol'], undefined);
      assert.equal(handshake.headers.authorization, undefined);
      assert.equal(JSON.stringify(handshake.headers).includes(token), false);
    });

    it('an API key in the protocol works the same way; a wrong one is refused before the upstream', async () => {
      const ok = await page.evaluate(([url, protocols]) => (globalThis as any).chat(url, protocols), [
        `${wsBase()}/api/chat`,
        ['gatehouse', `gatehouse.api-key.${TEST_PLAIN_KEY}`],
      ] as const);
      assert.deepEqual(ok, { protocol: 'gatehouse', message: 'echo:hi from default' });
      const seen = upstream.seen.length;
      const refused = await page.evaluate(([url, protocols]) => (globalThis as any).chat(url, protocols), [
        `${wsBase()}/api/chat`,
        ['gatehouse', 'gatehouse.api-key.not-the-key-not-the-key-not-the-key'],
      ] as const);
      assert.deepEqual(refused, { error: 'refused' });
      assert.equal(upstream.seen.length, seen);
    });

    it('new EventSource(url + "?access_token=…") receives events; the upstream URL and the log have no token', async () => {
      const token = await hs256('bea');
      const result = await page.evaluate(
        (url) => (globalThis as any).listen(url),
        `${gatehouse.url}/api/events?topic=deploys&access_token=${token}`,
      );
      assert.deepEqual(result, { message: 'hello bea' });
      assert.equal(upstream.seen.at(-1)!.url, '/api/events?topic=deploys');
      assert.equal(gatehouse.logText().includes(token), false);
      const refused = await page.evaluate(
        (url) => (globalThis as any).listen(url),
        `${gatehouse.url}/api/events?access_token=${token}x`,
      );
      assert.deepEqual(refused, { error: 'error' });
    });
  },
);
