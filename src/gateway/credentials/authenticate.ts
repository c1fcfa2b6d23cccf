import type { IncomingMessage } from 'node:http';
import type { AuthConfig } from '../../config/schema.js';
import { HttpError } from '../../errors.js';
import type { JWTPayload } from 'jose';
import { ApiKeyVerifier, hashApiKey, PLAIN_API_KEY_ID, type ApiKeyGrant } from './api-key.js';
import { ClientCertificateVerifier, type CertificateGrant } from './client-certificate.js';
import { JwtVerifier } from './jwt.js';

export type AuthMethod = 'api-key' | 'bearer' | 'client-certificate';

/** Who the request is, as gatehouse tells the upstream. */
export interface Identity {
  methods: AuthMethod[];
  /** JWT `sub` when a token passed, else the client certificate's subject, else the API key id. */
  subject: string | undefined;
  keyId: string | undefined;
  /** What the credentials grant: the API key's `scopes`, the JWT's `scope`/`scp` and the certificate's, together. */
  scopes: readonly string[];
  /** The verified JWT's claims (rules' `claims` are checked against them); undefined without a token. */
  claims: Readonly<JWTPayload> | undefined;
  /** The API key's own rate limit (`apiKeys[].rateLimit`), replacing the `by: "key"` limits. */
  keyRateLimit: ApiKeyGrant['rateLimit'];
  /** The client certificate that authenticated, when one did. */
  clientCertificate?: { sha256: string; notAfter: number };
}

const NO_SCOPES: readonly string[] = Object.freeze([]);
/** RFC 6749 §3.3 scope-token: what a scope may be (anything else in a token is ignored). */
const SCOPE_TOKEN = /^[\x21\x23-\x5b\x5d-\x7e]{1,128}$/;

/**
 * A token's scopes: `scope` (RFC 8693 §4.2, space-separated) and `scp` (an array, as Okta; or a
 * space-separated string, as Entra ID), together. Values that are not scope-tokens are dropped:
 * no configured scope can equal them, and they never reach X-Gatehouse-Scopes.
 */
export function scopesOfClaims(claims: Readonly<JWTPayload>): string[] {
  const found: string[] = [];
  const add = (value: unknown) => {
    if (typeof value === 'string') {
      for (const part of value.split(' ')) if (SCOPE_TOKEN.test(part) && !found.includes(part)) found.push(part);
    }
  };
  add(claims.scope);
  if (Array.isArray(claims.scp))
    for (const item of claims.scp) add(typeof item === 'string' && !item.includes(' ') ? item : undefined);
  else add(claims.scp);
  return found;
}

export type AuthOutcome =
  | { ok: true; identity: Identity }
  /** `presentedBadCredential`: a credential was offered and failed (counts toward the lockout). */
  | { ok: false; error: HttpError; presentedBadCredential: boolean };

