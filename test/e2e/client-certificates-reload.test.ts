import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import { tmpdir } from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { createTestCa, type TestCa, type TestClientCertificate } from '../helpers/client-certificates.js';
import { runCli, startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// A real `gatehouse start`: SIGHUP reads the client-certificate CA and CRL again (the primary reads
// them for gateway workers), and a malformed setting is refused with its exact path.

const fixtures = fileURLToPath(new URL('../fixtures/tls/', import.meta.url));
const SERVER_CA = readFileSync(`${fixtures}cert.pem`);
const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-mtls-reload-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const SPIFFE = 'spiffe://corp/ns/billing/sa/api';
let first: TestCa;
let second: TestCa;
let upstream: RecordingServer;
before(async () => {
  first = createTestCa(dir, 'first-ca');
  second = createTestCa(dir, 'second-ca');
  upstream = await startRecordingUpstream();
});
after(() => upstream.close());

function writeConfig(name: string, clientCertificates: Record<string, unknown>, workers = 1): string {
  const file = path.join(dir, name);
  writeFileSync(
    file,
    JSON.stringify({
      gateway: {
        listen: { port: 0 },
        workers,
        upstream: { target: upstream.url },
        tls: { cert: `${fixtures}cert.pem`, key: `${fixtures}key.pem`, clientCertificates },
        auth: {
          clientCertificate: { identities: [{ uri: SPIFFE, subject: 'billing' }] },
          failures: { max: 1000 },
        },
      },
      webhooks: { enabled: false },
    }),
  );
  return file;
}

async function start(file: string, workers = 1): Promise<{ server: ServerProcess; url: string }> {
  const server = startServerProcess(file, {
    command: ['start', '--no-watch'],
    env: { NODE_CLUSTER_SCHED_POLICY: 'rr' },
  });
  const listening = await server.waitFor(
    (l) => l.msg === (workers > 1 ? 'gateway workers listening' : 'gateway listening'),
  );
  return { server, url: listening.url };
}

const reloads = (server: ServerProcess, msg: string) => server.lines.filter((l) => l.msg === msg).length;
const RELOADED = 'configuration reloaded';
const REJECTED = 'reload rejected: the previous configuration stays in force';

/** One request on a new connection: the status and the SHA-256 the upstream got. */
function call(url: string, target: string, cert: TestClientCertificate): Promise<number> {
  return new Promise((resolve, reject) => {
    https
      .get(`${url}${target}`, { agent: false, ca: SERVER_CA, cert: cert.cert, key: cert.key }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode!));
      })
      .on('error', reject);
  });
}

/** The worker ids of the request lines for `target` (one process: [undefined]). */
const workersServing = (server: ServerProcess, target: string) =>
  new Set(server.lines.filter((l) => l.msg === 'request' && l.path === target).map((l) => l.worker));

