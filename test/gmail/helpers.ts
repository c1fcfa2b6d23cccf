/**
 * Shared by the Gmail end-to-end tests (setup.test.ts, run.test.ts): a workspace (temp dir, SQLite
 * path, client_secret.json, config file), `gatehouse webhooks gmail setup` run as a child process
 * with the test playing the browser, read-only looks into the SQLite file, a relay in front of the
 * push route that records what storage held at the moment gatehouse answered each push, a hook
 * on the fake's calls (act before it answers), and a proxy that holds chosen Google calls.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import JSON5 from 'json5';
import { FAKE_CLIENT, type FakeGoogle, type RecordedCall } from '../helpers/fake-google.js';
import { spawnCli, type CliResult } from '../helpers/process.js';

export const ACCOUNT = 'alice@example.com';
export const PROJECT = FAKE_CLIENT.projectId;
export const PUSH_SERVICE_ACCOUNT = 'push@gatehouse-test.iam.gserviceaccount.com';
export const TOPIC = `projects/${PROJECT}/topics/gatehouse-gmail`;
export const PUSH_SUBSCRIPTION = `projects/${PROJECT}/subscriptions/gatehouse-gmail-push`;
export const GMAIL_PUBLISHER = 'serviceAccount:gmail-api-push@system.gserviceaccount.com';
export const ENDPOINT = `gmail:${ACCOUNT}`;

/** A fresh GATEHOUSE_SECRET_KEY: 32 random bytes, base64. */
export function newSecretKey(): string {
  return randomBytes(32).toString('base64');
}

export interface Workspace {
  dir: string;
  db: string;
  credentials: string;
  config: string;
  /** GATEHOUSE_SECRET_KEY for this workspace. */
  key: string;
  env: NodeJS.ProcessEnv;
}

/** A temp dir with client_secret.json (FAKE_CLIENT, a Desktop-app client) and a config without webhooks.gmail. */
export function workspace(): Workspace {
  const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-gmail-'));
  const credentials = path.join(dir, 'client_secret.json');
  writeFileSync(
    credentials,
    JSON.stringify({
      installed: {
        client_id: FAKE_CLIENT.clientId,
        client_secret: FAKE_CLIENT.clientSecret,
        project_id: FAKE_CLIENT.projectId,
      },
    }),
  );
  const key = newSecretKey();
  const ws = {
    dir,
    db: path.join(dir, 'gatehouse.db'),
    credentials,
    config: path.join(dir, 'gatehouse.json5'),
    key,
    env: { GATEHOUSE_SECRET_KEY: key },
  };
  writeConfig(ws);
  return ws;
}

/** Writes the workspace's config: its SQLite file, a loopback gateway, and `webhooks` as given. */
export function writeConfig(ws: Workspace, webhooks?: Record<string, unknown>): void {
  writeFileSync(
    ws.config,
    JSON.stringify(
      {
        storage: { path: ws.db },
        log: { level: 'info' },
        gateway: {
          listen: { host: '127.0.0.1', port: 0 },
          upstream: { target: 'http://127.0.0.1:9' },
          auth: { apiKey: 'gmail-e2e-api-key-0123456789abcdefghijkl', failures: { max: 100 } },
        },
        ...(webhooks ? { webhooks } : {}),
      },
      null,
      2,
    ),
  );
}

/** `webhooks` for a run: the receiver on loopback, a `message` target, short retries, and the gmail section. */
export function webhooksWith(gmail: Record<string, unknown>, targetUrl: string, port = 0): Record<string, unknown> {
  return {
    enabled: true,
    listen: { host: '127.0.0.1', port },
    targets: { message: { url: `${targetUrl}/messages` } },
    delivery: { initialBackoffMs: 50, maxBackoffMs: 200, timeoutMs: 2_000 },
    gmail,
  };
}

/** Every byte storage holds on disk: the database file and its WAL. */
export function storageBytes(ws: Workspace): Buffer {
  return Buffer.concat([ws.db, `${ws.db}-wal`].filter(existsSync).map((f) => readFileSync(f)));
}

/** One row of gmail_accounts (read-only), or undefined. */
export function accountRow(ws: Workspace): Record<string, any> | undefined {
  if (!existsSync(ws.db)) return undefined;
  const db = new Database(ws.db, { readonly: true, fileMustExist: true });
  try {
    const exists = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'gmail_accounts'").get();
    return exists
      ? (db.prepare('SELECT * FROM gmail_accounts WHERE account = ?').get(ACCOUNT) as Record<string, any> | undefined)
      : undefined;
  } finally {
    db.close();
  }
}

