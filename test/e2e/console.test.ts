import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import type { ServerResponse } from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { Locator, Page } from 'playwright-core';
import { start, type Started } from '../helpers/admin.js';
import { BROWSER_MISSING, launchBrowser, type TestBrowser } from '../helpers/browser.js';
import { request } from '../helpers/http.js';
import { ROOT } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

// Issue 30's console in a real browser (Debian's chromium through playwright-core) against a real
// `gatehouse start`: a target that fails, webhooks that die, an operator who signs in with the
// admin token (by keyboard), finds the dead letters, reads the target's error in an event's
// timeline, fixes the target, retries one event by keyboard and the rest of that endpoint with
// "Retry all matching" (the dialog states the count), and watches them turn delivered with
// auto-refresh; the target's own record says each was delivered exactly once. Then a client locked
// out by bad API keys is lifted in the Lockouts view and reaches the upstream again.
// Elements are found by role and accessible name, as a screen reader would.
//
// CONSOLE_SCREENSHOTS=docs/console writes the screenshots the docs page shows (never in CI).

const TOKEN = 'console-e2e-admin-token-0123456789';
const KEY = 'console-e2e-api-key-0123456789abcdefghijkl';
const HOOK_SECRET = 'console-e2e-hook-secret-0123456789';
const BILLING = '/webhook/billing';
const DEPLOYS = '/webhook/deploys';
const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-console-'));
const screenshots = process.env.CONSOLE_SCREENSHOTS ? path.resolve(ROOT, process.env.CONSOLE_SCREENSHOTS) : undefined;

/** The billing target: 503 until fixed; then 200, each answer held while `hold` is set. */
const billing = { failing: true, hold: false, held: [] as (() => void)[], delivered: new Map<string, number>() };

let target: RecordingServer;
let upstream: RecordingServer;
let s: Started;
let browser: TestBrowser;
let page: Page;
const billingIds: string[] = [];

before(async () => {
  target = await startRecordingUpstream((req, res: ServerResponse) => {
    if (billing.failing) {
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end('{"error":"billing is down for maintenance"}');
      return;
    }
    const answer = () => {
      const id = JSON.parse(req.body).id as string;
      billing.delivered.set(id, (billing.delivered.get(id) ?? 0) + 1);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"ok":true}');
    };
    if (billing.hold) billing.held.push(answer);
    else answer();
  });
  upstream = await startRecordingUpstream();
  const file = path.join(dir, 'gateway.json5');
  // Deploys go to a port nothing listens on: their timeline says "connection refused".
  writeFileSync(
    file,
    `{
    gateway: { listen: { port: 0 }, upstream: { target: "${upstream.url}" },
      auth: { apiKey: "${KEY}", failures: { max: 3, windowSeconds: 60, lockoutSeconds: 600 } } },
    webhooks: { enabled: true, listen: { port: 0 },
      endpoints: [{ path: "${BILLING}", secret: "${HOOK_SECRET}", action: "message" },
                  { path: "${DEPLOYS}", secret: "${HOOK_SECRET}", action: "system-event" }],
      targets: { message: { url: "${target.url}/billing" }, "system-event": { url: "http://127.0.0.1:1/deploys" } },
      delivery: { maxAttempts: 2, initialBackoffMs: 20, maxBackoffMs: 50, timeoutMs: 20000 } },
    storage: { path: "${path.join(dir, 'events.db')}" },
    admin: { listen: { port: 0 }, token: "${TOKEN}" },
  }`,
  );
  s = await start(file);
  const post = async (endpoint: string, body: unknown) => {
    const reply = await request(s.webhooks, endpoint, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-webhook-secret': HOOK_SECRET },
      body: JSON.stringify(body),
    });
    assert.equal(reply.status, 202, reply.body);
    return reply.json().id as string;
  };
  for (let i = 1; i <= 4; i++)
    billingIds.push(await post(BILLING, { type: 'invoice.paid', invoice: `in_${1000 + i}`, amount: 1200 * i }));
  for (let i = 1; i <= 2; i++) await post(DEPLOYS, { ref: 'main', sha: `4f2a9c${i}`, environment: 'production' });
  await waitFor(
    async () => {
      const reply = await request(s.admin, '/admin/api/events?status=dead', {
        headers: { authorization: `Bearer ${TOKEN}` },
      });
      return reply.json().events.length === 6;
    },
    { what: 'six events dead after two failed attempts each', timeoutMs: 60_000 },
  );
  if (screenshots) mkdirSync(screenshots, { recursive: true });
});
after(async () => {
  await browser?.close();
  await s?.server.stop('SIGKILL');
  await target?.close();
  await upstream?.close();
});

