/**
 * Shared by the channel end-to-end tests: a workspace (temp dir, SQLite file, sealing key, config
 * file with a fixed webhook port so the links a login prints are the server's), gatehouse as a
 * real `start` process, `gatehouse channels …` as child processes (a login followed while it
 * runs, so the test can play the device or the browser), and reading a terminal QR code back.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import jsQR from 'jsqr';
import type { FakeChatServer } from '../helpers/fake-chat.js';
import { runCli, spawnCli, startServerProcess, type CliResult, type ServerProcess } from '../helpers/process.js';
import type { ReceivedRequest, RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

/** gateway.auth.apiKey of every workspace: what an internal service sends to the channel API. */
export const API_KEY = 'channels-e2e-api-key-0123456789abcdefghij';

export interface Workspace {
  dir: string;
  db: string;
  config: string;
  /** GATEHOUSE_SECRET_KEY for this workspace. */
  key: string;
  env: NodeJS.ProcessEnv;
  /** The webhook listener's fixed port and base URL (publicUrl of bot-token channels). */
  webhookPort: number;
  webhookUrl: string;
}

/** A port that was free a moment ago (the webhook listener needs a known one: logins print links to it). */
async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A temp dir, a fresh sealing key and a free webhook port; write the config with `writeConfig`. */
export async function workspace(prefix: string): Promise<Workspace> {
  const dir = mkdtempSync(path.join(tmpdir(), `gatehouse-${prefix}-`));
  const key = randomBytes(32).toString('base64');
  const webhookPort = await freePort();
  return {
    dir,
    key,
    webhookPort,
    db: path.join(dir, 'gatehouse.db'),
    config: path.join(dir, 'gatehouse.json5'),
    env: { GATEHOUSE_SECRET_KEY: key },
    webhookUrl: `http://127.0.0.1:${webhookPort}`,
  };
}

/** Removes the workspace's temp dir (after its processes have stopped). */
export function removeWorkspace(ws: Workspace | undefined): void {
  if (ws) rmSync(ws.dir, { recursive: true, force: true });
}

/**
 * The workspace's config: its SQLite file, a loopback gateway with API_KEY (or `auth`'s settings
 * instead, and `rateLimits`), the receiver with a `message` target, and `channels`.
 */
export function writeConfig(
  ws: Workspace,
  options: {
    channels: Record<string, unknown>;
    targetUrl: string;
    upstreamUrl: string;
    failuresMax?: number;
    auth?: Record<string, unknown>;
    rateLimits?: unknown[];
    admin?: Record<string, unknown>;
  },
): void {
  writeFileSync(
    ws.config,
    JSON.stringify(
      {
        storage: { path: ws.db },
        log: { level: 'info' },
        gateway: {
          listen: { host: '127.0.0.1', port: 0 },
          upstream: { target: options.upstreamUrl },
          auth: {
            ...(options.auth ?? { apiKey: API_KEY }),
            failures: { max: options.failuresMax ?? 10, windowSeconds: 60, lockoutSeconds: 60 },
          },
          rateLimits: options.rateLimits ?? [],
        },
        ...(options.admin ? { admin: options.admin } : {}),
        webhooks: {
          enabled: true,
          listen: { host: '127.0.0.1', port: ws.webhookPort },
          targets: { message: { url: `${options.targetUrl}/messages` } },
          delivery: { initialBackoffMs: 50, maxBackoffMs: 200, timeoutMs: 2_000 },
        },
        channels: options.channels,
      },
      null,
      2,
    ),
  );
}

export interface RunningGatehouse {
  process: ServerProcess;
  gatewayUrl: string;
  webhookUrl: string;
  stop(): Promise<void>;
}

