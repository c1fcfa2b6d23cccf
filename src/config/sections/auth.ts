import { z } from 'zod';
import { API_KEY_PREFIX, hasValidKeyChecksum } from '../../gateway/credentials/api-key.js';
import { addressRange, httpUrl, methods, pathPatterns, positiveInt, rateLimitQuota, scopeToken } from './common.js';

// `gateway.auth`: credentials (API keys, bearer JWTs), the client IP allow-list, the lockout, and authorization rules (issue 16).

const KEY_ID = /^[A-Za-z0-9._:-]{1,64}$/;
const KEY_HASH = /^sha256:[0-9a-f]{64}$/;
const apiKeyEntry = z.strictObject({
  id: z.string().regex(KEY_ID, 'key id: 1-64 characters of A-Z a-z 0-9 . _ : -'),
  hash: z.string().regex(KEY_HASH, 'hash must be "sha256:" followed by 64 lowercase hex digits'),
  expiresAt: z.iso.datetime({ offset: true, message: 'expiresAt must be an ISO 8601 date-time, e.g. 2027-01-01T00:00:00Z' }).optional(),
  /** What this key may do (gateway.auth.rules); sent upstream as X-Gatehouse-Scopes. */
  scopes: z.array(scopeToken).optional(),
  /** Replaces the `by: "key"` entries of gateway.rateLimits for this key. */
  rateLimit: z.strictObject(rateLimitQuota).optional(),
});

type ApiKeyEntry = z.output<typeof apiKeyEntry>;

/** An entry with exactly `id` and `hash`, both well-formed (the shape `api-key generate` prints). */
function isPlainApiKeyEntry(entry: unknown): entry is ApiKeyEntry {
  if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) return false;
  const { id, hash } = entry as Record<string, unknown>;
  let fields = 0;
  for (const _ in entry) fields++;
  return fields === 2 && typeof id === 'string' && typeof hash === 'string' && KEY_ID.test(id) && KEY_HASH.test(hash);
}

const hmacAlgorithms = ['HS256', 'HS384', 'HS512'] as const;
const asymmetricAlgorithms = ['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'ES256', 'ES384', 'ES512', 'EdDSA'] as const;

export const jwtSettings = z
  .strictObject({
    issuer: z.string().min(1).optional(),
    audience: z.union([z.string().min(1), z.array(z.string().min(1)).min(1)]).optional(),
    jwksUri: httpUrl('jwksUri').optional(),
    secret: z.string().min(32, 'an HMAC secret must be at least 32 characters').optional(),
    publicKey: z.string().includes('-----BEGIN', { message: 'publicKey must be a PEM (SPKI) public key' }).optional(),
    algorithms: z.array(z.enum([...hmacAlgorithms, ...asymmetricAlgorithms])).min(1).optional(),
    clockToleranceSeconds: z.number().int().min(0).max(300).default(30),
    /** How long fetched JWKS keys are trusted, and the minimum time between two fetches (key rotation). */
    jwksCacheSeconds: positiveInt.default(600),
    jwksCooldownSeconds: z.number().int().min(0).default(30),
    /** How long a verified token is trusted again without re-verifying (never past its exp); 0 disables. */
    cacheSeconds: z.number().int().min(0).max(3600).default(30),
    /** Refuse tokens without a non-empty string `sub`, so the upstream always learns who called. */
    requireSubject: z.boolean().default(true),
  })
  .superRefine((jwt, ctx) => {
    const sources = (['jwksUri', 'secret', 'publicKey'] as const).filter((k) => jwt[k] !== undefined);
    if (sources.length !== 1) {
      ctx.addIssue({ code: 'custom', message: `exactly one of jwksUri, secret or publicKey is required (got ${sources.length ? sources.join(', ') : 'none'})` });
      return;
    }
    const hmac = jwt.secret !== undefined;
    for (const [i, alg] of (jwt.algorithms ?? []).entries()) {
      const isHmac = (hmacAlgorithms as readonly string[]).includes(alg);
      // A public key must never verify HS* tokens (the classic alg-confusion attack), nor a secret RS*.
      if (isHmac !== hmac) {
        ctx.addIssue({ code: 'custom', path: ['algorithms', i], message: `${alg} cannot be used with ${sources[0]}` });
      }
    }
  })
  .transform((jwt) => ({ ...jwt, algorithms: jwt.algorithms ?? (jwt.secret !== undefined ? ['HS256'] : ['RS256']) }));

const failures = z.strictObject({
  max: positiveInt.default(10),
  windowSeconds: positiveInt.default(60),
  lockoutSeconds: positiveInt.default(300),
});

export const auth = z.strictObject({
  enabled: z.boolean().default(true),
  allowInsecure: z.boolean().default(false),
  apiKey: z.string().min(32, 'apiKey must be at least 32 characters').regex(/^[^\s,]+$/, 'apiKey must not contain blanks or commas')
    // Presented gth_ keys are checksum-checked before lookup, so a hand-made one could never match.
    .refine((key) => !key.startsWith(API_KEY_PREFIX) || hasValidKeyChecksum(key), `an apiKey starting with "${API_KEY_PREFIX}" must be a generated key (its checksum does not match)`)
    .optional(),
  apiKeys: z.array(z.unknown()).default([]).transform((entries, ctx) => {
    const keys: ApiKeyEntry[] = [];
    const seen = new Map<string, number>();
    entries.forEach((entry, i) => {
      // Scale (100,000 keys): a well-formed entry is checked by hand and kept as it is; zod's
      // per-object parse cost 160 ms and 33 MB of short-lived garbage that stayed in the RSS.
      // Anything else goes through the schema for its exact error.
      let key: ApiKeyEntry;
      if (isPlainApiKeyEntry(entry)) key = entry;
      else {
        const parsed = apiKeyEntry.safeParse(entry);
        if (!parsed.success) {
          for (const issue of parsed.error.issues) ctx.addIssue({ ...issue, path: [i, ...issue.path] } as z.core.$ZodRawIssue);
          return;
        }
        key = parsed.data;
      }
      const first = seen.get(key.id);
      if (first !== undefined) ctx.addIssue({ code: 'custom', path: [i, 'id'], message: `duplicate key id "${key.id}" (also at apiKeys[${first}])` });
      else seen.set(key.id, i);
      keys.push(key);
    });
    return keys;
  }),
  bearer: z.strictObject({ jwt: jwtSettings }).optional(),
  require: z.enum(['any', 'all']).default('any'),
  allowedIPs: z.array(addressRange).optional(),
  failures: failures.prefault({}),
  /** Forward X-API-Key and the bearer Authorization header upstream (default: stripped). */
  forwardCredentials: z.boolean().default(false),
  /** Every rule whose paths and methods match a request must be satisfied (src/gateway/authorize.ts). */
  rules: z.array(z.strictObject({
    paths: pathPatterns,
    methods: methods.optional(),
    scopes: z.array(scopeToken).min(1).optional(),
    /** Top-level JWT claims: equal to the value, or (an array claim) containing it. */
    claims: z.record(z.string().min(1), z.string()).optional(),
  }).refine((rule) => rule.scopes !== undefined || (rule.claims !== undefined && Object.keys(rule.claims).length > 0), 'a rule needs scopes or claims (what it requires)')).default([]),
  /** A request no rule matches: allowed (true, the default) or refused 403. */
  defaultAllow: z.boolean().default(true),
});
