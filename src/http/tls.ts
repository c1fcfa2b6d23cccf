import { constants, X509Certificate } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type http from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { UsageError } from '../errors.js';

// TLS on a listener: the served pair and, with `gateway.tls.clientCertificates`, the CA and CRL that
// verify client certificates (mTLS), all replaced together at a reload.

export interface ServedCertificate {
  /** When it expires (ms since the epoch): the leaf's notAfter. */
  notAfter: number;
  /**
   * Serves a pair (and verifies client certificates with a CA and CRL) for every new connection from
   * now on (a renewal, a reload): the files now at these paths, or their text already read (the
   * primary reads it once for every gateway worker). Open connections keep theirs, except that a
   * change of the client-certificate settings retires the connections verified under the old ones
   * (see `peerCertificate`). Anything that does not load changes nothing: a UsageError.
   */
  replace(tls: TlsFiles | TlsPem): void;
}

export type ClientCertificateMode = 'optional' | 'required';
/** gateway.tls as configured (paths resolved). */
export type TlsFiles = {
  cert: string;
  key: string;
  clientCertificates?: { ca: string; crl?: string; mode: ClientCertificateMode };
};
/** A pair's PEM text, and the client-certificate CA and CRL's, read by the caller. */
export type TlsPem = {
  certPem: string;
  keyPem: string;
  clientCertificates?: { caPem: string; crlPem?: string; mode: ClientCertificateMode };
};

/** The TLS files as they are now (the config check read them; one can change since): a problem is one line, not a stack. */
export function readTlsPem(name: string, tls: TlsFiles): TlsPem {
  const read = (file: string) => readFileSync(file, 'utf8');
  let pair: TlsPem;
  try {
    pair = { certPem: read(tls.cert), keyPem: read(tls.key) };
  } catch (err) {
    throw new UsageError(`${name}: cannot serve TLS with ${tls.cert} and ${tls.key}: ${(err as Error).message}`);
  }
  const clients = tls.clientCertificates;
  if (!clients) return pair;
  try {
    const crlPem = clients.crl === undefined ? undefined : read(clients.crl);
    return { ...pair, clientCertificates: { caPem: read(clients.ca), crlPem, mode: clients.mode } };
  } catch (err) {
    throw new UsageError(`${name}: cannot verify client certificates: ${(err as Error).message}`);
  }
}

/** Every CRL of a PEM file: Node's `crl` option takes one per entry (it reads only the first of a text). */
export function splitCrls(pem: string): string[] {
  return pem.match(/-----BEGIN X509 CRL-----[\s\S]+?-----END X509 CRL-----/g) ?? [];
}

/**
 * The TLS options of a listener: the pair, and with client certificates the CA they must chain to
 * (only it: Node's default roots are never used), the CRLs (OpenSSL then checks every certificate
 * of the chain against them: a CA without a CRL in the file fails its certificates), and:
 * - no session resumption (no tickets; Node keeps no session cache): a resumed session keeps the
 *   peer certificate and verdict of its first handshake, which a reloaded CA or CRL would not see;
 * - no renegotiation (TLS 1.2; 1.3 has none): a client cannot swap its certificate mid-connection.
 */
function secureOptions(pem: TlsPem): https.ServerOptions {
  const clients = pem.clientCertificates;
  if (!clients) return { cert: pem.certPem, key: pem.keyPem };
  return {
    cert: pem.certPem,
    key: pem.keyPem,
    ca: clients.caPem,
    crl: clients.crlPem === undefined ? undefined : splitCrls(clients.crlPem),
    secureOptions: constants.SSL_OP_NO_TICKET | constants.SSL_OP_NO_RENEGOTIATION,
  };
}

/**
 * The client-certificate settings a TLS connection was accepted under (`none` without client
 * certificates); `retired` once a reload replaced them.
 */
interface Trust {
  readonly settings: string;
  retired: boolean;
}
const trustOf = new WeakMap<Socket, Trust>();
/** Each accepted TCP connection's trust, taken as Node wraps it in TLS with the context of that moment. */
const trustAtAccept = new WeakMap<Socket, Trust>();
/** The settings of a listener that asks for no client certificate. */
const NO_CLIENT_CERTIFICATES = 'none';
/** For a connection whose trust cannot be told: its certificate never counts (fail closed). */
const UNKNOWN_TRUST: Trust = { settings: 'unknown', retired: true };

/** What a connection's client certificate says, worked out once per connection (renegotiation is off). */
const examined = new WeakMap<Socket, PeerCertificate>();

