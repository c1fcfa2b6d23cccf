import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { request } from '../helpers/http.js';
import { ROOT, startServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

const run = promisify(execFile);

/** Registers the module recorder (test/fixtures/loaded-modules): what a process loaded goes to `file`. */
const RECORDER = path.join(ROOT, 'test/fixtures/loaded-modules/record.mjs');
const recorderEnv = (file: string) => ({
  NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import ${RECORDER}`.trim(),
  GATEHOUSE_RECORD_MODULES: file,
});

/** The libraries only Gmail and channel logins use, with what they alone pull in. */
const HEAVY = ['@googleapis/gmail', 'google-auth-library', 'googleapis-common', 'gaxios', 'gtoken', 'qrcode', 'pngjs'];

/** What observability.tracing loads (src/observability/otel.ts), and only then. */
const TRACING_SDK = [
  '@opentelemetry/sdk-trace-base',
  '@opentelemetry/sdk-trace',
  '@opentelemetry/exporter-trace-otlp-http',
  '@opentelemetry/otlp-transformer',
  '@opentelemetry/resources',
  '@opentelemetry/core',
];

/** The packages under node_modules that a recorded process loaded. */
function loadedPackages(file: string): Set<string> {
  const packages = new Set<string>();
  for (const url of readFileSync(file, 'utf8').split('\n')) {
    const name = /\/node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(url)?.[1];
    if (name) packages.add(name);
  }
  return packages;
}

/**
 * An `--omit=dev` install loaded the Gmail client, google-auth-library and the QR code library at
 * every start, Gmail and channels configured or not (issue 28): they are imported where they are
 * first needed (src/integrations/gmail/google.ts, channels/login.ts). Checked on a real start, every
 * module it loaded recorded by a loader hook, ESM and CommonJS both.
 */
describe('a start without Gmail or channels does not load their libraries', () => {
  let dir: string;
  let upstream: RecordingServer;

  before(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-lazy-'));
    upstream = await startRecordingUpstream();
  });

  after(async () => {
    await upstream?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('gatehouse start serves /api/ and a webhook; none of @googleapis/gmail, google-auth-library, qrcode (nor their dependencies) was loaded', async () => {
    const record = path.join(dir, 'start.modules');
    const config = path.join(dir, 'gateway.json5');
    writeFileSync(
      config,
      `{
  storage: { path: ${JSON.stringify(path.join(dir, 'gatehouse.db'))} },
  gateway: { listen: { host: "127.0.0.1", port: 0 }, upstream: { target: "${upstream.url}" }, auth: { apiKey: "lazy-libraries-key-0123456789abcdefghij" } },
  webhooks: {
    enabled: true,
    listen: { host: "127.0.0.1", port: 0 },
    endpoints: [{ path: "/webhook/x", secret: "lazy-hook-secret-0123456789", action: "system-event" }],
    targets: { "system-event": { url: "${upstream.url}/events" } },
  },
}
`,
    );
    const server = startServerProcess(config, { env: recorderEnv(record) });
    try {
      const api = (await server.waitFor((l) => l.msg === 'gateway listening')).url;
      const hooks = (await server.waitFor((l) => l.msg === 'webhook receiver listening')).url;
      await server.waitFor((l) => typeof l.msg === 'string' && l.msg.startsWith('gatehouse started'));
      const served = await request(api, '/api/orders', {
        headers: { 'x-api-key': 'lazy-libraries-key-0123456789abcdefghij' },
      });
      assert.equal(served.status, 200, served.body);
      const accepted = await request(hooks, '/webhook/x', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-webhook-secret': 'lazy-hook-secret-0123456789' },
        body: '{"n":1}',
      });
      assert.equal(accepted.status, 202, accepted.body);
      await waitFor(() => upstream.received.some((r) => r.url === '/events'), {
        timeoutMs: 30_000,
        what: 'the webhook delivered to the target',
      });
    } finally {
      assert.equal(await server.stop(), 0, 'a clean exit: the recorder writes the CommonJS cache at exit');
    }
    const loaded = loadedPackages(record);
    // The recorder sees what the server did load: an ESM import of a CommonJS package (express),
    // and a package only CommonJS requires (body-parser, required by express).
    for (const used of ['express', 'body-parser', 'better-sqlite3', 'pino'])
      assert.ok(loaded.has(used), `${used} is recorded as loaded (the recorder works)`);
    assert.deepEqual(
      HEAVY.filter((name) => loaded.has(name)),
      [],
      'none of the Gmail and QR code libraries was loaded',
    );
    // Tracing's SDK too, without observability.tracing (prom-client itself may load @opentelemetry/api).
    assert.deepEqual(
      TRACING_SDK.filter((name) => loaded.has(name)),
      [],
      'no OpenTelemetry SDK package was loaded',
    );
  });

  it('the same recorder sees them loaded once a Gmail client or a QR code is made (the check above could fail)', async () => {
    const record = path.join(dir, 'used.modules');
    const script = `
      const google = await import(${JSON.stringify(path.join(ROOT, 'src/integrations/gmail/google.ts'))});
      const login = await import(${JSON.stringify(path.join(ROOT, 'src/integrations/channels/login.ts'))});
      const endpoints = google.googleEndpoints();
      const auth = await google.createOAuthClient(endpoints, { clientId: 'id', clientSecret: 'secret' });
      await google.createGmailClient(endpoints, auth);
      await login.renderQr('https://example.test/pair');
    `;
    await run(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: ROOT,
      env: { ...process.env, ...recorderEnv(record) },
      timeout: 120_000,
    });
    const loaded = loadedPackages(record);
    for (const name of ['@googleapis/gmail', 'google-auth-library', 'gaxios', 'qrcode'])
      assert.ok(loaded.has(name), `${name} is recorded once used`);
  });
});