/** With CONSOLE_SCREENSHOTS: the page as a PNG, made small by pngquant when it is installed. */
async function snap(name: string, options: { fullPage?: boolean } = {}): Promise<void> {
  if (!screenshots) return;
  const file = path.join(screenshots, `${name}.png`);
  await page.screenshot({ path: file, animations: 'disabled', caret: 'hide', ...options });
  spawnSync('pngquant', ['--quality', '70-90', '--strip', '--speed', '1', '--force', '--output', file, file]);
}

// The page's own globals, inside evaluate (this project compiles without the DOM's types).
type PageGlobals = { document: any; innerWidth: number };

/** Whether the element `locator` finds has the focus. */
const focused = (locator: Locator) => locator.evaluate((el: any) => el.ownerDocument.activeElement === el);

/** Presses Tab (at most 40 times) until `locator` has the focus: how a keyboard reaches it. */
async function tabTo(locator: Locator): Promise<void> {
  for (let i = 0; i < 40; i++) {
    if (await focused(locator)) return;
    await page.keyboard.press('Tab');
  }
  assert.fail(`Tab never reached ${String(locator)}`);
}

const rows = () => page.locator('table.events tbody tr');

describe('console in a browser: dead letters found, read, fixed and retried', { skip: BROWSER_MISSING }, () => {
  before(async () => {
    browser = await launchBrowser();
    page = await browser.context.newPage();
    await page.setViewportSize({ width: 1366, height: 768 });
    page.on('pageerror', (err) => assert.fail(`the page threw: ${err.message}`));
    await page.goto(`${s.admin}/console/`);
  });

  it('signs in by keyboard alone; a wrong token is refused with a message', async () => {
    const token = page.getByLabel('Admin token');
    await waitFor(() => focused(token), { what: 'the token field focused' });
    assert.equal(await page.getByRole('button', { name: 'Sign out' }).isVisible(), false, 'nothing to sign out of');
    assert.equal(await page.getByRole('navigation', { name: 'Console sections' }).isVisible(), false);
    await page.keyboard.type('not-the-admin-token-0123456789');
    await page.keyboard.press('Enter');
    await page.getByRole('alert').filter({ hasText: 'That is not the admin token.' }).waitFor();
    await snap('sign-in');
    assert.ok(await focused(token), 'the field has the focus again');
    await page.keyboard.press('Control+A');
    await page.keyboard.type(TOKEN);
    await page.keyboard.press('Enter');
    await page.getByRole('heading', { name: 'Deliveries', level: 1 }).waitFor();
    assert.equal(await page.getByRole('link', { name: 'Deliveries' }).getAttribute('aria-current'), 'page');
    assert.ok(await page.getByRole('button', { name: 'Sign out' }).isVisible());
    const cookies = await browser.context.cookies(s.admin);
    assert.equal(cookies.length, 1);
    assert.equal(cookies[0]!.httpOnly, true);
    assert.equal(cookies[0]!.sameSite, 'Strict');
    assert.equal(
      await page.evaluate(() => (globalThis as unknown as PageGlobals).document.cookie),
      '',
      'the page cannot read the session cookie',
    );
  });

  it('shows the failures in the dead letters, one click away', async () => {
    await page.getByRole('link', { name: 'Dead letters' }).click();
    await page.getByRole('heading', { name: 'Dead letters', level: 1 }).waitFor();
    await waitFor(async () => (await rows().count()) === 6, { what: 'six dead rows' });
    const tabs = page.getByRole('navigation', { name: 'Delivery status' });
    assert.equal(await tabs.getByRole('link', { name: /^Dead/ }).getAttribute('aria-current'), 'page');
    // The counts of the whole store (GET /admin/api/status), beside each tab.
    await tabs.getByRole('link', { name: 'Dead 6' }).waitFor();
    await tabs.getByRole('link', { name: 'Queued 0' }).waitFor();
    const table = page.getByRole('table');
    for (const header of ['Received', 'Event', 'Endpoint', 'Action', 'Status', 'Attempts', 'Last attempt'])
      await table.getByRole('columnheader', { name: header }).waitFor();
    const text = await table.innerText();
    assert.match(text, /HTTP 503 Service Unavailable/);
    assert.match(text, /ECONNREFUSED/);
    await snap('deliveries-dead');
  });

  it("opens an event and reads the target's error in its timeline", async () => {
    await page.getByRole('link', { name: billingIds[0]! }).click();
    await page.getByRole('heading', { name: `Event ${billingIds[0]}` }).waitFor();
    const timeline = page.getByRole('list').filter({ hasText: 'Attempt 1' });
    await timeline.getByText('Attempt 2').waitFor();
    assert.equal(await timeline.getByRole('listitem').count(), 2);
    assert.match(await timeline.innerText(), /HTTP 503 Service Unavailable/);
    // The target's own answer, as text, under each attempt.
    assert.equal(
      await page.getByLabel('Answer of attempt 1 (first 512 bytes)').innerText(),
      '{"error":"billing is down for maintenance"}',
    );
    // The headers it came with: plain ones as sent, the sender's secret as [redacted], never its value.
    const headers = page.getByRole('table', { name: 'Received headers' });
    await headers.getByRole('row', { name: /content-type application\/json/ }).waitFor();
    await headers.getByRole('row', { name: 'x-webhook-secret [redacted]' }).waitFor();
    assert.ok(!(await page.content()).includes(HOOK_SECRET), 'the secret is nowhere on the page');
    const envelope = await page.getByLabel('Envelope (JSON)').innerText();
    assert.match(envelope, /"invoice": "in_1001"/, 'pretty JSON');
    await snap('event-detail', { fullPage: true });
    // A refused connection is said as the deliverer saw it.
    await page.getByRole('link', { name: '← Back to the list' }).click();
    await waitFor(async () => (await rows().count()) === 6, { what: 'the dead list again' });
    await page.getByRole('row').filter({ hasText: DEPLOYS }).first().getByRole('link').click();
    await page
      .getByText(/ECONNREFUSED.*127\.0\.0\.1:1/)
      .first()
      .waitFor();
    await page.goBack();
    await waitFor(async () => (await rows().count()) === 6, { what: 'the dead list again' });
  });

  it('after the target is fixed, retries one event by keyboard: delivered, once', async () => {
    billing.failing = false;
    await page.getByRole('link', { name: billingIds[0]! }).click();
    const retry = page.getByRole('button', { name: 'Retry this event' });
    await retry.waitFor();
    await tabTo(retry);
    await page.keyboard.press('Enter');
    await page.getByRole('status').filter({ hasText: 'Requeued' }).waitFor();
    // The page follows a queued event by itself until it settles.
    await page.locator('.facts .badge.delivered').waitFor({ timeout: 20_000 });
    assert.match(await page.locator('.timeline li').last().innerText(), /Attempt 3[\s\S]*HTTP 200 OK/);
    assert.equal(billing.delivered.get(billingIds[0]!), 1);
  });

  it('retries all matching dead events of the endpoint after a dialog that states the count, and watches them turn delivered', async () => {
    await page.getByRole('link', { name: 'Dead letters' }).click();
    await page.getByRole('heading', { name: 'Dead letters', level: 1 }).waitFor();
    await page.getByLabel('Endpoint').fill(BILLING);
    await page.getByRole('button', { name: 'Apply filters' }).click();
    await waitFor(async () => (await rows().count()) === 3, { what: 'the three dead billing events' });
    assert.match(page.url(), /endpoint=%2Fwebhook%2Fbilling/, 'the filter is in the address');

    // Deliveries are held at the target, so the page shows them queued before they land.
    billing.hold = true;
    await page.getByRole('button', { name: 'Retry all matching' }).click();
    const dialog = page.getByRole('dialog', { name: 'Retry all matching?' });
    await dialog.waitFor();
    assert.match(
      await dialog.innerText(),
      /3 events \(3 dead\) match the filter status dead, endpoint \/webhook\/billing/,
    );
    assert.ok(
      await focused(dialog.getByRole('button', { name: 'Cancel' })),
      'Cancel has the focus: Enter alone retries nothing',
    );
    await snap('retry-confirmation');
    await dialog.getByRole('button', { name: 'Retry 3 events' }).click();
    await page.getByRole('status').filter({ hasText: 'Requeued 3 events.' }).first().waitFor();

    // Watch: the All tab of this endpoint with auto-refresh; no click from here on.
    await page.getByRole('navigation', { name: 'Delivery status' }).getByRole('link', { name: /^All/ }).click();
    await page.getByLabel('Auto-refresh (5 s)').check();
    await waitFor(async () => (await page.locator('tbody .badge.queued').count()) >= 1, {
      what: 'the retried events queued (held at the target)',
      timeoutMs: 15_000,
    });
    await waitFor(() => billing.held.length === 3, { what: 'three deliveries at the target', timeoutMs: 15_000 });
    billing.hold = false;
    for (const answer of billing.held.splice(0)) answer();
    await waitFor(async () => (await page.locator('tbody .badge.delivered').count()) === 4, {
      what: 'all four billing events delivered on the page, by auto-refresh',
      timeoutMs: 20_000,
    });
    assert.equal(await rows().count(), 4);
    await snap('after-delivery');

    assert.deepEqual(
      billingIds.map((id) => billing.delivered.get(id)),
      [1, 1, 1, 1],
      'each billing event reached the target exactly once',
    );
    assert.equal(
      target.received.filter((r) => r.url !== '/billing').length,
      0,
      'nothing but billing events went to this target',
    );
  });

  it('is readable at a phone width', async () => {
    await page.setViewportSize({ width: 375, height: 812 });
    await page.getByRole('link', { name: 'Dead letters' }).click();
    await page.getByLabel('Endpoint').fill('');
    await page.getByRole('button', { name: 'Apply filters' }).click();
    await waitFor(async () => (await rows().count()) === 2, { what: 'the two dead deploys' });
    assert.equal(await page.locator('#notice').innerText(), '', "a new view starts without the last one's notice");
    const overflow = await page.evaluate(() => {
      const g = globalThis as unknown as PageGlobals;
      return g.document.documentElement.scrollWidth - g.innerWidth;
    });
    assert.ok(overflow <= 0, `no sideways scrolling at 375 px (${overflow} px too wide)`);
    await snap('phone-dead-letters');
    await page.setViewportSize({ width: 1366, height: 768 });
  });
});