export interface VerifiedCertificate {
  /** SHA-256 of the DER, lowercase hex without colons. */
  sha256: string;
  /** subjectAltName URIs and DNS names, and the subject's CNs, as the certificate holds them. */
  uris: string[];
  dnsNames: string[];
  commonNames: string[];
  notBefore: number;
  notAfter: number;
}

export type PeerCertificate =
  | { state: 'none' }
  /** `reason`: for the log only (OpenSSL's verdict, or why it no longer holds). */
  | { state: 'refused'; reason: string }
  | { state: 'verified'; certificate: VerifiedCertificate };

const NONE: PeerCertificate = { state: 'none' };

/**
 * The client certificate of the connection a request came on, as it stands now: verified by the
 * handshake against the CA and CRL in force, within its dates at this moment (a connection can
 * outlive its certificate), and opened under the client-certificate settings still in force (a
 * reload of the CA or CRL retires the connections verified under the old ones).
 */
export function peerCertificate(socket: Socket): PeerCertificate {
  const trust = trustOf.get(socket);
  if (trust === undefined) return NONE; // plain HTTP
  // Retired: whatever it presented (or did not) was judged by settings no longer in force.
  if (trust.retired)
    return { state: 'refused', reason: 'connection verified under client-certificate settings a reload replaced' };
  if (trust.settings === NO_CLIENT_CERTIFICATES) return NONE;
  let peer = examined.get(socket);
  if (peer === undefined) {
    peer = examine(socket as TLSSocket);
    examined.set(socket, peer);
  }
  if (peer.state !== 'verified') return peer;
  const now = Date.now();
  const { notBefore, notAfter } = peer.certificate;
  if (now >= notAfter) return { state: 'refused', reason: `expired at ${new Date(notAfter).toISOString()}` };
  if (now < notBefore) return { state: 'refused', reason: `not valid before ${new Date(notBefore).toISOString()}` };
  return peer;
}

/**
 * Whether a connection was accepted under client-certificate settings a reload has replaced: it
 * takes no further request, and a WebSocket on it closes (whatever credential opened it).
 */
export function connectionRetired(socket: Socket): boolean {
  return trustOf.get(socket)?.retired === true;
}

function examine(socket: TLSSocket): PeerCertificate {
  const x509 = socket.getPeerX509Certificate();
  if (x509 === undefined) return NONE;
  // Under `optional` Node completes the handshake whatever the certificate: its verdict is here.
  if (!socket.authorized)
    return { state: 'refused', reason: `refused in the handshake: ${String(socket.authorizationError)}` };
  let names: string[];
  try {
    names = x509.subjectAltName === undefined ? [] : splitAltNames(x509.subjectAltName);
  } catch {
    return { state: 'refused', reason: 'subjectAltName unreadable' }; // Node's own text: never expected
  }
  return {
    state: 'verified',
    certificate: {
      sha256: x509.fingerprint256.replaceAll(':', '').toLowerCase(),
      uris: names.flatMap((n) => (n.startsWith('URI:') ? [n.slice(4)] : [])),
      dnsNames: names.flatMap((n) => (n.startsWith('DNS:') ? [n.slice(4)] : [])),
      commonNames: commonNamesOf(socket),
      notBefore: Date.parse(x509.validFrom),
      notAfter: Date.parse(x509.validTo),
    },
  };
}

function commonNamesOf(socket: TLSSocket): string[] {
  const cn = socket.getPeerCertificate().subject?.CN as string | string[] | undefined;
  return cn === undefined ? [] : Array.isArray(cn) ? cn : [cn];
}

// eslint-disable-next-line no-control-regex -- a JSON string excludes control characters
const JSON_STRING = /^"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/;

/**
 * Node's subjectAltName text split into its `TYPE:value` entries. Entries are joined by ", ", and
 * since CVE-2021-44532 a value holding a separator or quote is written as a JSON string, so
 * `URI:"a, DNS:b"` is one URI (Node's own splitEscapedAltNames, in lib/tls.js): a SAN value can
 * never pose as another entry.
 */