export interface SetupRun extends CliResult {
  /** The authorisation URL setup printed, if it printed one. */
  authUrl?: URL;
  /** What the browser saw: the consent answer and the loopback listener's page. */
  browser?: { consentStatus: number; location: URL; loopbackStatus: number; loopbackPage: string };
}

/**
 * `gatehouse webhooks gmail setup --account alice@example.com --config … <args>` as a child
 * process. When it prints the authorisation URL, the test plays the browser: GET it (the fake's
 * consent screen answers a 302), then GET the Location (the CLI's loopback listener).
 */
export async function runSetup(
  fake: FakeGoogle,
  ws: Workspace,
  args: string[],
  options: {
    env?: NodeJS.ProcessEnv;
    timeoutMs?: number;
    /** Pass --google-api-url <the fake> (default); false: the endpoints come from the config or client file. */ flag?: boolean;
  } = {},
): Promise<SetupRun> {
  const endpoint = options.flag === false ? [] : ['--google-api-url', fake.url];
  const child = spawnCli(
    ['webhooks', 'gmail', 'setup', '--account', ACCOUNT, '--config', ws.config, ...endpoint, '--no-browser', ...args],
    { env: options.env ?? ws.env },
  );
  const run: SetupRun = { code: null, stdout: '', stderr: '' };
  let browsing: Promise<void> | undefined;
  const look = () => {
    if (browsing) return;
    const found = /(http:\/\/127\.0\.0\.1:\d+\/o\/oauth2\/v2\/auth\?\S+)/.exec(run.stdout + run.stderr);
    if (!found) return;
    run.authUrl = new URL(found[1]!);
    browsing = (async () => {
      const consent = await fetch(run.authUrl!, { redirect: 'manual' });
      const location = new URL(consent.headers.get('location') ?? 'http://invalid.invalid/');
      const back = await fetch(location);
      run.browser = {
        consentStatus: consent.status,
        location,
        loopbackStatus: back.status,
        loopbackPage: await back.text(),
      };
    })();
  };
  child.stdout!.on('data', (d) => {
    run.stdout += d;
    look();
  });
  child.stderr!.on('data', (d) => {
    run.stderr += d;
    look();
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 20_000);
  [run.code] = (await once(child, 'exit')) as [number | null];
  clearTimeout(timer);
  await browsing;
  return run;
}

/**
 * The calls Google's published contract refuses (test/fixtures/google/: no documented method for
 * the HTTP method and path, or a parameter, field or enum value the method does not document),
 * as `METHOD path: problem`. Real Google would have failed each of them.
 */
export function contractRefusals(calls: RecordedCall[]): string[] {
  return calls.filter((c) => c.refused).map((c) => `${c.method} ${c.path}: ${c.problem}`);
}

/** The documented methods these calls used, each once, in order of first use. */
export function methodsUsed(calls: RecordedCall[]): string[] {
  return [...new Set(calls.flatMap((c) => (c.discoveryId ? [c.discoveryId] : [])))];
}

/** The webhooks.gmail section setup printed (human output), parsed. */
export function printedSection(stdout: string): Record<string, any> {
  const found = /^ {2}gmail: ([\s\S]*?),\n\nnext:/m.exec(stdout);
  assert.ok(found, `no webhooks.gmail section in:\n${stdout}`);
  return JSON5.parse(found[1]!);
}

/** The ✓/✗/· step lines setup printed, as [mark, step, rest]. */
export function stepLines(stdout: string): [string, string, string][] {
  return [...stdout.matchAll(/^ {2}([✓✗·]) (\S+)\s+(.*)$/gm)].map((m) => [m[1]!, m[2]!, m[3]!]);
}

/**
 * The endpoint's events the workspace's SQLite file holds as queued (not yet delivered, nor dead).
 * Zero means every event stored so far has been settled, after its target got it: a negative
 * check on deliveries waits for this rather than for a fixed time.
 */
export function queuedEvents(ws: Workspace): number {
  const db = new Database(ws.db, { readonly: true, fileMustExist: true });
  try {
    return (
      db.prepare("SELECT count(*) AS n FROM events WHERE endpoint = ? AND status = 'queued'").get(ENDPOINT) as {
        n: number;
      }
    ).n;
  } finally {
    db.close();
  }
}

/** The Gmail message ids of the events committed for the account (a separate read-only connection). */
export function committedIds(ws: Workspace): string[] {
  const db = new Database(ws.db, { readonly: true, fileMustExist: true });
  try {
    return (
      db.prepare('SELECT idempotency_key AS id FROM events WHERE endpoint = ? ORDER BY received_at').all(ENDPOINT) as {
        id: string;
      }[]
    ).map((r) => r.id);
  } finally {
    db.close();
  }
}

/**
 * Runs `react` synchronously as the fake records a matching call, that is before the fake has
 * answered it (it records a call once the request is read, then routes it). Returns the undo.
 */
export function onCall(
  fake: FakeGoogle,
  match: (call: RecordedCall) => boolean,
  react: (call: RecordedCall) => void,
): () => void {
  const calls = fake.calls;
  calls.push = function push(this: RecordedCall[], ...items: RecordedCall[]) {
    for (const call of items) if (match(call)) react(call);
    return Array.prototype.push.apply(this, items);
  };
  return () => void delete (calls as { push?: unknown }).push;
}

/** The fake's pushes have all been answered (or given up), within `timeoutMs`. */
export async function pushesSettled(fake: FakeGoogle, timeoutMs = 15_000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () =>
        reject(
          new Error(
            `pushes still pending after ${timeoutMs} ms; last attempts: ${JSON.stringify(fake.pushAttempts.slice(-5).map(({ authorization: _a, ...a }) => a))}`,
          ),
        ),
      timeoutMs,
    );
  });
  try {
    await Promise.race([fake.pushIdle(), late]);
  } finally {
    clearTimeout(timer);
  }
}

