import type { Socket } from 'node:net';
import type { ClientCertificateConfig } from '../../config/schema.js';
import { peerCertificate, type VerifiedCertificate } from '../../http/tls.js';

export interface CertificateGrant {
  subject: string;
  scopes: readonly string[];
  /** SHA-256 of the certificate's DER, lowercase hex without colons (X-Gatehouse-Client-Cert-Sha256). */
  sha256: string;
  /** When the certificate expires (ms): a WebSocket it opened closes then. */
  notAfter: number;
}

export type CertificateCheck =
  | { ok: true; grant: CertificateGrant }
  /** `reason`: for the log only. */
  | { ok: false; reason: string };

const NO_SCOPES: readonly string[] = Object.freeze([]);

interface CompiledIdentity {
  subject: string;
  scopes: readonly string[];
  matches(certificate: VerifiedCertificate): boolean;
}

/**
 * Whether a certificate's CN may stand for it: only when it carries no SAN URI or DNS name
 * (RFC 6125 §6.4.4), and only one CN (several would be ambiguous).
 */
function soleCommonName(certificate: VerifiedCertificate): string | undefined {
  if (certificate.uris.length > 0 || certificate.dnsNames.length > 0) return undefined;
  return certificate.commonNames.length === 1 ? certificate.commonNames[0] : undefined;
}

/** ASCII-only lower case: DNS names compare in any case (RFC 6125 §6.4.1), and nothing else may fold. */
const asciiLower = (name: string) => name.replace(/[A-Z]/g, (c) => c.toLowerCase());

function compileIdentity(identity: ClientCertificateConfig['identities'][number]): CompiledIdentity {
  const { subject, uri, dns, cn } = identity;
  const scopes = identity.scopes ?? NO_SCOPES;
  if (uri !== undefined) return { subject, scopes, matches: (c) => c.uris.includes(uri) };
  if (dns !== undefined) {
    const wanted = asciiLower(dns);
    return { subject, scopes, matches: (c) => c.dnsNames.some((name) => asciiLower(name) === wanted) };
  }
  return { subject, scopes, matches: (c) => soleCommonName(c) === cn };
}

/** The longest name `subjectFrom` takes as a subject: it goes upstream in a header, and into every log line. */
export const MAX_TAKEN_SUBJECT = 256;

/**
 * The subject `subjectFrom` takes from a certificate no identity matched, when it has exactly one
 * such name, of at most MAX_TAKEN_SUBJECT characters; a wildcard DNS name names no client.
 */
function subjectOf(certificate: VerifiedCertificate, from: 'uri' | 'dns' | 'cn'): string | undefined {
  const names =
    from === 'cn'
      ? [soleCommonName(certificate)].filter((name) => name !== undefined)
      : from === 'uri'
        ? certificate.uris
        : certificate.dnsNames.map(asciiLower);
  if (names.length !== 1) return undefined;
  const name = names[0]!;
  if (name.length > MAX_TAKEN_SUBJECT || (from === 'dns' && name.includes('*'))) return undefined;
  return name;
}

/**
 * The client certificate as a credential (`gateway.auth.clientCertificate`): the connection's
 * certificate, verified by the handshake (src/http/tls.ts), matched against `identities` in
 * order, exactly; else, with `subjectFrom`, named by that one field.
 */
export class ClientCertificateVerifier {
  private readonly identities: CompiledIdentity[];
  /**
   * The subjects of the listed identities and the API keys' ids (a key's subject): a certificate
   * admitted by `subjectFrom` may not pose as one of them upstream, nor share their per-subject limits.
   */
  private readonly listedSubjects: ReadonlySet<string>;

  constructor(
    private readonly settings: ClientCertificateConfig,
    keyIds: Iterable<string> = [],
  ) {
    this.identities = settings.identities.map(compileIdentity);
    this.listedSubjects = new Set([...settings.identities.map((identity) => identity.subject), ...keyIds]);
  }

  get size(): number {
    return this.identities.length;
  }

  /** undefined: no certificate on this connection. */
  verify(socket: Socket | undefined): CertificateCheck | undefined {
    if (socket === undefined) return undefined;
    const peer = peerCertificate(socket);
    if (peer.state === 'none') return undefined;
    if (peer.state === 'refused') return { ok: false, reason: `client certificate ${peer.reason}` };
    const { certificate } = peer;
    const grant = (subject: string, scopes: readonly string[]): CertificateCheck => ({
      ok: true,
      grant: { subject, scopes, sha256: certificate.sha256, notAfter: certificate.notAfter },
    });
    for (const identity of this.identities)
      if (identity.matches(certificate)) return grant(identity.subject, identity.scopes);
    const from = this.settings.subjectFrom;
    const subject = from === undefined ? undefined : subjectOf(certificate, from);
    if (subject !== undefined && this.listedSubjects.has(subject))
      return {
        ok: false,
        reason: `client certificate ${certificate.sha256} matches no identity, and its ${from} ${JSON.stringify(subject)} is the subject of an identity or an API key (${describe(certificate)})`,
      };
    if (subject !== undefined) return grant(subject, NO_SCOPES);
    return {
      ok: false,
      reason: `client certificate ${certificate.sha256} matches no identity${from ? ` and has no single ${from} to take the subject from (none, several, a wildcard, or over ${MAX_TAKEN_SUBJECT} characters)` : ''} (${describe(certificate)})`,
    };
  }
}

/** Names shown per certificate in the log, and characters per name: a certificate can carry any number of any length. */
const SHOWN_NAMES = 8;
const SHOWN_CHARACTERS = 200;

/** What a certificate is called, for the log: its SANs and CNs, JSON-quoted (a value may hold anything), bounded. */
function describe(certificate: VerifiedCertificate): string {
  const quote = (name: string) =>
    JSON.stringify(name.length > SHOWN_CHARACTERS ? `${name.slice(0, SHOWN_CHARACTERS)}…` : name);
  const parts = [
    ...certificate.uris.map((u) => `URI ${quote(u)}`),
    ...certificate.dnsNames.map((d) => `DNS ${quote(d)}`),
    ...certificate.commonNames.map((c) => `CN ${quote(c)}`),
  ];
  if (parts.length === 0) return 'no SAN URI, DNS or CN';
  const more = parts.length - SHOWN_NAMES;
  return parts.slice(0, SHOWN_NAMES).join(', ') + (more > 0 ? `, and ${more} more` : '');
}
