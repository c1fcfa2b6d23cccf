import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import https from 'node:https';
import { tmpdir } from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { createTestCa, type TestCa, type TestClientCertificate } from '../helpers/client-certificates.js';
import { startTestGatehouse, testConfig, TEST_PLAIN_KEY, type TestGatehouse } from '../helpers/gatehouse.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// gateway.tls.clientCertificates (mTLS) and gateway.auth.clientCertificate: every case is judged by
// what the upstream received (or that it received nothing).

const fixtures = fileURLToPath(new URL('../fixtures/tls/', import.meta.url));
const SERVER = { cert: `${fixtures}cert.pem`, key: `${fixtures}key.pem` };
const SERVER_CA = readFileSync(SERVER.cert);
const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-mtls-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const IDENTITIES = [
  { uri: 'spiffe://corp/ns/billing/sa/api', subject: 'billing', scopes: ['billing:read'] },
  { dns: 'orders.internal', subject: 'orders', scopes: ['orders:write'] },
  { cn: 'reports', subject: 'reports' },
];

let ca: TestCa;
let other: TestCa;
let certs: Record<string, TestClientCertificate>;
let crlFile: string;
before(() => {
  ca = createTestCa(dir, 'clients-ca');
  other = createTestCa(dir, 'other-ca');
  certs = {
    spiffe: ca.issue('spiffe', { cn: 'billing-api', san: ['URI:spiffe://corp/ns/billing/sa/api'] }),
    dnsMixedCase: ca.issue('dns-mixed-case', { san: ['DNS:ORDERS.Internal'] }),
    cnOnly: ca.issue('cn-only', { cn: 'reports' }),
    cnBesideSan: ca.issue('cn-beside-san', { cn: 'reports', san: ['DNS:elsewhere.internal'] }),
    uriLonger: ca.issue('uri-longer', { san: ['URI:spiffe://corp/ns/billing/sa/api-admin'] }),
    uriShorter: ca.issue('uri-shorter', { san: ['URI:spiffe://corp/ns/billing/sa/ap'] }),
    dnsSuffix: ca.issue('dns-suffix', { san: ['DNS:orders.internal.evil.example'] }),
    dnsWildcard: ca.issue('dns-wildcard', { san: ['DNS:*.internal'] }),
    posingAsTwo: ca.issue('posing-as-two', { san: ['URI:spiffe://corp/x, DNS:orders.internal'] }),
    unlisted: ca.issue('unlisted', { cn: 'unlisted', san: ['URI:spiffe://corp/ns/other/sa/x, y'] }),
    posingAsSubject: ca.issue('posing-as-subject', { san: ['URI:urn:billing'] }),
    posingAsKey: ca.issue('posing-as-key', { san: ['URI:default'] }),
    uriTooLong: ca.issue('uri-too-long', { san: [`URI:spiffe://corp/${'x'.repeat(300)}`] }),
    expired: ca.issue('expired', {
      san: ['URI:spiffe://corp/ns/billing/sa/api'],
      startDate: '20200101000000Z',
      endDate: '20200201000000Z',
    }),
    revoked: ca.issue('revoked', { san: ['URI:spiffe://corp/ns/billing/sa/api'] }),
    serverAuthOnly: ca.issue('server-auth-only', {
      san: ['URI:spiffe://corp/ns/billing/sa/api'],
      extendedKeyUsage: 'serverAuth',
    }),
    foreign: other.issue('foreign', { cn: 'reports', san: ['URI:spiffe://corp/ns/billing/sa/api'] }),
  };
  ca.revoke(certs.revoked!);
  crlFile = ca.crl('crl');
});

interface Answer {
  status: number;
  body: string;
}

