import { createHash } from 'node:crypto';
import {
  createRemoteJWKSet,
  customFetch,
  errors,
  importSPKI,
  jwtVerify,
  type JWTPayload,
  type JWTVerifyGetKey,
  type CryptoKey,
} from 'jose';
import type { JwtConfig } from '../../config/schema.js';
import { countJwksFetch } from '../../observability/metrics.js';

/** `unavailable`: the keys could not be fetched (the identity provider is down), not a bad token. */
export type JwtCheck =
  | { ok: true; subject: string | undefined; claims: Readonly<JWTPayload> }
  | { ok: false; reason: string; unavailable?: boolean };

/**
 * A JWKS that could not be reached or read, as opposed to a token that failed: jose throws a
 * timeout, a generic error (non-200, unparsable set) or the fetch's own error for those.
 */
export function isKeySetOutage(err: unknown): boolean {
  return !(err instanceof errors.JOSEError) || err instanceof errors.JWKSTimeout || err.code === 'ERR_JOSE_GENERIC';
}

type KeySource = Uint8Array | JWTVerifyGetKey;
type CachedToken = {
  subject: string | undefined;
  claims: Readonly<JWTPayload>;
  until: number;
  kid: string | undefined;
};

/** jose's fetch, counted (gatehouse_jwks_fetches_total): any answer but 2xx is http_error, no answer unreachable. */
const fetchCounted: typeof fetch = async (url, init) => {
  let response: Response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    countJwksFetch('unreachable');
    throw err;
  }
  countJwksFetch(response.ok ? 'ok' : 'http_error');
  return response;
};
const MAX_CACHED_TOKENS = 10_000;

/**
 * Verifies bearer JWTs with jose against one key source (HMAC secret, PEM public key or JWKS URL).
 * The accepted algorithms are pinned by config, never taken from the token: `alg: none` and
 * HS256 signed with an RSA public key fail. `exp` is required; `iss`/`aud` when configured.
 */
export class JwtVerifier {
  /** sha256(token) → what its verification found, reused until `until` (bounded, oldest evicted first). */
  private readonly verified = new Map<string, CachedToken>();

  private constructor(
    private readonly settings: JwtConfig,
    private readonly key: KeySource,
    readonly source: 'secret' | 'publicKey' | 'jwksUri',
    private readonly warmUp: () => Promise<void>,
    /** For a JWKS: whether a key id is in the key set as last fetched (a rotated-out key stops counting). */
    private readonly hasKid?: (kid: string) => boolean,
    private readonly keySetLoaded: () => boolean = () => true,
  ) {}

  /** Whether the keys are in hand: always for a secret or a PEM key; for a JWKS, once a fetch has succeeded. */
  get keysLoaded(): boolean {
    return this.keySetLoaded();
  }

  static async create(settings: JwtConfig): Promise<JwtVerifier> {
    if (settings.secret !== undefined) {
      return new JwtVerifier(settings, new TextEncoder().encode(settings.secret), 'secret', async () => {});
    }
    if (settings.publicKey !== undefined) {
      const pem = settings.publicKey;
      const byAlg = new Map<string, CryptoKey>();
      for (const alg of settings.algorithms) byAlg.set(alg, await importSPKI(pem, alg));
      const getKey: JWTVerifyGetKey = (header) => {
        const key = byAlg.get(header.alg);
        if (!key) throw new errors.JOSEAlgNotAllowed('"alg" (Algorithm) Header Parameter value not allowed');
        return key;
      };
      return new JwtVerifier(settings, getKey, 'publicKey', async () => {});
    }
    const jwks = createRemoteJWKSet(new URL(settings.jwksUri!), {
      cacheMaxAge: settings.jwksCacheSeconds * 1000,
      cooldownDuration: settings.jwksCooldownSeconds * 1000,
      timeoutDuration: 5_000,
      [customFetch]: fetchCounted,
    });
    // The kids of the fetched set, for the cached-token check. jose's jwks() returns a
    // structuredClone on every call (per request, it kept cached RS256 well below HS256), so they
    // are re-read only where the set can change: after a key lookup (jose fetches inside it)
    // and after an explicit reload.
    let publishedKids = new Set<string>();
    let loaded = false;
    const readKids = () => {
      const set = jwks.jwks();
      if (set) loaded = true;
      publishedKids = new Set((set?.keys ?? []).flatMap((k) => (k.kid ? [k.kid] : [])));
    };
    const getKey: JWTVerifyGetKey = async (header, token) => {
      try {
        return await jwks(header, token);
      } finally {
        readKids();
      }
    };
    const reload = async () => {
      await jwks.reload();
      readKids();
    };
    return new JwtVerifier(
      settings,
      getKey,
      'jwksUri',
      reload,
      (kid) => publishedKids.has(kid),
      () => loaded,
    );
  }