const CHALLENGE = 'Bearer realm="gatehouse"';
const INVALID_TOKEN_CHALLENGE = 'Bearer realm="gatehouse", error="invalid_token"';
// RFC 6750's b64token, narrowed to a compact JWS (RFC 7515 §7.1).
const BEARER = /^bearer +([A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*) *$/i;
const TIMING_FILLER = 'gth_timing-filler-for-missing-credentials';

/** Checks X-API-Key, Authorization: Bearer and the client certificate under `require: any | all`. */
export class Authenticator {
  private constructor(
    private readonly auth: AuthConfig,
    private readonly apiKeys: ApiKeyVerifier,
    readonly jwt: JwtVerifier | undefined,
    private readonly certificates: ClientCertificateVerifier | undefined,
  ) {}

  static async create(auth: AuthConfig): Promise<Authenticator> {
    const jwt = auth.bearer ? await JwtVerifier.create(auth.bearer.jwt) : undefined;
    const keyIds = [...(auth.apiKey !== undefined ? [PLAIN_API_KEY_ID] : []), ...auth.apiKeys.map((key) => key.id)];
    const certificates = auth.clientCertificate
      ? new ClientCertificateVerifier(auth.clientCertificate, keyIds)
      : undefined;
    return new Authenticator(auth, new ApiKeyVerifier(auth), jwt, certificates);
  }

  /** The methods a request can use; for the start-up log. */
  get methods(): string[] {
    const methods: string[] = [];
    if (this.apiKeys.size > 0) methods.push(`api-key (${this.apiKeys.size} key${this.apiKeys.size === 1 ? '' : 's'})`);
    if (this.jwt) methods.push(`bearer (jwt via ${this.jwt.source})`);
    if (this.certificates) {
      const { size } = this.certificates;
      const from = this.auth.clientCertificate?.subjectFrom;
      methods.push(
        `client-certificate (${size} identit${size === 1 ? 'y' : 'ies'}${from ? `, others by ${from}` : ''})`,
      );
    }
    return methods;
  }

  async authenticate(req: IncomingMessage): Promise<AuthOutcome> {
    if (!this.auth.enabled)
      return {
        ok: true,
        identity: {
          methods: [],
          subject: undefined,
          keyId: undefined,
          scopes: NO_SCOPES,
          claims: undefined,
          keyRateLimit: undefined,
        },
      };

    const wantKey = this.apiKeys.size > 0;
    const wantBearer = this.jwt !== undefined;
    const wantCertificate = this.certificates !== undefined;
    const rawKey = wantKey ? req.headers['x-api-key'] : undefined;
    const token = wantBearer ? bearerToken(req) : undefined;

    let keyFailure: string | undefined;
    let keyId: string | undefined;
    let grant: ApiKeyGrant | undefined;
    if (rawKey !== undefined) {
      // Several X-API-Key headers arrive joined by ", "; keys never contain a comma or blank.
      if (typeof rawKey !== 'string' || rawKey.trim() === '' || /[\s,]/.test(rawKey))
        keyFailure = 'empty, blank or several X-API-Key values';
      else {
        const check = this.apiKeys.verify(rawKey);
        if (check.ok) {
          keyId = check.id;
          grant = check.grant;
        } else keyFailure = `api key ${check.reason}`;
      }
    } else {
      hashApiKey(TIMING_FILLER); // missing and wrong keys cost the same
    }

    let tokenFailure: string | undefined;
    let keysUnavailable = false;
    let subject: string | undefined;
    let tokenOk = false;
    let claims: Readonly<JWTPayload> | undefined;
    if (token !== undefined) {
      if (token === null) tokenFailure = 'malformed or repeated Authorization header';
      else {
        const check = await this.jwt!.verify(token);
        if (check.ok) {
          tokenOk = true;
          subject = check.subject;
          claims = check.claims;
        } else {
          tokenFailure = check.reason;
          keysUnavailable = check.unavailable === true;
        }
      }
    }

    // The handshake verified it (or, under `optional`, said why not); here it is matched to an identity.
    const certificate = this.certificates?.verify(req.socket);
    const certificateGrant: CertificateGrant | undefined = certificate?.ok ? certificate.grant : undefined;

    // Any credential offered and wrong fails the request, also under `any`: no riding along.
    if (certificate && !certificate.ok)
      return {
        ok: false,
        error: new HttpError('invalid_client_certificate', certificate.reason, { 'www-authenticate': CHALLENGE }),
        presentedBadCredential: true,
      };
    if (keyFailure)
      return {
        ok: false,
        error: new HttpError('invalid_api_key', keyFailure, { 'www-authenticate': CHALLENGE }),
        presentedBadCredential: true,
      };
    // The identity provider being down is not the client's failure: 503, and no lockout count.
    if (tokenFailure && keysUnavailable)
      return {
        ok: false,
        error: new HttpError('auth_unavailable', tokenFailure, { 'retry-after': '5' }),
        presentedBadCredential: false,
      };
    if (tokenFailure)
      return {
        ok: false,
        error: new HttpError('invalid_token', tokenFailure, { 'www-authenticate': INVALID_TOKEN_CHALLENGE }),
        presentedBadCredential: true,
      };

    const methods: AuthMethod[] = [];
    if (keyId !== undefined) methods.push('api-key');
    if (tokenOk) methods.push('bearer');
    if (certificateGrant) methods.push('client-certificate');
    const complete =
      this.auth.require === 'all'
        ? (!wantKey || keyId !== undefined) &&
          (!wantBearer || tokenOk) &&
          (!wantCertificate || certificateGrant !== undefined) &&
          methods.length > 0
        : methods.length > 0;
    if (!complete) {
      return {
        ok: false,
        error: new HttpError(
          'missing_credentials',
          `require ${this.auth.require}: got ${methods.join(', ') || 'none'}`,
          { 'www-authenticate': CHALLENGE },
        ),
        presentedBadCredential: false,
      };
    }
    const tokenScopes = claims ? scopesOfClaims(claims) : NO_SCOPES;
    const keyScopes = grant?.scopes ?? NO_SCOPES;
    let scopes =
      tokenScopes.length === 0
        ? keyScopes
        : keyScopes.length === 0
          ? tokenScopes
          : [...new Set([...keyScopes, ...tokenScopes])];
    if (certificateGrant && certificateGrant.scopes.length > 0)
      scopes = scopes.length === 0 ? certificateGrant.scopes : [...new Set([...scopes, ...certificateGrant.scopes])];
    return {
      ok: true,
      identity: {
        methods,
        subject: subject ?? certificateGrant?.subject ?? keyId,
        keyId,
        scopes,
        claims,
        keyRateLimit: grant?.rateLimit,
        clientCertificate: certificateGrant && { sha256: certificateGrant.sha256, notAfter: certificateGrant.notAfter },
      },
    };
  }
}

/**
 * undefined: no bearer credential; null: an Authorization header that claims Bearer but is
 * unusable. Anything starting like the scheme counts as a claim (`Bearer,x`, `BearerX y`): it is
 * checked, never waved through to an upstream that might read it leniently. The token must be a
 * JWS in compact form (RFC 7515 §7.1: base64url without padding), so one token has one spelling.
 */
function bearerToken(req: IncomingMessage): string | null | undefined {
  // Node keeps only the first of several Authorization headers; we refuse the ambiguity instead,
  // whatever the first one's scheme (a `Basic` line first hid a `Bearer` line behind it).
  if ((req.headersDistinct.authorization?.length ?? 0) > 1) return null;
  const header = req.headers.authorization;
  if (header === undefined || !/^\s*bearer/i.test(header)) return undefined;
  return BEARER.exec(header)?.[1] ?? null;
}
