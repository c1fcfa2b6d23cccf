import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { SignJWT } from 'jose';
import { chromium, type BrowserContext, type Page } from 'playwright-core';

/*
 * A real browser for the e2e tests: Debian's chromium driven by playwright-core (no browser is
 * ever downloaded), a page server for the app's own origin, and HS256 tokens the gatehouse under
 * test accepts.
 */
export const CHROMIUM = '/usr/bin/chromium';
/** Why the browser tests are skipped here (no chromium), or false. */
export const BROWSER_MISSING = existsSync(CHROMIUM)
  ? false
  : `${CHROMIUM} is missing: install Debian's chromium (apt-get install chromium) to run the browser tests`;

export const JWT_SECRET = 'browser-test-jwt-secret-0123456789abcdef';

export function hs256(sub: string): Promise<string> {
  return new SignJWT({ sub })
    .setProtectedHeader({ alg: 'HS256' })
    .setExpirationTime('10m')
    .sign(new TextEncoder().encode(JWT_SECRET));
}

export interface PageServer {
  /** `http://127.0.0.1:<port>`: the page's origin, as the browser sends it in `Origin`. */
  origin: string;
  close(): Promise<void>;
}

/** A node:http server answering every GET with `html`: the browser app, on its own origin. */
export async function startPageServer(html: string): Promise<PageServer> {
  const server = http.createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
    res.end(html);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export interface TestBrowser {
  context: BrowserContext;
  /** A new tab on `url`, loaded. */
  open(url: string): Promise<Page>;
  close(): Promise<void>;
}

/** Chromium with a fresh profile, headless, no network of its own (updates, sync, QUIC). */
export async function launchBrowser(): Promise<TestBrowser> {
  const profile = mkdtempSync(path.join(tmpdir(), 'gatehouse-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    timeout: 60_000,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  return {
    context,
    async open(url) {
      const page = await context.newPage();
      await page.goto(url);
      return page;
    },
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}
