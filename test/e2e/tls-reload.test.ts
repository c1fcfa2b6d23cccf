import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import pino from 'pino';
import { UsageError } from '../../src/errors.js';
import { parseConfig } from '../../src/config/load.js';
import { MemoryLockoutStore } from '../../src/http/lockout.js';
import { listen } from '../../src/http/listener.js';
import { readTlsPem } from '../../src/http/tls.js';
import { startGateway } from '../../src/runtime/server.js';
import { request } from '../helpers/http.js';
import { startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// gateway.tls is read again at every reload: a certificate renewed in place is served without a restart.

const fixtures = fileURLToPath(new URL('../fixtures/tls/', import.meta.url));
const FIRST = { cert: `${fixtures}cert.pem`, key: `${fixtures}key.pem` };
const RENEWED = { cert: `${fixtures}renewed-cert.pem`, key: `${fixtures}renewed-key.pem` };
const fingerprintOf = (file: string) => new X509Certificate(readFileSync(file)).fingerprint256;
const notAfterOf = (file: string) => Date.parse(new X509Certificate(readFileSync(file)).validTo);
const KEY = 'tls-reload-key-0123456789abcdefghijklmnopqrs';
const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-tls-reload-'));
after(() => rmSync(dir, { recursive: true, force: true }));

let upstream: RecordingServer;
before(async () => {
  upstream = await startRecordingUpstream();
});
after(() => upstream.close());

/** Puts a pair at the paths the config names (as a renewal does: same names, new contents). */
function install(
  pair: { cert: string; key: string },
  at = { cert: path.join(dir, 'cert.pem'), key: path.join(dir, 'key.pem') },
) {
  copyFileSync(pair.cert, at.cert);
  copyFileSync(pair.key, at.key);
  return at;
}

function writeConfig(name: string, files: { cert: string; key: string }, workers = 1): string {
  const file = path.join(dir, name);
  writeFileSync(
    file,
    JSON.stringify({
      gateway: { listen: { port: 0 }, workers, tls: files, upstream: { target: upstream.url }, auth: { apiKey: KEY } },
      webhooks: { enabled: false },
      admin: { listen: { port: 0 } },
    }),
  );
  return file;
}

/** A TLS connection that trusts both pairs; its socket stays open for requests until ended. */
async function connect(url: string): Promise<tls.TLSSocket> {
  const { hostname, port } = new URL(url);
  const socket = tls.connect({
    host: hostname,
    port: Number(port),
    ca: [readFileSync(FIRST.cert), readFileSync(RENEWED.cert)],
    servername: 'localhost',
  });
  await new Promise<void>((resolve, reject) => socket.once('secureConnect', resolve).once('error', reject));
  return socket;
}

/** One keep-alive request on an open TLS connection: the status line. */
async function statusOn(socket: tls.TLSSocket, target: string): Promise<string> {
  socket.write(`GET ${target} HTTP/1.1\r\nHost: localhost\r\nX-API-Key: ${KEY}\r\n\r\n`);
  const head = await new Promise<string>((resolve, reject) => {
    let text = '';
    const onData = (d: Buffer) => {
      text += d.toString('latin1');
      if (/\r\n\r\n/.test(text)) {
        socket.off('data', onData);
        resolve(text);
      }
    };
    socket.on('data', onData).once('error', reject);
  });
  return head.slice(0, head.indexOf('\r\n'));
}

/** The fingerprint a new connection is served (and that the connection answers a request). */
async function servedFingerprint(url: string): Promise<string> {
  const socket = await connect(url);
  try {
    assert.equal(await statusOn(socket, '/api/served'), 'HTTP/1.1 200 OK');
    return socket.getPeerCertificate().fingerprint256;
  } finally {
    socket.destroy();
  }
}

/** gatehouse_tls_certificate_expires_in_seconds{listener="gateway"} from a scrape. */
async function expiresIn(adminUrl: string): Promise<number | undefined> {
  const text = (await request(adminUrl, '/metrics')).body;
  const line = text
    .split('\n')
    .find((l) => l.startsWith('gatehouse_tls_certificate_expires_in_seconds{listener="gateway"}'));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
}

function assertExpiresAt(seconds: number | undefined, certFile: string) {
  assert.ok(seconds !== undefined, 'the gauge is there');
  const expected = (notAfterOf(certFile) - Date.now()) / 1000;
  assert.ok(Math.abs(seconds - expected) < 120, `expires in ${seconds} s, expected about ${expected} s (${certFile})`);
}

const reloads = (
  server: ServerProcess,
  outcome: 'configuration reloaded' | 'reload rejected: the previous configuration stays in force',
) => server.lines.filter((l) => l.msg === outcome).length;

async function start(file: string): Promise<{ server: ServerProcess; url: string; adminUrl: string }> {
  const server = startServerProcess(file, {
    command: ['start', '--no-watch'],
    env: { NODE_CLUSTER_SCHED_POLICY: 'rr' },
  });
  const listening = await server.waitFor((l) => l.msg === 'gateway listening' || l.msg === 'gateway workers listening');
  const admin = await server.waitFor((l) => l.msg === 'admin listener on /metrics, /readyz, /healthz');
  return { server, url: listening.url, adminUrl: admin.url };
}

describe('gateway.tls: a reload serves a renewed certificate', () => {
  it('SIGHUP after a renewal in place: new connections get the new pair, open ones keep theirs; a half-written renewal is refused; new paths apply', async () => {
    const { server, url, adminUrl } = await start(writeConfig('one.json5', install(FIRST)));
    try {
      assert.equal(await servedFingerprint(url), fingerprintOf(FIRST.cert));
      assertExpiresAt(await expiresIn(adminUrl), FIRST.cert);
      const held = await connect(url);

      install(RENEWED);
      server.child.kill('SIGHUP');
      await server.waitFor(() => reloads(server, 'configuration reloaded') === 1);
      assert.equal(await servedFingerprint(url), fingerprintOf(RENEWED.cert));
      assertExpiresAt(await expiresIn(adminUrl), RENEWED.cert);
      // The connection opened before the reload still answers, on the certificate it was given.
      assert.equal(await statusOn(held, '/api/held'), 'HTTP/1.1 200 OK');
      assert.equal(held.getPeerCertificate().fingerprint256, fingerprintOf(FIRST.cert));
      held.destroy();

      // A renewal caught halfway (the new certificate beside the old key): refused, the served pair stays.
      copyFileSync(FIRST.cert, path.join(dir, 'cert.pem'));
      server.child.kill('SIGHUP');
      await server.waitFor(() => reloads(server, 'reload rejected: the previous configuration stays in force') === 1);
      assert.equal(await servedFingerprint(url), fingerprintOf(RENEWED.cert));
      assertExpiresAt(await expiresIn(adminUrl), RENEWED.cert);

      // Other paths: in force at the reload, no restart asked for.
      const moved = install(FIRST, { cert: path.join(dir, 'moved-cert.pem'), key: path.join(dir, 'moved-key.pem') });
      writeConfig('one.json5', moved);
      server.child.kill('SIGHUP');
      await server.waitFor(() => reloads(server, 'configuration reloaded') === 2);
      assert.equal(await servedFingerprint(url), fingerprintOf(FIRST.cert));
      assert.deepEqual(
        server.lines.filter((l) => /next restart/.test(l.msg ?? '')).map((l) => l.msg),
        [],
      );
    } finally {
      await server.stop();
    }
  });

  it('with gateway.workers: 2, every worker serves the renewed pair after SIGHUP, and the scrape reports it', async () => {
    const { server, url, adminUrl } = await start(
      writeConfig(
        'workers.json5',
        install(FIRST, { cert: path.join(dir, 'w-cert.pem'), key: path.join(dir, 'w-key.pem') }),
        2,
      ),
    );
    try {
      // Round robin: four new connections reach both workers.
      const before = server.lines.length;
      for (let i = 0; i < 4; i++)
        assert.equal(await servedFingerprint(url), fingerprintOf(FIRST.cert), `connection ${i}`);
      await server.waitFor(
        () =>
          new Set(
            server.lines
              .slice(before)
              .filter((l) => l.msg === 'request')
              .map((l) => l.worker),
          ).size === 2,
      );
      install(RENEWED, { cert: path.join(dir, 'w-cert.pem'), key: path.join(dir, 'w-key.pem') });
      server.child.kill('SIGHUP');
      await server.waitFor(() => reloads(server, 'configuration reloaded') === 1);
      const from = server.lines.length;
      for (let i = 0; i < 4; i++)
        assert.equal(await servedFingerprint(url), fingerprintOf(RENEWED.cert), `connection ${i}`);
      await server.waitFor(
        () =>
          new Set(
            server.lines
              .slice(from)
              .filter((l) => l.msg === 'request')
              .map((l) => l.worker),
          ).size === 2,
      );
      assertExpiresAt(await expiresIn(adminUrl), RENEWED.cert);
    } finally {
      await server.stop();
    }
  });

  it('with gateway.workers: 2, a replacement worker serves the pair in force, not files changed since without a reload (found by a newcomer)', async () => {
    const at = { cert: path.join(dir, 'r-cert.pem'), key: path.join(dir, 'r-key.pem') };
    const { server, url } = await start(writeConfig('replaced.json5', install(FIRST, at), 2));
    try {
      const pids = server.lines.find((l) => l.msg === 'gateway workers listening')!.pids as number[];
      // A renewal on disk, half-copied (the new certificate beside the old key), and no reload yet.
      copyFileSync(RENEWED.cert, at.cert);
      process.kill(pids[0]!, 'SIGKILL');
      await server.waitFor((l) => l.msg === 'gateway listening' && l.worker === 3);
      const from = server.lines.length;
      for (let i = 0; i < 4; i++)
        assert.equal(await servedFingerprint(url), fingerprintOf(FIRST.cert), `connection ${i}`);
      await server.waitFor(
        () =>
          new Set(
            server.lines
              .slice(from)
              .filter((l) => l.msg === 'request')
              .map((l) => l.worker),
          ).size === 2,
      );
      assert.deepEqual(
        server.lines.filter((l) => l.msg === 'replacement gateway worker failed to start'),
        [],
      );
    } finally {
      await server.stop();
    }
  });

  it('with gateway.workers: 2, a reload while a replacement worker is starting reaches it too (found by review: it was left on the old pair, or the reload waited 30 s and was refused)', async () => {
    const at = { cert: path.join(dir, 'm-cert.pem'), key: path.join(dir, 'm-key.pem') };
    const { server, url } = await start(writeConfig('midway.json5', install(FIRST, at), 2));
    try {
      const pids = server.lines.find((l) => l.msg === 'gateway workers listening')!.pids as number[];
      process.kill(pids[0]!, 'SIGKILL');
      await server.waitFor((l) => l.msg === 'gateway worker died: starting a new one');
      // The replacement is forked 500 ms later and takes a while to start: the reload lands meanwhile.
      await new Promise((r) => setTimeout(r, 600));
      install(RENEWED, at);
      const sentAt = Date.now();
      server.child.kill('SIGHUP');
      await server.waitFor(
        (l) =>
          l.msg === 'configuration reloaded' || l.msg === 'reload rejected: the previous configuration stays in force',
      );
      assert.ok(
        server.lines.some((l) => l.msg === 'configuration reloaded'),
        'the reload is not refused',
      );
      assert.ok(Date.now() - sentAt < 15_000, 'nor held up by the worker still starting');
      await server.waitFor((l) => l.msg === 'gateway listening' && l.worker === 3);
      await new Promise((r) => setTimeout(r, 500)); // a catch-up, if the replacement asked during the reload
      const from = server.lines.length;
      for (let i = 0; i < 6; i++)
        assert.equal(await servedFingerprint(url), fingerprintOf(RENEWED.cert), `connection ${i}`);
      await server.waitFor(
        () =>
          new Set(
            server.lines
              .slice(from)
              .filter((l) => l.msg === 'request')
              .map((l) => l.worker),
          ).size === 2,
      );
    } finally {
      await server.stop();
    }
  });

  it('a reload given the pair already read (what each gateway worker gets from the primary) serves that pair, whatever the files say now', async () => {
    const files = install(FIRST, { cert: path.join(dir, 'given-cert.pem'), key: path.join(dir, 'given-key.pem') });
    const config = parseConfig({
      gateway: {
        listen: { host: '127.0.0.1', port: 0 },
        tls: files,
        upstream: { target: upstream.url },
        auth: { apiKey: KEY },
      },
      webhooks: { enabled: false },
    });
    const gateway = await startGateway(config, {
      logger: pino({ level: 'silent' }),
      lockoutStore: new MemoryLockoutStore(),
    });
    try {
      const renewed = readTlsPem('test', RENEWED);
      await gateway.reload(config, renewed); // the files still hold FIRST
      assert.equal(await servedFingerprint(gateway.url), fingerprintOf(RENEWED.cert));
      assert.equal((await gateway.probe({ metrics: false })).certificateNotAfter, notAfterOf(RENEWED.cert));
      await assert.rejects(
        gateway.reload(config, { certPem: renewed.certPem, keyPem: readTlsPem('test', FIRST).keyPem }),
        (err: Error) =>
          err instanceof UsageError && /cannot serve TLS with the pair the primary read/.test(err.message),
      );
      assert.equal(
        await servedFingerprint(gateway.url),
        fingerprintOf(RENEWED.cert),
        'a pair that does not load changes nothing',
      );
    } finally {
      await gateway.close(0);
    }
  });

  it('a pair that does not load changes nothing: one line naming the files, and the listener keeps its certificate', async () => {
    const limits = {
      maxHeaderCount: 100,
      maxHeaderBytes: 16_384,
      headersTimeoutMs: 10_000,
      requestTimeoutMs: 30_000,
      keepAliveTimeoutMs: 5_000,
    };
    const listening = await listen('gateway.listen', { host: '127.0.0.1', port: 0 }, FIRST, limits, (_req, res) =>
      res.end('ok'),
    );
    try {
      const mismatched = { cert: RENEWED.cert, key: FIRST.key };
      assert.throws(
        () => listening.certificate!.replace(mismatched),
        (err: Error) =>
          err instanceof UsageError &&
          err.message.startsWith(`gateway.listen: cannot serve TLS with ${RENEWED.cert} and ${FIRST.key}:`),
      );
      assert.throws(
        () => listening.certificate!.replace({ cert: path.join(dir, 'missing.pem'), key: FIRST.key }),
        UsageError,
      );
      assert.equal(listening.certificate!.notAfter, notAfterOf(FIRST.cert));
      const socket = await connect(listening.url);
      assert.equal(socket.getPeerCertificate().fingerprint256, fingerprintOf(FIRST.cert));
      socket.destroy();
    } finally {
      await new Promise((r) => listening.server.close(r));
    }
  });
});