/** `gatehouse start` for the workspace, once both listeners are up. */
export async function startGatehouse(ws: Workspace, env: NodeJS.ProcessEnv = ws.env): Promise<RunningGatehouse> {
  const server = startServerProcess(ws.config, { env });
  try {
    const [gateway, webhooks] = await Promise.all([
      server.waitFor((l) => l.msg === 'gateway listening'),
      server.waitFor((l) => l.msg === 'webhook receiver listening'),
    ]);
    return {
      process: server,
      gatewayUrl: gateway.url,
      webhookUrl: webhooks.url,
      stop: async () => void (await server.stop()),
    };
  } catch (err) {
    await server.stop('SIGKILL');
    throw err;
  }
}

/** `gatehouse channels <args> --config <ws>` to completion. */
export function channelsCli(ws: Workspace, args: string[], env: NodeJS.ProcessEnv = ws.env): Promise<CliResult> {
  return runCli(['channels', ...args, '--config', ws.config], { env });
}

/** `channels status [name] --json`, parsed. */
export async function statusJson(ws: Workspace, name?: string): Promise<Record<string, any>[]> {
  const run = await channelsCli(ws, ['status', ...(name ? [name] : []), '--json']);
  assert.equal(run.code, 0, run.stderr);
  // The CLI prints times as ISO 8601; the tests compare them as epoch ms.
  return JSON.parse(run.stdout, (key, value: unknown) => {
    if (!/At$/.test(key) || value === null) return value;
    assert.equal(typeof value, 'string', `${key} is an ISO 8601 string`);
    return Date.parse(value as string);
  });
}

export interface RunningLogin {
  /** stdout and stderr so far. */
  output(): string;
  /** Resolves with the first match of `pattern` in the output (waits for it). */
  waitForOutput(pattern: RegExp, timeoutMs?: number): Promise<RegExpExecArray>;
  /** The process's end: exit code and everything it printed. */
  exited: Promise<CliResult>;
  /** Still running? */
  running(): boolean;
  kill(): Promise<CliResult>;
}

/** `gatehouse channels login <name> --no-browser` as a child process the test can follow while it waits. */
export function startLogin(
  ws: Workspace,
  name: string,
  options: { env?: NodeJS.ProcessEnv; args?: string[] } = {},
): RunningLogin {
  const child = spawnCli(['channels', 'login', name, '--no-browser', '--config', ws.config, ...(options.args ?? [])], {
    env: options.env ?? ws.env,
  });
  const result: CliResult = { code: null, stdout: '', stderr: '' };
  let watchers: (() => void)[] = [];
  const changed = () => {
    const current = watchers;
    watchers = [];
    for (const w of current) w();
  };
  child.stdout!.on('data', (d) => {
    result.stdout += d;
    changed();
  });
  child.stderr!.on('data', (d) => {
    result.stderr += d;
    changed();
  });
  const killer = setTimeout(() => child.kill('SIGKILL'), 30_000);
  let done = false;
  const exited = once(child, 'exit').then(([code]) => {
    clearTimeout(killer);
    done = true;
    result.code = code as number | null;
    changed();
    return result;
  });
  const output = () => result.stdout + result.stderr;
  return {
    output,
    exited,
    running: () => !done,
    waitForOutput(pattern, timeoutMs = 15_000) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new Error(`login never printed ${pattern}; output:\n${output()}`)),
          timeoutMs,
        );
        const look = () => {
          const found = pattern.exec(output());
          if (found) {
            clearTimeout(timer);
            resolve(found);
          } else if (done) {
            clearTimeout(timer);
            reject(new Error(`login exited (${result.code}) without printing ${pattern}; output:\n${output()}`));
          } else watchers.push(look);
        };
        look();
      });
    },
    async kill() {
      if (!done) child.kill('SIGTERM');
      return exited;
    },
  };
}

/** Every byte storage holds on disk: the database file and its WAL. */
export function storageBytes(ws: Workspace): Buffer {
  return Buffer.concat([ws.db, `${ws.db}-wal`, `${ws.db}-journal`].filter(existsSync).map((f) => readFileSync(f)));
}