/** One HTTPS request on a new connection, with a client certificate or none; a TLS failure rejects. */
function call(
  url: string,
  target: string,
  options: { cert?: TestClientCertificate; headers?: Record<string, string>; maxVersion?: tls.SecureVersion } = {},
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      `${url}${target}`,
      {
        agent: false,
        ca: SERVER_CA,
        cert: options.cert?.cert,
        key: options.cert?.key,
        headers: options.headers,
        maxVersion: options.maxVersion,
      },
      (res) => {
        let body = '';
        res.on('data', (d) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode!, body }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** The gatehouse-set identity headers the upstream got with its last request. */
function identityHeaders(upstream: RecordingServer) {
  const headers = upstream.received.at(-1)!.headers;
  return {
    auth: headers['x-gatehouse-auth'],
    subject: headers['x-gatehouse-subject'],
    scopes: headers['x-gatehouse-scopes'],
    sha256: headers['x-gatehouse-client-cert-sha256'],
  };
}

function mtlsConfig(upstream: RecordingServer, overrides: { tls?: object; auth?: object } = {}) {
  return testConfig(upstream.url, {
    gateway: {
      tls: {
        ...SERVER,
        clientCertificates: { ca: ca.certFile, crl: crlFile, mode: 'optional' },
        ...overrides.tls,
      },
      auth: { clientCertificate: { identities: IDENTITIES }, ...overrides.auth },
    },
  });
}

describe('client certificates, mode optional: a certificate is a credential', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  before(async () => {
    upstream = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(mtlsConfig(upstream, { auth: { failures: { max: 1000 } } }));
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  it('each identity kind authenticates its certificate: the upstream gets the subject, scopes and SHA-256 exactly', async () => {
    for (const [cert, subject, scopes] of [
      [certs.spiffe!, 'billing', 'billing:read'],
      [certs.dnsMixedCase!, 'orders', 'orders:write'], // DNS names compare in any case (RFC 6125)
      [certs.cnOnly!, 'reports', undefined],
    ] as const) {
      const before = upstream.received.length;
      assert.equal((await call(gatehouse.url, '/api/who', { cert })).status, 200);
      assert.equal(upstream.received.length, before + 1);
      assert.deepEqual(identityHeaders(upstream), { auth: 'client-certificate', subject, scopes, sha256: cert.sha256 });
      assert.match(cert.sha256, /^[0-9a-f]{64}$/);
    }
  });

  it('certificate headers a client sends never reach the upstream; the SHA-256 is the one gatehouse saw', async () => {
    const forged = {
      'x-gatehouse-client-cert-sha256': 'f'.repeat(64),
      'X-Client-Cert': 'forged',
      'ssl-client-cert': 'forged',
      'x-ssl-client-verify': 'SUCCESS',
      'x-client-cert-chain': 'forged',
      'x-gatehouse-subject': 'admin',
    };
    await call(gatehouse.url, '/api/forged', { cert: certs.spiffe!, headers: forged });
    const got = upstream.received.at(-1)!;
    assert.equal(got.url, '/api/forged');
    assert.equal(got.headers['x-gatehouse-client-cert-sha256'], certs.spiffe!.sha256);
    assert.equal(got.headers['x-gatehouse-subject'], 'billing');
    for (const name of ['x-client-cert', 'ssl-client-cert', 'x-ssl-client-verify', 'x-client-cert-chain'])
      assert.equal(got.headers[name], undefined, name);
    // With an API key and no certificate, no SHA-256 header at all (a forged one is dropped).
    await call(gatehouse.url, '/api/forged-key', { headers: { ...forged, 'x-api-key': TEST_PLAIN_KEY } });
    const keyOnly = upstream.received.at(-1)!;
    assert.equal(keyOnly.url, '/api/forged-key');
    assert.deepEqual(identityHeaders(upstream), {
      auth: 'api-key',
      subject: 'default',
      scopes: undefined,
      sha256: undefined,
    });
  });

  it('expired, revoked, another CA, serverAuth only, or matching no identity exactly: 401, the upstream gets nothing, the reason is logged only', async () => {
    const cases: [string, RegExp][] = [
      ['expired', /client certificate refused in the handshake: CERT_HAS_EXPIRED/],
      ['revoked', /client certificate refused in the handshake: CERT_REVOKED/],
      ['foreign', /client certificate refused in the handshake: UNABLE_TO_VERIFY_LEAF_SIGNATURE/],
      ['serverAuthOnly', /client certificate refused in the handshake: INVALID_PURPOSE/],
      ['cnBesideSan', /matches no identity/], // a CN is no identity beside SANs (RFC 6125 §6.4.4)
      ['uriLonger', /matches no identity/],
      ['uriShorter', /matches no identity/],
      ['dnsSuffix', /matches no identity/],
      ['dnsWildcard', /matches no identity/],
      ['posingAsTwo', /matches no identity .*URI "spiffe:\/\/corp\/x, DNS:orders.internal"/],
      ['unlisted', /matches no identity/],
    ];
    for (const [name, reason] of cases) {
      const before = upstream.received.length;
      const answer = await call(gatehouse.url, `/api/bad-${name}`, { cert: certs[name]! });
      assert.equal(answer.status, 401, name);
      assert.deepEqual(JSON.parse(answer.body), {
        error: { code: 'invalid_client_certificate', message: 'The client certificate is not valid.' },
      });
      assert.equal(upstream.received.length, before, `${name}: the upstream received nothing`);
      const line = gatehouse.logs.find((l) => l.msg === 'request' && l.path === `/api/bad-${name}`);
      assert.match(line?.detail ?? '', reason, name);
    }
  });

  it('a valid API key does not carry a refused certificate along (require: any), and no certificate at all is not a failure', async () => {
    const before = upstream.received.length;
    const answer = await call(gatehouse.url, '/api/ride-along', {
      cert: certs.expired!,
      headers: { 'x-api-key': TEST_PLAIN_KEY },
    });
    assert.equal(answer.status, 401);
    assert.equal(upstream.received.length, before);
    assert.equal((await call(gatehouse.url, '/api/nothing')).status, 401);
    const line = gatehouse.logs.find((l) => l.msg === 'request' && l.path === '/api/nothing');
    assert.equal(line?.error, 'missing_credentials');
  });

  it('no TLS session is resumed: a new connection is verified in a full handshake', async () => {
    const { hostname, port } = new URL(gatehouse.url);
    const connect = (session?: Buffer) =>
      new Promise<{ socket: tls.TLSSocket; session: Promise<Buffer | undefined> }>((resolve, reject) => {
        const socket = tls.connect({
          host: hostname,
          port: Number(port),
          ca: SERVER_CA,
          cert: certs.spiffe!.cert,
          key: certs.spiffe!.key,
          session,
        });
        const gotSession = new Promise<Buffer | undefined>((r) => {
          socket.once('session', r);
          socket.once('close', () => r(undefined));
        });
        socket.once('secureConnect', () => resolve({ socket, session: gotSession })).once('error', reject);
      });
    const first = await connect();
    first.socket.write('GET /api/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    const session = await first.session;
    first.socket.destroy();
    assert.ok(session, 'the client was given a session to offer (TLS 1.3 always sends one)');
    const second = await connect(session);
    assert.equal(second.socket.isSessionReused(), false);
    second.socket.destroy();
  });

  it('TLS 1.2: a client cannot renegotiate (and so cannot swap its certificate mid-connection)', async () => {
    const { hostname, port } = new URL(gatehouse.url);
    const socket = tls.connect({
      host: hostname,
      port: Number(port),
      ca: SERVER_CA,
      cert: certs.spiffe!.cert,
      key: certs.spiffe!.key,
      maxVersion: 'TLSv1.2',
    });
    await new Promise<void>((resolve, reject) => socket.once('secureConnect', resolve).once('error', reject));
    assert.equal(socket.getProtocol(), 'TLSv1.2');
    const outcome = await new Promise<string>((resolve) => {
      socket.once('error', (err: NodeJS.ErrnoException) => resolve(`error ${err.code ?? err.message}`));
      socket.once('close', () => resolve('closed'));
      const started = socket.renegotiate({ rejectUnauthorized: true }, (err) =>
        resolve(err ? `error ${(err as NodeJS.ErrnoException).code ?? err.message}` : 'renegotiated'),
      );
      if (!started) resolve('not started');
      // A request after it is answered, if at all, for the certificate of the handshake.
      socket.write('GET /api/after-renegotiation HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    });
    socket.destroy();
    assert.match(outcome, /^error /); // OpenSSL's no_renegotiation alert: EPROTO
    assert.notEqual(outcome, 'renegotiated');
    const after = upstream.received.filter((r) => r.url === '/api/after-renegotiation');
    for (const r of after) assert.equal(r.headers['x-gatehouse-subject'], 'billing');
  });
});

describe('client certificates with other credentials, rules and the lockout', () => {
  let upstream: RecordingServer;
  before(async () => {
    upstream = await startRecordingUpstream();
  });
  after(() => upstream.close());

  it('require: all with an API key and a certificate: both or nothing; the subject is the certificate’s, the scopes both', async () => {
    const gatehouse = await startTestGatehouse(
      mtlsConfig(upstream, {
        auth: {
          require: 'all',
          apiKey: undefined,
          apiKeys: [
            {
              id: 'ci',
              hash: (await import('../../src/gateway/credentials/api-key.js')).hashApiKey(TEST_PLAIN_KEY),
              scopes: ['ci'],
            },
          ],
        },
      }),
    );
    try {
      const before = upstream.received.length;
      assert.equal((await call(gatehouse.url, '/api/cert-only', { cert: certs.spiffe! })).status, 401);
      assert.equal(
        (await call(gatehouse.url, '/api/key-only', { headers: { 'x-api-key': TEST_PLAIN_KEY } })).status,
        401,
      );
      assert.equal(upstream.received.length, before, 'neither alone reached the upstream');
      const both = await call(gatehouse.url, '/api/both', {
        cert: certs.spiffe!,
        headers: { 'x-api-key': TEST_PLAIN_KEY },
      });
      assert.equal(both.status, 200);
      assert.deepEqual(identityHeaders(upstream), {
        auth: 'api-key,client-certificate',
        subject: 'billing',
        scopes: 'ci billing:read',
        sha256: certs.spiffe!.sha256,
      });
      assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-key-id'], 'ci');
    } finally {
      await gatehouse.close();
    }
  });

  it('rules see the identity’s scopes; subjectFrom admits an unlisted certificate with no scopes, its subject made header-safe', async () => {
    const gatehouse = await startTestGatehouse(
      mtlsConfig(upstream, {
        auth: {
          clientCertificate: {
            identities: [...IDENTITIES, { dns: 'billing.internal', subject: 'urn:billing' }],
            subjectFrom: 'uri',
          },
          rules: [{ paths: ['/api/billing/**'], scopes: ['billing:read'] }],
        },
      }),
    );
    try {
      assert.equal((await call(gatehouse.url, '/api/billing/invoices', { cert: certs.spiffe! })).status, 200);
      assert.equal(upstream.received.at(-1)!.url, '/api/billing/invoices');
      const before = upstream.received.length;
      const refused = await call(gatehouse.url, '/api/billing/invoices', { cert: certs.dnsMixedCase! });
      assert.equal(refused.status, 403);
      assert.equal(upstream.received.length, before);
      // Unlisted: its one SAN URI is the subject; its ", " is percent-encoded (no header list, no second entry).
      assert.equal((await call(gatehouse.url, '/api/open', { cert: certs.unlisted! })).status, 200);
      assert.deepEqual(identityHeaders(upstream), {
        auth: 'client-certificate',
        subject: 'spiffe://corp/ns/other/sa/x%2C y',
        scopes: undefined,
        sha256: certs.unlisted!.sha256,
      });
      assert.equal((await call(gatehouse.url, '/api/billing/x', { cert: certs.unlisted! })).status, 403);
      // Without a SAN URI there is nothing to take the subject from.
      assert.equal((await call(gatehouse.url, '/api/open', { cert: certs.dnsWildcard! })).status, 401);
      // Nor may it pose as a listed identity: an unlisted certificate whose SAN URI is a listed subject.
      assert.equal((await call(gatehouse.url, '/api/posing', { cert: certs.posingAsSubject! })).status, 401);
      assert.match(
        gatehouse.logs.find((l) => l.msg === 'request' && l.path === '/api/posing')?.detail ?? '',
        /is the subject of an identity or an API key/,
      );
      // Nor as an API key (the plain apiKey's id is `default`), which would share its per-subject limits.
      assert.equal((await call(gatehouse.url, '/api/posing-key', { cert: certs.posingAsKey! })).status, 401);
      // A name too long for a header and a log line is no subject.
      assert.equal((await call(gatehouse.url, '/api/long', { cert: certs.uriTooLong! })).status, 401);
      // subjectFrom never lets a refused certificate in.
      assert.equal((await call(gatehouse.url, '/api/open', { cert: certs.foreign! })).status, 401);
    } finally {
      await gatehouse.close();
    }
    // subjectFrom: dns: a wildcard names no client (found by an outside attack: `*.internal` was a subject).
    const byDns = await startTestGatehouse(
      mtlsConfig(upstream, { auth: { clientCertificate: { identities: IDENTITIES, subjectFrom: 'dns' } } }),
    );
    try {
      assert.equal((await call(byDns.url, '/api/wildcard', { cert: certs.dnsWildcard! })).status, 401);
      assert.equal((await call(byDns.url, '/api/suffix', { cert: certs.dnsSuffix! })).status, 200);
      assert.equal(identityHeaders(upstream).subject, 'orders.internal.evil.example');
    } finally {
      await byDns.close();
    }
  });

  it('a presented certificate that fails counts toward the lockout like a bad key: locked after max, then even a good one is refused', async () => {
    const gatehouse = await startTestGatehouse(mtlsConfig(upstream, { auth: { failures: { max: 3 } } }));
    try {
      for (let i = 0; i < 3; i++)
        assert.equal((await call(gatehouse.url, '/api/x', { cert: certs.revoked! })).status, 401);
      const before = upstream.received.length;
      const locked = await call(gatehouse.url, '/api/x', { cert: certs.spiffe! });
      assert.equal(locked.status, 429);
      assert.equal(JSON.parse(locked.body).error.code, 'too_many_failures');
      assert.equal(upstream.received.length, before);
    } finally {
      await gatehouse.close();
    }
  });
});

describe('client certificates, mode required: no valid certificate, no TLS connection', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  before(async () => {
    upstream = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(
      mtlsConfig(upstream, { tls: { clientCertificates: { ca: ca.certFile, crl: crlFile, mode: 'required' } } }),
    );
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  it('without a certificate, or with an expired, revoked or foreign one, the handshake fails (TLS 1.3 and 1.2) and nothing reaches the upstream', async () => {
    const cases: [string, TestClientCertificate | undefined, RegExp][] = [
      ['none', undefined, /certificate.required|handshake.failure|ECONNRESET/i],
      ['expired', certs.expired, /certificate.expired|ECONNRESET/i],
      ['revoked', certs.revoked, /certificate.revoked|ECONNRESET/i],
      ['foreign', certs.foreign, /unknown.ca|ECONNRESET/i],
      ['serverAuthOnly', certs.serverAuthOnly, /unsupported.certificate|bad.certificate|ECONNRESET/i],
    ];
    for (const maxVersion of ['TLSv1.3', 'TLSv1.2'] as const)
      for (const [name, cert, error] of cases) {
        await assert.rejects(
          call(gatehouse.url, `/api/required-${name}`, { cert, maxVersion }),
          (err: NodeJS.ErrnoException) => {
            assert.match(`${err.code} ${err.message}`, error, `${name} ${maxVersion}: ${err.code} ${err.message}`);
            return true;
          },
        );
      }
    assert.equal(upstream.received.filter((r) => r.url.startsWith('/api/required-')).length, 0);
    assert.equal(gatehouse.logs.filter((l) => l.msg === 'request' && l.path?.startsWith('/api/required-')).length, 0);
  });

  it('a valid certificate connects and authenticates', async () => {
    assert.equal((await call(gatehouse.url, '/api/required-ok', { cert: certs.cnOnly! })).status, 200);
    assert.deepEqual(identityHeaders(upstream), {
      auth: 'client-certificate',
      subject: 'reports',
      scopes: undefined,
      sha256: certs.cnOnly!.sha256,
    });
  });
});

describe('client certificates: an in-process reload', () => {
  it('optional → required at a reload: a connection without a certificate then fails its handshake; WebSockets opened with a certificate or with a key alone are closed by it', async () => {
    const { WebSocketServer, default: WebSocket } = await import('ws');
    const http = await import('node:http');
    const { parseConfig } = await import('../../src/config/load.js');
    const wsUpstream = http.createServer();
    const wss = new WebSocketServer({ server: wsUpstream });
    wss.on('connection', (ws) => ws.on('message', (data) => ws.send(`echo:${data.toString()}`)));
    await new Promise<void>((resolve) => wsUpstream.listen(0, '127.0.0.1', resolve));
    const target = `http://127.0.0.1:${(wsUpstream.address() as import('node:net').AddressInfo).port}`;
    const upstream = { url: target } as RecordingServer;
    const gatehouse = await startTestGatehouse(mtlsConfig(upstream));
    try {
      const ws = new WebSocket(`${gatehouse.url.replace('https', 'wss')}/api/stream`, {
        ca: SERVER_CA,
        cert: certs.spiffe!.cert,
        key: certs.spiffe!.key,
      });
      await new Promise<void>((resolve, reject) => ws.once('open', resolve).once('error', reject));
      const echoed = new Promise<string>((resolve) => ws.once('message', (d) => resolve(d.toString())));
      ws.send('hi');
      assert.equal(await echoed, 'echo:hi');
      const wsClosed = new Promise<number>((resolve) => ws.once('close', (code) => resolve(code)));
      // Opened with the API key and no certificate (an outside attack found it left open by the reload).
      const keyed = new WebSocket(`${gatehouse.url.replace('https', 'wss')}/api/stream`, {
        ca: SERVER_CA,
        headers: { 'x-api-key': TEST_PLAIN_KEY },
      });
      await new Promise<void>((resolve, reject) => keyed.once('open', resolve).once('error', reject));
      const keyedClosed = new Promise<number>((resolve) => keyed.once('close', (code) => resolve(code)));

      await gatehouse.reload(
        parseConfig(
          mtlsConfig(upstream, { tls: { clientCertificates: { ca: ca.certFile, crl: crlFile, mode: 'required' } } }),
        ),
      );
      assert.ok((await wsClosed) > 0, 'the WebSocket verified under the previous settings is closed');
      assert.ok((await keyedClosed) > 0, 'the WebSocket opened with a key under the previous settings is closed');
      await assert.rejects(call(gatehouse.url, '/api/after', {}), (err: NodeJS.ErrnoException) => {
        assert.match(`${err.code} ${err.message}`, /certificate.required|handshake.failure|ECONNRESET/i);
        return true;
      });
    } finally {
      await gatehouse.close();
      for (const client of wss.clients) client.terminate();
      await new Promise((resolve) => wsUpstream.close(resolve));
    }
  });
});

/** A TCP connection to gatehouse, accepted now; its TLS handshake is made later, by `finish`. */
async function acceptedConnection(url: string) {
  const net = await import('node:net');
  const { hostname, port } = new URL(url);
  const tcp = net.connect(Number(port), hostname);
  await new Promise<void>((resolve, reject) => tcp.once('connect', resolve).once('error', reject));
  await new Promise((resolve) => setTimeout(resolve, 100)); // accepted by the server
  return {
    /** Shakes hands (with `cert`, or none), sends `request`; resolves with every byte that came back before the close. */
    finish(request: string, cert?: TestClientCertificate): Promise<string> {
      const socket = tls.connect({
        socket: tcp,
        ca: SERVER_CA,
        cert: cert?.cert,
        key: cert?.key,
        servername: 'localhost',
      });
      return new Promise((resolve) => {
        let text = '';
        socket.on('error', () => {}); // a reset after the close: the bytes (none) are the answer
        socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
        socket.once('secureConnect', () => socket.write(request));
        socket.once('close', () => resolve(text));
      });
    },
  };
}

describe('client certificates: a handshake stalled across a reload', () => {
  it('a TCP connection accepted before a CRL reload, its handshake finished after, is closed unanswered: a certificate revoked meanwhile never authenticates', async () => {
    const { parseConfig } = await import('../../src/config/load.js');
    const upstream = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(mtlsConfig(upstream));
    try {
      const late = ca.issue('late-revoked', { san: ['URI:spiffe://corp/ns/billing/sa/api'] });
      assert.equal((await call(gatehouse.url, '/api/before', { cert: late })).status, 200);
      // Accepted now, with the old CRL's context; the ClientHello waits for the reload.
      const stalled = await acceptedConnection(gatehouse.url);
      ca.revoke(late);
      const newCrl = ca.crl('crl-stalled');
      await gatehouse.reload(
        parseConfig(
          mtlsConfig(upstream, { tls: { clientCertificates: { ca: ca.certFile, crl: newCrl, mode: 'optional' } } }),
        ),
      );
      const answer = await stalled.finish('GET /api/stalled HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', late);
      assert.equal(answer, '', 'closed without an answer');
      assert.equal(upstream.received.filter((r) => r.url === '/api/stalled').length, 0);
      // A new connection now: refused by the new CRL in the handshake's own verdict.
      assert.equal((await call(gatehouse.url, '/api/after', { cert: late })).status, 401);
    } finally {
      await gatehouse.close();
      await upstream.close();
    }
  });

  it('optional → required: a connection accepted before, its handshake made after with no certificate, gets nothing through with a valid key (found by an outside attack: it was served)', async () => {
    const { parseConfig } = await import('../../src/config/load.js');
    const upstream = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(mtlsConfig(upstream));
    try {
      const stalled = await acceptedConnection(gatehouse.url);
      await gatehouse.reload(
        parseConfig(
          mtlsConfig(upstream, { tls: { clientCertificates: { ca: ca.certFile, crl: crlFile, mode: 'required' } } }),
        ),
      );
      const answer = await stalled.finish(
        `GET /api/stalled-keyed HTTP/1.1\r\nHost: x\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\n\r\nGET /api/stalled-keyed HTTP/1.1\r\nHost: x\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\nConnection: close\r\n\r\n`,
      );
      assert.equal(answer, '', 'closed without an answer');
      assert.equal(upstream.received.filter((r) => r.url === '/api/stalled-keyed').length, 0);
    } finally {
      await gatehouse.close();
      await upstream.close();
    }
  });
});