describe('client certificates: a reload reads the CA and CRL again', () => {
  it('SIGHUP after the CA file changed: the new CA’s certificate passes, the old CA’s fails, a connection verified before is closed; an unreadable CA keeps the one in force', async () => {
    const caFile = path.join(dir, 'clients-ca.pem');
    copyFileSync(first.certFile, caFile);
    const fromFirst = first.issue('reload-a', { san: [`URI:${SPIFFE}`] });
    const fromSecond = second.issue('reload-b', { san: [`URI:${SPIFFE}`] });
    const file = writeConfig('ca.json5', { ca: 'clients-ca.pem', mode: 'optional' });
    const { server, url } = await start(file);
    try {
      assert.equal(await call(url, '/api/a-before', fromFirst), 200);
      assert.equal(await call(url, '/api/b-before', fromSecond), 401);

      // A keep-alive connection verified under the first CA, one request answered on it.
      const { hostname, port } = new URL(url);
      const held = tls.connect({
        host: hostname,
        port: Number(port),
        ca: SERVER_CA,
        cert: fromFirst.cert,
        key: fromFirst.key,
      });
      await new Promise<void>((resolve, reject) => held.once('secureConnect', resolve).once('error', reject));
      const closed = new Promise<void>((resolve) => held.once('close', () => resolve()));
      held.on('error', () => {});
      const firstAnswer = new Promise<string>((resolve) =>
        held.once('data', (d: Buffer) => resolve(d.toString('latin1'))),
      );
      held.write('GET /api/held-1 HTTP/1.1\r\nHost: x\r\n\r\n');
      assert.match(await firstAnswer, /^HTTP\/1\.1 200 /);

      copyFileSync(second.certFile, caFile);
      server.child.kill('SIGHUP');
      await server.waitFor(() => reloads(server, RELOADED) === 1);
      await closed; // closed by gatehouse at the reload: it was idle
      const before = upstream.received.length;
      assert.equal(await call(url, '/api/a-after', fromFirst), 401);
      assert.equal(upstream.received.length, before, 'the old CA’s certificate reached nothing');
      assert.match(
        (await server.waitFor((l) => l.msg === 'request' && l.path === '/api/a-after')).detail,
        /client certificate refused in the handshake: UNABLE_TO_VERIFY_LEAF_SIGNATURE/,
      );
      assert.equal(await call(url, '/api/b-after', fromSecond), 200);
      assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-client-cert-sha256'], fromSecond.sha256);

      // A CA that cannot be read: the reload is refused, with the path; the CA in force stays.
      writeConfig('ca.json5', { ca: 'missing-ca.pem', mode: 'optional' });
      server.child.kill('SIGHUP');
      const rejected = await server.waitFor((l) => l.msg === REJECTED);
      assert.deepEqual(rejected.problems, [
        `gateway.tls.clientCertificates.ca: ${path.join(dir, 'missing-ca.pem')} does not exist`,
      ]);
      assert.equal(await call(url, '/api/b-kept', fromSecond), 200);
      assert.equal(await call(url, '/api/a-kept', fromFirst), 401);
    } finally {
      await server.stop();
    }
  });

  it('with gateway.workers: 2, SIGHUP after a new CRL: the revoked certificate fails on every worker, the others still pass', async () => {
    const crlFile = path.join(dir, 'clients.crl.pem');
    const kept = first.issue('crl-kept', { san: [`URI:${SPIFFE}`] });
    const toRevoke = first.issue('crl-revoked', { san: [`URI:${SPIFFE}`] });
    copyFileSync(first.crl('crl-before'), crlFile);
    const file = writeConfig('crl.json5', { ca: first.certFile, crl: 'clients.crl.pem', mode: 'optional' }, 2);
    const { server, url } = await start(file, 2);
    try {
      for (let i = 0; i < 4; i++) assert.equal(await call(url, '/api/crl-before', toRevoke), 200);
      await server.waitFor(() => workersServing(server, '/api/crl-before').size === 2);

      first.revoke(toRevoke);
      copyFileSync(first.crl('crl-after'), crlFile);
      server.child.kill('SIGHUP');
      await server.waitFor(() => reloads(server, RELOADED) === 1);
      const before = upstream.received.length;
      for (let i = 0; i < 4; i++) assert.equal(await call(url, '/api/crl-after', toRevoke), 401);
      assert.equal(upstream.received.length, before);
      await server.waitFor(() => workersServing(server, '/api/crl-after').size === 2);
      for (const line of server.lines.filter((l) => l.msg === 'request' && l.path === '/api/crl-after'))
        assert.match(line.detail, /client certificate refused in the handshake: CERT_REVOKED/);
      for (let i = 0; i < 4; i++) assert.equal(await call(url, '/api/crl-kept', kept), 200);
      await server.waitFor(() => workersServing(server, '/api/crl-kept').size === 2);
    } finally {
      await server.stop();
    }
  });
});