export function splitAltNames(text: string): string[] {
  const entries: string[] = [];
  let current = '';
  let offset = 0;
  while (offset < text.length) {
    const separator = text.indexOf(', ', offset);
    const quote = text.indexOf('"', offset);
    if (quote !== -1 && (separator === -1 || quote < separator)) {
      current += text.slice(offset, quote);
      const quoted = JSON_STRING.exec(text.slice(quote));
      if (!quoted) throw new Error('malformed subjectAltName text');
      current += JSON.parse(quoted[0]) as string;
      offset = quote + quoted[0].length;
    } else if (separator !== -1) {
      entries.push(current + text.slice(offset, separator));
      current = '';
      offset = separator + 2;
    } else {
      entries.push(current + text.slice(offset));
      current = '';
      offset = text.length;
    }
  }
  if (current !== '') entries.push(current);
  return entries;
}

/** Hands the pair to `use` (a server, or a context built from it); returns the leaf's notAfter and what was read. */
function loadTls(
  name: string,
  tls: TlsFiles | TlsPem,
  use: (options: https.ServerOptions) => void,
): { notAfter: number; pem: TlsPem } {
  const pem = 'certPem' in tls ? tls : readTlsPem(name, tls);
  try {
    const notAfter = Date.parse(new X509Certificate(pem.certPem).validTo); // the first certificate of a chain: the leaf
    use(secureOptions(pem));
    return { notAfter, pem };
  } catch (err) {
    const clients = 'certPem' in tls ? undefined : tls.clientCertificates;
    const what =
      'certPem' in tls
        ? 'the pair the primary read'
        : `${tls.cert} and ${tls.key}${clients ? ` (client certificates: ${[clients.ca, clients.crl].filter(Boolean).join(', ')})` : ''}`;
    throw new UsageError(`${name}: cannot serve TLS with ${what}: ${(err as Error).message}`);
  }
}

/**
 * An HTTPS server serving `tls`; `onTrustRetired` is called when a replace changed the
 * client-certificate settings (the listener then closes the connections verified under the old ones).
 */
export function httpsServer(
  name: string,
  tls: TlsFiles | TlsPem,
  options: http.ServerOptions,
  serve: http.RequestListener,
  onTrustRetired: (isRetired: (socket: Socket) => boolean) => void,
): { server: https.Server; certificate: ServedCertificate } {
  let server: https.Server | undefined;
  let trust: Trust = { settings: NO_CLIENT_CERTIFICATES, retired: false };
  const verifyClients = (settings: TlsPem['clientCertificates']) => {
    // Node reads these two for each new connection (tlsConnectionListener), so a reload can change them.
    Object.assign(server!, { requestCert: settings !== undefined, rejectUnauthorized: settings?.mode === 'required' });
    trust = { settings: settings ? JSON.stringify(settings) : NO_CLIENT_CERTIFICATES, retired: false };
  };
  const first = loadTls(name, tls, (secure) => {
    server = https.createServer({ ...options, ...secure }, serve);
  });
  verifyClients(first.pem.clientCertificates);
  // Node wraps each TCP connection in TLS with the context in force when it is accepted, not when
  // its handshake ends: one accepted before a reload and shaken hands after was verified with the
  // old CA and CRL (a client can stall its handshake past a CRL reload). So the trust is taken at
  // accept, in the same tick as Node's own 'connection' listener, and found again from the TLS
  // socket's raw one at 'secureConnection' (before the listener's own handlers).
  // A handshake that ends after a reload replaced the settings it was accepted under is closed at
  // once: it was judged by the old ones (a connection stalled across an optional → required reload
  // got through without a certificate, found by an outside attack).
  server!.on('connection', (raw: Socket) => {
    trustAtAccept.set(raw, trust);
  });
  server!.prependListener('secureConnection', (socket: TLSSocket) => {
    const raw = (socket as unknown as { _handle?: { _parentWrap?: Socket } })._handle?._parentWrap;
    const accepted = (raw && trustAtAccept.get(raw)) || UNKNOWN_TRUST;
    trustOf.set(socket, accepted);
    if (accepted.retired && accepted !== UNKNOWN_TRUST) socket.destroy();
  });
  const certificate: ServedCertificate = {
    notAfter: first.notAfter,
    replace(next) {
      // setSecureContext builds the whole context before it swaps: a key that is not the cert's throws first.
      const loaded = loadTls(name, next, (secure) => server!.setSecureContext(secure));
      certificate.notAfter = loaded.notAfter;
      const settings = loaded.pem.clientCertificates;
      if (trust.settings === (settings ? JSON.stringify(settings) : NO_CLIENT_CERTIFICATES)) return;
      const previous = trust;
      verifyClients(settings);
      previous.retired = true;
      onTrustRetired((socket) => trustOf.get(socket)?.retired ?? true);
    },
  };
  return { server: server!, certificate };
}