describe('console in a browser: keys and status', { skip: BROWSER_MISSING }, () => {
  it('lists the configured key without its secret, and the status of the store and its queue', async () => {
    await page.getByRole('link', { name: 'Keys' }).click();
    await page.getByRole('heading', { name: 'API keys', level: 1 }).waitFor();
    const keyRow = page.getByRole('row').filter({ hasText: 'default' });
    await keyRow.waitFor();
    assert.match(await keyRow.innerText(), /apiKey/);
    assert.ok(!(await page.locator('main').innerText()).includes(KEY), 'never the key itself');

    await page.getByRole('link', { name: 'Status' }).click();
    await page.getByRole('heading', { name: 'Status', level: 1 }).waitFor();
    const store = page.getByRole('region', { name: 'Store' });
    await store.getByText('sqlite').waitFor();
    assert.match(await store.innerText(), /dead\s+2\b/, 'the two dead deploys');
    await page.getByRole('region', { name: 'Listeners' }).getByText(s.admin).waitFor();
  });
});

describe('console in a browser: a lockout lifted', { skip: BROWSER_MISSING }, () => {
  it('a client locked out by bad API keys is lifted in the Lockouts view and reaches the upstream again', async () => {
    for (let i = 0; i < 3; i++)
      assert.equal(
        (await request(s.gateway, '/api/orders', { headers: { 'x-api-key': `wrong-key-${i}-0123456789abcdefghij` } }))
          .status,
        401,
      );
    const locked = await request(s.gateway, '/api/orders', { headers: { 'x-api-key': KEY } });
    assert.equal(locked.status, 429, 'locked out, even with the right key');
    const seen = upstream.received.length;

    await page.getByRole('link', { name: 'Lockouts' }).click();
    await page.getByRole('heading', { name: 'Lockouts', level: 1 }).waitFor();
    const lift = page.getByRole('button', { name: 'Lift the lockout of 127.0.0.1' });
    await lift.waitFor();
    await snap('lockouts');
    await lift.click();
    await page.getByRole('status').filter({ hasText: 'Lifted the lockout of 127.0.0.1' }).waitFor();
    await page.getByText('No client is locked out.').waitFor();

    const through = await request(s.gateway, '/api/orders', { headers: { 'x-api-key': KEY } });
    assert.equal(through.status, 200, through.body);
    assert.deepEqual(
      upstream.received.slice(seen).map((r) => r.url),
      ['/api/orders'],
      'the lifted client reached the upstream',
    );
  });
});