describe('client certificates: configuration errors', () => {
  it('each misconfiguration is refused by config check (exit 1) with its exact path and reason', async () => {
    const tlsPair = `cert: "${fixtures}cert.pem", key: "${fixtures}key.pem"`;
    const identities = `identities: [{ uri: "${SPIFFE}", subject: "billing" }]`;
    writeFileSync(path.join(dir, 'not-a-crl.pem'), readFileSync(first.certFile));
    const cases: [string, string, string][] = [
      [
        'clientCertificate without gateway.tls',
        `auth: { clientCertificate: { ${identities} } }`,
        'gateway.auth.clientCertificate: needs gateway.tls with clientCertificates (the CA that verifies client certificates)',
      ],
      [
        'clientCertificate without clientCertificates',
        `tls: { ${tlsPair} }, auth: { clientCertificate: { ${identities} } }`,
        'gateway.auth.clientCertificate: needs gateway.tls.clientCertificates (the CA that verifies client certificates)',
      ],
      [
        'a mode that is not one',
        `tls: { ${tlsPair}, clientCertificates: { ca: "${first.certFile}", mode: "sometimes" } }`,
        'gateway.tls.clientCertificates.mode:',
      ],
      [
        'clientCertificates without the pair',
        `tls: { clientCertificates: { ca: "${first.certFile}", mode: "required" } }`,
        'gateway.tls.cert:',
      ],
      [
        'an unreadable CA',
        `tls: { ${tlsPair}, clientCertificates: { ca: "absent-ca.pem", mode: "required" } }`,
        `gateway.tls.clientCertificates.ca: ${path.join(dir, 'absent-ca.pem')} does not exist`,
      ],
      [
        'a key as the CA',
        `tls: { ${tlsPair}, clientCertificates: { ca: "${fixtures}key.pem", mode: "required" } }`,
        `gateway.tls.clientCertificates.ca: ${fixtures}key.pem holds something that is not a PEM certificate`,
      ],
      [
        'an unreadable CRL',
        `tls: { ${tlsPair}, clientCertificates: { ca: "${first.certFile}", crl: "absent.crl.pem", mode: "optional" } }`,
        `gateway.tls.clientCertificates.crl: ${path.join(dir, 'absent.crl.pem')} does not exist`,
      ],
      [
        'a certificate as the CRL',
        `tls: { ${tlsPair}, clientCertificates: { ca: "${first.certFile}", crl: "not-a-crl.pem", mode: "optional" } }`,
        `gateway.tls.clientCertificates.crl: ${path.join(dir, 'not-a-crl.pem')} holds no PEM CRL`,
      ],
      [
        'an identity with two kinds',
        `tls: { ${tlsPair}, clientCertificates: { ca: "${first.certFile}", mode: "optional" } }, auth: { clientCertificate: { identities: [{ uri: "${SPIFFE}", dns: "orders.internal", subject: "x" }] } }`,
        'gateway.auth.clientCertificate.identities[0]: exactly one of uri, dns or cn is required (got uri, dns)',
      ],
      [
        'a wildcard DNS identity',
        `tls: { ${tlsPair}, clientCertificates: { ca: "${first.certFile}", mode: "optional" } }, auth: { clientCertificate: { identities: [{ dns: "*.internal", subject: "x" }] } }`,
        'gateway.auth.clientCertificate.identities[0].dns: dns must be a DNS name without wildcard or trailing dot',
      ],
      [
        'the same identity twice (DNS in another case)',
        `tls: { ${tlsPair}, clientCertificates: { ca: "${first.certFile}", mode: "optional" } }, auth: { clientCertificate: { identities: [{ dns: "orders.internal", subject: "x" }, { dns: "Orders.Internal", subject: "y" }] } }`,
        'gateway.auth.clientCertificate.identities[1].dns: duplicate dns "Orders.Internal" (also at identities[0])',
      ],
      [
        'no identity and no subjectFrom',
        `tls: { ${tlsPair}, clientCertificates: { ca: "${first.certFile}", mode: "optional" } }, auth: { clientCertificate: {} }`,
        'gateway.auth.clientCertificate.identities: list at least one identity, or set subjectFrom',
      ],
    ];
    for (const [name, gateway, problem] of cases) {
      const file = path.join(dir, `bad-${name.replace(/\W+/g, '-')}.json5`);
      writeFileSync(
        file,
        `{ gateway: { listen: { port: 0 }, upstream: { target: "${upstream.url}" }, ${gateway} }, webhooks: { enabled: false } }`,
      );
      const result = await runCli(['config', 'check', '--config', file]);
      assert.equal(result.code, 1, `${name}: ${result.stdout}${result.stderr}`);
      assert.ok(result.stderr.includes(problem), `${name}: ${result.stderr}`);
      assert.doesNotMatch(result.stderr, /\n\s+at /, `${name}: no stack`);
    }
  });

  it('start with an unreadable CA exits 1 with that one problem, no stack', async () => {
    const file = writeConfig('start-bad.json5', { ca: 'nowhere-ca.pem', mode: 'required' });
    const result = await runCli(['start', '--config', file]);
    assert.equal(result.code, 1);
    assert.ok(
      result.stderr.includes(`gateway.tls.clientCertificates.ca: ${path.join(dir, 'nowhere-ca.pem')} does not exist`),
      result.stderr,
    );
    assert.doesNotMatch(result.stderr, /\n\s+at /);
  });
});