  /** Fetches the JWKS ahead of the first request, so no request waits for it. Never throws. */
  async prefetch(): Promise<string | undefined> {
    try {
      await this.warmUp();
      return undefined;
    } catch (err) {
      return err instanceof Error ? err.message : String(err);
    }
  }

  async verify(token: string, now: number = Date.now()): Promise<JwtCheck> {
    // Clients send the same token many times: a verified one is trusted again for a short while
    // (never past its exp), keyed by its hash so no bearer token is kept in memory.
    const cacheKey = this.settings.cacheSeconds > 0 ? createHash('sha256').update(token).digest('base64') : undefined;
    if (cacheKey !== undefined) {
      const hit = this.verified.get(cacheKey);
      if (hit && hit.until > now && (this.hasKid === undefined || this.hasKid(hit.kid!)))
        return { ok: true, subject: hit.subject, claims: hit.claims };
      if (hit) this.verified.delete(cacheKey);
    }
    try {
      const options = {
        algorithms: this.settings.algorithms,
        issuer: this.settings.issuer,
        audience: this.settings.audience,
        clockTolerance: this.settings.clockToleranceSeconds,
        requiredClaims: ['exp'],
      };
      const { payload, protectedHeader } =
        typeof this.key === 'function'
          ? await jwtVerify(token, this.key, options)
          : await jwtVerify(token, this.key, options);
      const subject = typeof payload.sub === 'string' && payload.sub !== '' ? payload.sub : undefined;
      // A lone surrogate would reach the upstream as U+FFFD: two different subjects, one name.
      if (subject !== undefined && !(subject as string & { isWellFormed(): boolean }).isWellFormed())
        return { ok: false, reason: '"sub" is not well-formed Unicode' };
      if (subject === undefined && this.settings.requireSubject)
        return { ok: false, reason: 'token has no "sub" (gateway.auth.bearer.jwt.requireSubject)' };
      // From a JWKS, only tokens naming their key are remembered: the hit re-checks that key is still published.
      if (cacheKey !== undefined && (this.hasKid === undefined || protectedHeader.kid !== undefined)) {
        this.remember(cacheKey, { subject, claims: payload, until: 0, kid: protectedHeader.kid }, payload.exp!, now);
      }
      return { ok: true, subject, claims: payload };
    } catch (err) {
      const reason =
        err instanceof errors.JOSEError
          ? `${err.code}: ${err.message}`
          : `key set unreachable: ${(err as Error).message}`;
      return { ok: false, reason, unavailable: this.source === 'jwksUri' && isKeySetOutage(err) };
    }
  }

  private remember(cacheKey: string, entry: CachedToken, exp: number, now: number): void {
    entry.until = Math.min(
      exp * 1000 + this.settings.clockToleranceSeconds * 1000,
      now + this.settings.cacheSeconds * 1000,
    );
    if (entry.until <= now) return;
    if (this.verified.size >= MAX_CACHED_TOKENS) this.verified.delete(this.verified.keys().next().value!);
    this.verified.set(cacheKey, entry);
  }
}
