import assert from 'node:assert/strict';
import { appendFileSync, existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { hasValidKeyChecksum, hashApiKey } from '../../src/gateway/credentials/api-key.js';
import { request } from '../helpers/http.js';
import { ROOT, runCli, startServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-cli-'));
function writeConfig(name: string, text: string): string {
  const file = path.join(dir, name);
  writeFileSync(file, text);
  return file;
}

describe('gatehouse config check', () => {
  it('the shipped gateway.json5 is valid: exit 0, the summary line, then one line each for routes, rules, rate limits, cors, admin', async () => {
    const result = await runCli(['config', 'check', '--config', path.join(ROOT, 'gateway.json5')]);
    assert.equal(result.code, 0, result.stderr);
    const lines = result.stdout.trim().split('\n');
    assert.match(lines[0]!, /^ok: .*gateway 127\.0\.0\.1:8080 -> http:\/\/127\.0\.0\.1:3000/);
    assert.deepEqual(
      lines.slice(1).map((line) => line.slice(0, line.indexOf(':'))),
      ['  routes', '  rules', '  rate limits', '  cors', '  admin'],
    );
  });

  it('examples/providers.json5 (one endpoint per verify type) is valid', async () => {
    const result = await runCli(['config', 'check', '--config', path.join(ROOT, 'examples/providers.json5')]);
    assert.equal(result.code, 0, result.stderr);
    assert.match(result.stdout, /webhooks on 127\.0\.0\.1:9081 \(9 endpoint\(s\)\)/);
  });

  it('a JWKS without audience: exit 0, with a warning naming the key (any client of the provider would pass)', async () => {
    const file = writeConfig(
      'jwks-no-audience.json5',
      `{ gateway: { upstream: { target: "http://127.0.0.1:3000" },
      auth: { bearer: { jwt: { jwksUri: "https://idp.example/.well-known/jwks.json", issuer: "https://idp.example/" } } } } }`,
    );
    const result = await runCli(['config', 'check', '--config', file]);
    assert.equal(result.code, 0, result.stderr);
    assert.match(result.stderr, /^warning: gateway\.auth\.bearer\.jwt\.audience: not set/m);
    const withAudience = writeConfig(
      'jwks-audience.json5',
      `{ gateway: { upstream: { target: "http://127.0.0.1:3000" },
      auth: { bearer: { jwt: { jwksUri: "https://idp.example/.well-known/jwks.json", audience: "orders-api" } } } } }`,
    );
    const quiet = await runCli(['config', 'check', '--config', withAudience]);
    assert.equal(quiet.code, 0, quiet.stderr);
    assert.doesNotMatch(quiet.stderr, /warning/);
  });

  it('a bad config: exit 1 and every problem listed with its path', async () => {
    const file = writeConfig(
      'bad.json5',
      `{
      // comments are fine in JSON5
      gateway: {
        upstream: { target: "/relative" },
        auth: {
          apiKey: "short",
          allowedIPs: ["127.0.0.1", "::1", "10.0.0.0/33"],
          apiKeys: [{ id: "a", hash: "sha256:${'0'.repeat(64)}" }, { id: "a", hash: "sha256:${'1'.repeat(64)}" }],
          bogus: true,
        },
      },
    }`,
    );
    const result = await runCli(['config', 'check', '--config', file]);
    assert.equal(result.code, 1);
    assert.equal(result.stdout, '');
    for (const expected of [
      'gateway.auth.allowedIPs[2]: invalid CIDR "10.0.0.0/33"',
      'gateway.upstream.target:',
      'gateway.auth.apiKey:',
      'gateway.auth.apiKeys[1].id: duplicate key id "a"',
      'gateway.auth.bogus: unknown key',
    ])
      assert.ok(result.stderr.includes(expected), `missing "${expected}" in:\n${result.stderr}`);
  });

  it('a missing environment variable is named', async () => {
    const file = writeConfig(
      'env.json5',
      '{ gateway: { upstream: { target: "http://127.0.0.1:1" }, auth: { apiKey: "${GATEHOUSE_TEST_UNSET_VAR}" } } }',
    );
    const result = await runCli(['config', 'check', '--config', file], {
      env: { GATEHOUSE_TEST_UNSET_VAR: undefined },
    });
    assert.equal(result.code, 1);
    assert.match(result.stderr, /gateway\.auth\.apiKey: environment variable GATEHOUSE_TEST_UNSET_VAR is not set/);
  });
});

describe('gatehouse start', () => {
  let upstream: RecordingServer;
  before(async () => {
    upstream = await startRecordingUpstream();
  });
  after(async () => {
    await upstream.close();
  });

  it('refuses an open gateway on a non-loopback address: exit 1, nothing listens', async () => {
    const file = writeConfig(
      'open.json5',
      `{ gateway: { listen: { host: "0.0.0.0", port: 0 }, upstream: { target: "${upstream.url}" }, auth: { enabled: false } } }`,
    );
    const result = await runCli(['start', '--config', file]);
    assert.equal(result.code, 1);
    assert.match(result.stderr, /gateway\.auth: auth is disabled while listening on non-loopback 0\.0\.0\.0/);
    assert.doesNotMatch(result.stdout, /listening/);
  });

  it('a webhook port already in use: exit 1 with the reason, and the process does not hang', async () => {
    const file = writeConfig(
      'port-taken.json5',
      `{ storage: { path: "${path.join(dir, 'taken.db')}" }, gateway: { listen: { port: 0 }, upstream: { target: "${upstream.url}" }, auth: { apiKey: "port-taken-key-0123456789abcdefghijklmnop" } },
      webhooks: { enabled: true, listen: { port: ${upstream.port} }, endpoints: [{ path: "/webhook/x", secret: "port-taken-secret-0123", action: "message" }], targets: { message: { url: "${upstream.url}" } } } }`,
    );
    const result = await runCli(['start', '--config', file], { timeoutMs: 15_000 });
    assert.equal(result.code, 1, 'killed by the timeout means it hung');
    // One line naming the listener and the address: no stack, no errno code.
    assert.equal(result.stderr, `gatehouse: webhooks.listen 127.0.0.1:${upstream.port} is already in use\n`);
    assert.doesNotMatch(result.stdout, /gatehouse started/);
  });

  it('a gateway port already in use: the same one line, naming gateway.listen', async () => {
    const file = writeConfig(
      'gateway-port-taken.json5',
      `{ gateway: { listen: { port: ${upstream.port} }, upstream: { target: "${upstream.url}" }, auth: { apiKey: "port-taken-key-0123456789abcdefghijklmnop" } } }`,
    );
    const result = await runCli(['start', '--config', file], { timeoutMs: 15_000 });
    assert.equal(result.code, 1, 'killed by the timeout means it hung');
    assert.equal(result.stderr, `gatehouse: gateway.listen 127.0.0.1:${upstream.port} is already in use\n`);
  });

  it("a second server on the same SQLite file: exit 1 naming the running one's pid; the CLI beside it still works", async () => {
    const db = path.join(dir, 'single-writer.db');
    const configOn = (name: string) =>
      writeConfig(
        name,
        `{ storage: { path: "${db}" }, gateway: { listen: { port: 0 }, upstream: { target: "${upstream.url}" }, auth: { apiKey: "single-writer-key-0123456789abcdefghijklmnop" } },
      webhooks: { enabled: true, listen: { port: 0 }, endpoints: [{ path: "/webhook/x", secret: "single-writer-secret-0123", action: "message" }], targets: { message: { url: "${upstream.url}" } } } }`,
      );
    const first = startServerProcess(configOn('single-writer-a.json5'));
    try {
      await first.waitFor((l) => l.msg === 'webhook receiver listening');
      const second = await runCli(['start', '--config', configOn('single-writer-b.json5')], { timeoutMs: 15_000 });
      assert.equal(second.code, 1, second.stderr);
      assert.match(second.stderr, new RegExp(`in use by another gatehouse server \\(pid ${first.child.pid}\\)`));
      // Found by a newcomer: the refused server had logged "gateway listening" first.
      assert.doesNotMatch(second.stdout, /listening/, 'refused before anything listens');
      const list = await runCli(['webhooks', 'deliveries', 'list', '--config', configOn('single-writer-cli.json5')]);
      assert.equal(list.code, 0, list.stderr);
      assert.match(list.stdout, /no events/);
    } finally {
      assert.equal(await first.stop(), 0);
    }
  });

  it('SIGHUP swaps in a new valid config (key rotation) and keeps the old one when the new is invalid', async () => {
    const oldKey = 'old-key-0123456789abcdefghijklmnopqrstuv';
    const newKey = 'new-key-0123456789abcdefghijklmnopqrstuv';
    const configFor = (hash: string) =>
      `{ gateway: { listen: { port: 0 }, upstream: { target: "${upstream.url}" }, auth: { apiKeys: [{ id: "k", hash: "${hash}" }] } } }`;
    const file = writeConfig('reload.json5', configFor(hashApiKey(oldKey)));
    const server = startServerProcess(file);
    try {
      const { url } = await server.waitFor((l) => l.msg === 'gateway listening');
      assert.equal((await request(url, '/api/s', { headers: { 'x-api-key': oldKey } })).status, 200);

      writeFileSync(file, configFor(hashApiKey(newKey)));
      server.child.kill('SIGHUP');
      await server.waitFor((l) => l.msg === 'configuration reloaded');
      assert.equal((await request(url, '/api/s', { headers: { 'x-api-key': oldKey } })).status, 401);
      assert.equal((await request(url, '/api/s', { headers: { 'x-api-key': newKey } })).status, 200);

      writeFileSync(file, '{ gateway: { upstream: { target: "nope" } } }');
      server.child.kill('SIGHUP');
      const rejected = await server.waitFor((l) => l.msg?.startsWith('reload rejected'));
      assert.ok(rejected.problems.some((p: string) => p.startsWith('gateway.upstream.target')));
      assert.equal((await request(url, '/api/s', { headers: { 'x-api-key': newKey } })).status, 200);
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });

  it('a change to the config file is picked up without a signal (polled once a second)', async () => {
    const key = (n: number) => `watch-key-${n}-0123456789abcdefghijklmnopqrstuv`;
    const configFor = (n: number) =>
      `{ gateway: { listen: { port: 0 }, upstream: { target: "${upstream.url}" }, auth: { apiKey: "${key(n)}" } } }`;
    const watched = writeConfig('watched.json5', configFor(1));
    const server = startServerProcess(watched);
    try {
      const { url } = await server.waitFor((l) => l.msg === 'gateway listening');
      writeFileSync(watched, configFor(2) + '\n');
      await server.waitFor((l) => l.msg === 'configuration reloaded', 10_000);
      assert.equal((await request(url, '/api/s', { headers: { 'x-api-key': key(2) } })).status, 200);
      assert.equal((await request(url, '/api/s', { headers: { 'x-api-key': key(1) } })).status, 401);
    } finally {
      await server.stop();
    }
  });

  it('a config file written in steps is reloaded once it holds still, never half-written (a poll between the steps rejected a reload)', async () => {
    const key = (n: number) => `steps-key-${n}-0123456789abcdefghijklmnopqrstuv`;
    const configFor = (n: number) =>
      `{ gateway: { listen: { port: 0 }, upstream: { target: "${upstream.url}" }, auth: { apiKey: "${key(n)}" } } }\n`;
    const watched = writeConfig('steps.json5', configFor(1));
    const server = startServerProcess(watched);
    try {
      const { url } = await server.waitFor((l) => l.msg === 'gateway listening');
      // Emptied, then written a few bytes every 50 ms for about 2 s: every poll (once a second) sees it half-written.
      const text = configFor(2);
      writeFileSync(watched, '');
      const step = Math.ceil(text.length / 40);
      for (let at = 0; at < text.length; at += step) {
        await new Promise((r) => setTimeout(r, 50));
        appendFileSync(watched, text.slice(at, at + step));
      }
      await server.waitFor((l) => l.msg === 'configuration reloaded', 10_000);
      assert.equal((await request(url, '/api/s', { headers: { 'x-api-key': key(2) } })).status, 200);
      assert.deepEqual(
        server.lines.filter((l) => l.msg?.startsWith('reload rejected')),
        [],
        'no reload read the file half-written',
      );
    } finally {
      await server.stop();
    }
  });

  it('SIGHUP does not drop a request in flight', async () => {
    const slow = await startRecordingUpstream((_req, res) => setTimeout(() => res.end('slow-done'), 800));
    const key = 'flight-key-0123456789abcdefghijklmnopqrstuv';
    const file = writeConfig(
      'flight.json5',
      `{ gateway: { listen: { port: 0 }, upstream: { target: "${slow.url}" }, auth: { apiKey: "${key}" } } }`,
    );
    const server = startServerProcess(file);
    try {
      const { url } = await server.waitFor((l) => l.msg === 'gateway listening');
      const inFlight = request(url, '/api/slow', { headers: { 'x-api-key': key } });
      await waitFor(() => slow.received.length === 1, { what: 'the request at the upstream' });
      server.child.kill('SIGHUP');
      await server.waitFor((l) => l.msg === 'configuration reloaded');
      const reply = await inFlight;
      assert.equal(reply.status, 200);
      assert.equal(reply.body, 'slow-done');
    } finally {
      await server.stop();
      await slow.close();
    }
  });
});

describe('gatehouse webhooks deliveries', () => {
  it('a storage.path with no store behind it is an error (exit 1), not a new empty database', async () => {
    const missing = path.join(dir, 'no-such-folder', 'gatehouse.db');
    const file = writeConfig(
      'nostore.json5',
      `{ storage: { path: ${JSON.stringify(missing)} }, gateway: { upstream: { target: "http://127.0.0.1:1" } } }`,
    );
    const result = await runCli(['webhooks', 'deliveries', 'list', '--config', file]);
    assert.equal(result.code, 1);
    assert.match(result.stderr, /storage\.path/);
    assert.equal(existsSync(path.dirname(missing)), false);
  });
});

describe('gatehouse gateway api-key generate', () => {
  it('--json: a well-formed key, its hash and expiry; the entry works as config', async () => {
    const result = await runCli(['gateway', 'api-key', 'generate', '--id', 'ci', '--expires', '90d', '--json']);
    assert.equal(result.code, 0, result.stderr);
    const { key, entry } = JSON.parse(result.stdout);
    assert.match(key, /^gth_[0-9A-Za-z]{38}$/);
    assert.ok(hasValidKeyChecksum(key));
    assert.equal(entry.id, 'ci');
    assert.equal(entry.hash, hashApiKey(key));
    const days = (Date.parse(entry.expiresAt) - Date.now()) / 86_400_000;
    assert.ok(days > 89.9 && days <= 90, `expires in ${days} days`);
  });

  it('plain output prints the key once and a config snippet', async () => {
    const result = await runCli(['gateway', 'api-key', 'generate']);
    assert.equal(result.code, 0);
    const key = /gth_[0-9A-Za-z]{38}/.exec(result.stdout)![0];
    assert.equal(result.stdout.split(key).length - 1, 1);
    assert.ok(result.stdout.includes(`hash: "${hashApiKey(key)}"`));
  });

  it('a bad --expires is a usage error (exit 1)', async () => {
    const result = await runCli(['gateway', 'api-key', 'generate', '--expires', 'soon']);
    assert.equal(result.code, 1);
    assert.match(result.stderr, /--expires/);
  });
});
