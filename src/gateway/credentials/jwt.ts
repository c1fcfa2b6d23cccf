import { createRemoteJWKSet, errors, importSPKI, jwtVerify, type JWTVerifyGetKey, type CryptoKey } from 'jose';
import type { JwtConfig } from '../../config/schema.js';

export type JwtCheck = { ok: true; subject: string | undefined } | { ok: false; reason: string };

type KeySource = Uint8Array | JWTVerifyGetKey;

/**
 * Verifies bearer JWTs with jose against one key source (HMAC secret, PEM public key or JWKS URL).
 * The accepted algorithms are pinned by config, never taken from the token: `alg: none` and
 * HS256 signed with an RSA public key fail. `exp` is required; `iss`/`aud` when configured.
 */
export class JwtVerifier {
  private constructor(
    private readonly settings: JwtConfig,
    private readonly key: KeySource,
    readonly source: 'secret' | 'publicKey' | 'jwksUri',
    private readonly warmUp: () => Promise<void>,
  ) {}

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
    });
    return new JwtVerifier(settings, jwks, 'jwksUri', () => jwks.reload());
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

  async verify(token: string): Promise<JwtCheck> {
    try {
      const options = {
        algorithms: this.settings.algorithms,
        issuer: this.settings.issuer,
        audience: this.settings.audience,
        clockTolerance: this.settings.clockToleranceSeconds,
        requiredClaims: ['exp'],
      };
      const { payload } = typeof this.key === 'function'
        ? await jwtVerify(token, this.key, options)
        : await jwtVerify(token, this.key, options);
      return { ok: true, subject: typeof payload.sub === 'string' ? payload.sub : undefined };
    } catch (err) {
      return { ok: false, reason: err instanceof errors.JOSEError ? `${err.code}: ${err.message}` : 'invalid token' };
    }
  }
}