/** Asserts that `secret` is nowhere in storage's bytes (as is, nor base64 or base64url encoded). */
export function assertNotInStorage(ws: Workspace, secret: string, what: string): void {
  assert.ok(secret.length >= 16, `${what}: too short to search for (${secret.length} characters)`);
  const bytes = storageBytes(ws);
  assert.ok(bytes.length > 0, 'storage is empty: nothing was stored');
  for (const form of [secret, Buffer.from(secret).toString('base64'), Buffer.from(secret).toString('base64url')]) {
    assert.equal(bytes.includes(Buffer.from(form, 'utf8')), false, `${what} is in the SQLite files in clear`);
  }
}

/** Opens the workspace's database for `use` (a separate connection, as an operator's sqlite3 would be). */
export function withDatabase<T>(ws: Workspace, use: (db: Database.Database) => T): T {
  const db = new Database(ws.db, { fileMustExist: true });
  try {
    db.pragma('busy_timeout = 5000');
    return use(db);
  } finally {
    db.close();
  }
}

/** The envelopes the `message` target received, parsed. */
export function envelopes(target: RecordingServer): Record<string, any>[] {
  return target.received.filter((r: ReceivedRequest) => r.url === '/messages').map((r) => JSON.parse(r.body));
}

/** Waits for the `message` target's n-th envelope (1-based) and returns it. */
export async function nthEnvelope(target: RecordingServer, n: number): Promise<Record<string, any>> {
  return waitFor(() => envelopes(target)[n - 1], { what: `envelope #${n} at the target` });
}

/**
 * The `message` target's envelope count once nothing is left to deliver: storage holds no queued
 * event (`queued` counts them; sqliteQueued for a workspace's file). An event is stored before the
 * request that brought it is answered and is queued until its delivery is settled, which is after
 * the target got it: so anything wrongly accepted by the requests answered so far is counted.
 */
export async function settledEnvelopeCount(
  target: RecordingServer,
  queued: () => number | Promise<number>,
): Promise<number> {
  let left: number | undefined;
  await waitFor(async () => (left = await queued()) === 0, { what: () => `no queued event in storage (${left} left)` });
  return envelopes(target).length;
}

/** Events the workspace's SQLite file holds as queued (not yet delivered, nor dead). */
export function sqliteQueued(ws: Workspace): () => number {
  return () =>
    withDatabase(
      ws,
      (db) => (db.prepare("SELECT count(*) AS n FROM events WHERE status = 'queued'").get() as { n: number }).n,
    );
}

// ─── The terminal QR code ───────────────────────────────────────────────────────────────────

type JsQr = (
  data: Uint8ClampedArray,
  width: number,
  height: number,
  options?: { inversionAttempts?: 'dontInvert' | 'attemptBoth' },
) => { data: string } | null;

const HALF_BLOCKS: Record<string, [boolean, boolean]> = {
  ' ': [false, false],
  '▀': [true, false],
  '▄': [false, true],
  '█': [true, true],
};

/**
 * Reads back a QR code printed with half blocks (two module rows per text line, dark = block):
 * the module matrix is rebuilt from the characters, drawn as an RGBA image and decoded with jsQR.
 * Returns the text it encodes, or undefined when `printed` holds no readable QR code.
 */