export interface PushObservation {
  /** The push's Pub/Sub messageId, and the historyId of the Gmail notification it carried. */
  messageId: string;
  historyId: string;
  /** gatehouse's answer; 502 when it could not be reached. */
  status: number;
  /** Gmail message ids of the events storage held when that answer arrived (read before it was passed on). */
  committed: string[];
}

export interface PushRelay {
  url: string;
  /** Where pushes go (gatehouse's webhook listener); undefined: answer 503 without forwarding. */
  forwardTo: string | undefined;
  observed: PushObservation[];
  close(): Promise<void>;
}

/**
 * Stands between the fake's push and gatehouse (the subscription's pushEndpoint): forwards each
 * push as is, and when gatehouse answers, reads the SQLite file (another connection, as any
 * reader would) before handing the answer back to Pub/Sub. So a test can show that a 2xx never
 * left gatehouse before the email's event was committed.
 */
export async function startPushRelay(ws: Workspace): Promise<PushRelay> {
  const relay: PushRelay = {
    url: '',
    forwardTo: undefined,
    observed: [],
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const { message } = JSON.parse(body.toString('utf8')) as { message: { messageId: string; data: string } };
      const { historyId } = JSON.parse(Buffer.from(message.data, 'base64').toString('utf8')) as { historyId: number };
      const answer = (status: number, text: string) => {
        relay.observed.push({
          messageId: message.messageId,
          historyId: String(historyId),
          status,
          committed: committedIds(ws),
        });
        res.writeHead(status, { 'content-type': 'application/json' }).end(text);
      };
      if (!relay.forwardTo) return answer(503, '{"relay":"paused"}');
      const out = http.request(
        `${relay.forwardTo}${req.url}`,
        { method: 'POST', headers: { ...req.headers, host: new URL(relay.forwardTo).host }, agent: false },
        (back) => {
          const parts: Buffer[] = [];
          back.on('data', (c: Buffer) => parts.push(c));
          back.on('end', () => answer(back.statusCode!, Buffer.concat(parts).toString('utf8')));
        },
      );
      out.on('error', () => answer(502, '{"relay":"gatehouse unreachable"}'));
      out.end(body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  relay.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return relay;
}

export interface HoldingProxy {
  url: string;
  /** Resolves when the first request matching `hold` arrives (and is being held). */
  held: Promise<void>;
  /** Lets the held requests through. */
  release(): void;
  close(): Promise<void>;
}

/** Forwards everything to `upstream` (the fake), but holds requests whose path matches until release(). */
export async function startHoldingProxy(upstream: string, hold: (path: string) => boolean): Promise<HoldingProxy> {
  let arrived!: () => void;
  let release!: () => void;
  const held = new Promise<void>((resolve) => (arrived = resolve));
  const released = new Promise<void>((resolve) => (release = resolve));
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', async () => {
      if (hold(req.url ?? '')) {
        arrived();
        await released;
      }
      const target = new URL(req.url ?? '/', upstream);
      const out = http.request(
        target,
        { method: req.method, headers: { ...req.headers, host: target.host }, agent: false },
        (back) => {
          res.writeHead(back.statusCode!, back.headers);
          back.pipe(res);
        },
      );
      out.on('error', () => res.destroy());
      out.end(Buffer.concat(chunks));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/`,
    held,
    release,
    close: async () => {
      release();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