export function decodeTerminalQr(printed: string): string | undefined {
  const lines = printed
    .split('\n')
    .filter((l) => l.length > 0 && [...l].every((c) => c in HALF_BLOCKS) && /[▀▄█]/.test(l));
  if (lines.length === 0) return undefined;
  const rows: boolean[][] = [];
  for (const line of lines) {
    const cells = [...line].map((c) => HALF_BLOCKS[c]!);
    rows.push(
      cells.map((c) => c[0]),
      cells.map((c) => c[1]),
    );
  }
  const width = Math.max(...rows.map((r) => r.length));
  const scale = 4;
  const quiet = 4; // modules of light border around what was printed
  const side = { w: (width + 2 * quiet) * scale, h: (rows.length + 2 * quiet) * scale };
  const rgba = new Uint8ClampedArray(side.w * side.h * 4).fill(255);
  rows.forEach((row, y) =>
    row.forEach((dark, x) => {
      if (!dark) return;
      for (let dy = 0; dy < scale; dy++) {
        for (let dx = 0; dx < scale; dx++) {
          const at = (((y + quiet) * scale + dy) * side.w + (x + quiet) * scale + dx) * 4;
          rgba[at] = rgba[at + 1] = rgba[at + 2] = 0;
        }
      }
    }),
  );
  // jsqr is CommonJS with `export default` in its types: under NodeNext the callable is `.default`
  // for TypeScript; at run time both are the function.
  const decode: JsQr = (jsQR as unknown as { default?: JsQr }).default ?? (jsQR as unknown as JsQr);
  return decode(rgba, side.w, side.h, { inversionAttempts: 'dontInvert' })?.data;
}

// ─── OAuth logins ────────────────────────────────────────────────────────────────────────────

/** The OAuth authorize URL a login printed ("Open this URL in a browser and approve"). */
export async function printedAuthorizeUrl(login: RunningLogin): Promise<URL> {
  const found = await login.waitForOutput(/approve:\s+(http:\/\/\S+)/);
  return new URL(found[1]!);
}

/** The browser's consent: GET the authorize URL (the fake answers a 302) and return where it sends the user. */
export async function consent(authorizeUrl: URL): Promise<URL> {
  const res = await fetch(authorizeUrl, { redirect: 'manual' });
  assert.equal(res.status, 302, `the consent page answered ${res.status}: ${await res.text()}`);
  return new URL(res.headers.get('location')!);
}

/** The browser arriving back at the CLI's loopback listener. */
export async function visit(url: URL | string): Promise<{ status: number; page: string }> {
  const res = await fetch(url);
  return { status: res.status, page: await res.text() };
}

/**
 * `channels login <name>` with the test as the browser: `browse` gets the printed authorize URL
 * (default: consent, then back to the loopback listener). Resolves when the login has exited.
 */
export async function loginThroughBrowser(
  ws: Workspace,
  name: string,
  browse: (authorizeUrl: URL, login: RunningLogin) => Promise<void> = async (url) =>
    void (await visit(await consent(url))),
): Promise<CliResult & { authorizeUrl: URL }> {
  const login = startLogin(ws, name);
  let authorizeUrl: URL;
  try {
    authorizeUrl = await printedAuthorizeUrl(login);
    await browse(authorizeUrl, login);
  } catch (err) {
    await login.kill();
    throw err;
  }
  return { ...(await login.exited), authorizeUrl };
}

/** The channel's row in channel_grants (public columns), or undefined: a quicker look than `channels status`. */
export function storedGrant(
  ws: Workspace,
  name: string,
): { name: string; expires_at: number | null; last_error: string | null } | undefined {
  if (!existsSync(ws.db)) return undefined;
  return withDatabase(ws, (db) => {
    const table = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'channel_grants'").get();
    return table
      ? (db.prepare('SELECT name, expires_at, last_error FROM channel_grants WHERE name = ?').get(name) as any)
      : undefined;
  });
}

// ─── The platform contract ───────────────────────────────────────────────────────────────────

/**
 * Asserts that every call a fake recorded reached a route the platform documents and broke none
 * of its reference's rules (fake-chat.ts notes each with its source). A platform's refusal for
 * other reasons (an unknown token, a spent code) is not a violation: the call itself was right.
 */
export function assertCallsDocumented(fake: FakeChatServer): void {
  const broken = fake.calls.filter((c) => !c.route || c.violations.length > 0);
  assert.deepEqual(
    broken.map(
      (c) =>
        `${c.method} ${c.path.replace(/\/bot[^/]+\//, '/bot<token>/')} → ${c.status} (${c.route?.source ?? 'no documented route'})\n  ${c.violations.join('\n  ')}`,
    ),
    [],
  );
  assert.ok(fake.calls.length > 0, 'no call was recorded');
}
