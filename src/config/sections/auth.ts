import { z } from 'zod';
import { API_KEY_PREFIX, hasValidKeyChecksum, PLAIN_API_KEY_ID } from '../../gateway/credentials/api-key.js';
import {
  addressRange,
  httpUrl,
  methods,
  pathPatterns,
  positiveInt,
  rateLimitQuota,
  scopeToken,
  writtenAs,
} from './common.js';

// `gateway.auth`: credentials (API keys, bearer JWTs), the client IP allow-list, the lockout, and authorization rules (issue 16).

const KEY_ID = /^[A-Za-z0-9._:-]{1,64}$/;
const KEY_HASH = /^sha256:[0-9a-f]{64}$/;
const apiKeyEntry = z.strictObject({
  id: z
    .string()
    .regex(KEY_ID, 'key id: 1-64 characters of A-Z a-z 0-9 . _ : -')
    .describe(
      "The key's name, unique: 1-64 characters of `A-Z a-z 0-9 . _ : -`. Logged, and sent upstream in `X-Gatehouse-Key-Id`.",
    ),
  hash: z
    .string()
    .regex(KEY_HASH, 'hash must be "sha256:" followed by 64 lowercase hex digits')
    .describe(
      '`"sha256:"` and the key\'s SHA-256 in 64 lowercase hex digits, as `gatehouse api-key generate` prints it; the key itself is never in the config.',
    ),
  expiresAt: z.iso
    .datetime({ offset: true, message: 'expiresAt must be an ISO 8601 date-time, e.g. 2027-01-01T00:00:00Z' })
    .optional()
    .describe('When the key stops working (`2027-01-01T00:00:00Z`); `config check` warns 7 days before. Unset: never.'),
  scopes: z
    .array(scopeToken)
    .optional()
    .describe(
      'What the key may do, as `gateway.auth.rules` ask for it; sent upstream in `X-Gatehouse-Scopes`. Unset: no scopes.',
    ),
  rateLimit: z
    .strictObject(rateLimitQuota)
    .optional()
    .describe(
      'This key\'s own limit, in place of the `by: "key"` entries of `gateway.rateLimits` (the `subject` and `ip` ones still apply). Unset: those apply.',
    ),
});

type ApiKeyEntry = z.output<typeof apiKeyEntry>;
// Items are parsed by hand in `apiKeys` (for speed), so the schema sees `unknown`: writtenAs gives the JSON Schema their shape.
const apiKeyItem = z.unknown();
writtenAs.set(apiKeyItem, apiKeyEntry);

/** An entry with exactly `id` and `hash`, both well-formed (the shape `api-key generate` prints). */
function isPlainApiKeyEntry(entry: unknown): entry is ApiKeyEntry {
  if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) return false;
  const { id, hash } = entry as Record<string, unknown>;
  let fields = 0;
  for (const _ in entry) fields++;
  return fields === 2 && typeof id === 'string' && typeof hash === 'string' && KEY_ID.test(id) && KEY_HASH.test(hash);
}

const hmacAlgorithms = ['HS256', 'HS384', 'HS512'] as const;
const asymmetricAlgorithms = [
  'RS256',
  'RS384',
  'RS512',
  'PS256',
  'PS384',
  'PS512',
  'ES256',
  'ES384',
  'ES512',
  'EdDSA',
] as const;

export const jwtSettings = z
  .strictObject({
    issuer: z.string().min(1).optional().describe('The `iss` a token must carry. Unset: not checked.'),
    audience: z
      .union([z.string().min(1), z.array(z.string().min(1)).min(1)])
      .optional()
      .describe(
        'The `aud` a token must carry (any one of a list). Unset: not checked, and with `jwksUri` a warning: a provider signs the tokens of all its clients with the same keys.',
      ),
    jwksUri: httpUrl('jwksUri')
      .optional()
      .describe(
        'The JWKS URL of the identity provider that signs the tokens. Exactly one of `jwksUri`, `secret` and `publicKey` is required.',
      ),
    secret: z
      .string()
      .min(32, 'an HMAC secret must be at least 32 characters')
      .optional()
      .describe(
        'An HMAC key for HS256/384/512 tokens, 32 or more characters (`"${JWT_SECRET}"` or `{ file }`). Exactly one of `jwksUri`, `secret` and `publicKey`.',
      ),
    publicKey: z
      .string()
      .includes('-----BEGIN', { message: 'publicKey must be a PEM (SPKI) public key' })
      .optional()
      .meta({
        description:
          'A PEM (SPKI) public key for RS*, PS*, ES* or EdDSA tokens, usually `{ file }`. Exactly one of `jwksUri`, `secret` and `publicKey`.',
        docsType: 'PEM text',
      }),
    // A public key must never verify HS* tokens (the classic alg-confusion attack), nor a secret RS*: see superRefine.
    algorithms: z
      .array(z.enum([...hmacAlgorithms, ...asymmetricAlgorithms]))
      .min(1)
      .optional()
      .meta({
        description:
          'The accepted `alg` values, pinned (a token\'s own `alg` is never trusted): HS* only with `secret`, the others only without. Unset: `["HS256"]` with `secret`, else `["RS256"]`.',
        docsDefault: '`["HS256"]` with `secret`, else `["RS256"]`',
      }),
    clockToleranceSeconds: z
      .number()
      .int()
      .min(0)
      .max(300)
      .default(30)
      .describe('Seconds of leeway for `exp` and `nbf` (clock skew).'),
    jwksCacheSeconds: positiveInt
      .default(600)
      .describe('Seconds fetched JWKS keys are used before they are fetched again.'),
    jwksCooldownSeconds: z
      .number()
      .int()
      .min(0)
      .default(30)
      .describe(
        'The least seconds between two JWKS fetches (a token with an unknown `kid` triggers one, for key rotation).',
      ),
    cacheSeconds: z
      .number()
      .int()
      .min(0)
      .max(3600)
      .default(30)
      .describe(
        'Seconds a verified token is accepted again without verifying it (never past its `exp`; with a JWKS, only while its `kid` is still there); `0` verifies every request.',
      ),
    requireSubject: z
      .boolean()
      .default(true)
      .describe(
        'Refuse (401 `invalid_token`) a token without a non-empty string `sub`, so the upstream always learns who called; `false` lets it through with no `X-Gatehouse-Subject`.',
      ),
  })
  .superRefine((jwt, ctx) => {
    const sources = (['jwksUri', 'secret', 'publicKey'] as const).filter((k) => jwt[k] !== undefined);
    if (sources.length !== 1) {
      ctx.addIssue({
        code: 'custom',
        message: `exactly one of jwksUri, secret or publicKey is required (got ${sources.length ? sources.join(', ') : 'none'})`,
      });
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

/** An exact DNS name (RFC 1123 labels): no wildcard, no trailing dot; compared in any case (RFC 6125 §6.4.1). */
const DNS_NAME =
  /^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;
/** An absolute URI (a scheme, then no blanks or control characters), compared byte for byte. */
const ABSOLUTE_URI = /^[A-Za-z][A-Za-z0-9+.-]*:[\x21-\x7e]+$/;
const certificateIdentity = z
  .strictObject({
    uri: z
      .string()
      .regex(ABSOLUTE_URI, 'uri must be an absolute URI without blanks, e.g. "spiffe://corp/ns/billing/sa/api"')
      .optional()
      .describe(
        'Matches a certificate with this subjectAltName URI (e.g. a SPIFFE ID), compared exactly, byte for byte. Exactly one of `uri`, `dns` and `cn`.',
      ),
    dns: z
      .string()
      .regex(DNS_NAME, 'dns must be a DNS name without wildcard or trailing dot, e.g. "orders.internal"')
      .optional()
      .describe(
        'Matches a certificate with this subjectAltName DNS name, whole and in any case (RFC 6125); a wildcard in the certificate matches nothing. Exactly one of `uri`, `dns` and `cn`.',
      ),
    cn: z
      .string()
      .min(1)
      .optional()
      .describe(
        'Matches a certificate whose subject has exactly this one CN, compared exactly, and no subjectAltName URI or DNS name (RFC 6125 §6.4.4: with those, the CN is not an identity). Exactly one of `uri`, `dns` and `cn`.',
      ),
    subject: z
      .string()
      .min(1)
      .max(256)
      .describe('Who the certificate is: `X-Gatehouse-Subject` upstream, rate limits `by: "subject"`, the log.'),
    scopes: z
      .array(scopeToken)
      .optional()
      .describe(
        'What the certificate may do, as `rules` ask for it; sent upstream in `X-Gatehouse-Scopes`. Unset: none.',
      ),
  })
  .superRefine((identity, ctx) => {
    const given = (['uri', 'dns', 'cn'] as const).filter((k) => identity[k] !== undefined);
    if (given.length !== 1)
      ctx.addIssue({
        code: 'custom',
        message: `exactly one of uri, dns or cn is required (got ${given.length ? given.join(', ') : 'none'})`,
      });
  });

const clientCertificate = z
  .strictObject({
    identities: z
      .array(certificateIdentity)
      .default([])
      .superRefine((list, ctx) => {
        const seen = new Map<string, number>();
        list.forEach((identity, i) => {
          const kind = identity.uri !== undefined ? 'uri' : identity.dns !== undefined ? 'dns' : 'cn';
          const value = kind === 'dns' ? identity.dns!.toLowerCase() : identity[kind]!;
          const first = seen.get(`${kind} ${value}`);
          if (first !== undefined)
            ctx.addIssue({
              code: 'custom',
              path: [i, kind],
              message: `duplicate ${kind} "${identity[kind]}" (also at identities[${first}])`,
            });
          else seen.set(`${kind} ${value}`, i);
        });
      })
      .describe(
        'The certificates that authenticate, each by exactly one of `uri`, `dns` or `cn`, with the `subject` (and `scopes`) it stands for; the first that matches wins.',
      ),
    subjectFrom: z
      .enum(['uri', 'dns', 'cn'])
      .optional()
      .describe(
        'Let a valid certificate that matches no identity authenticate too, with no scopes and the subject taken from its one SAN URI, its one SAN DNS name (lower-cased) or its one CN (only without SAN URI or DNS); a certificate with none or several of them does not. Then every client certificate the CA signs gets in: guard paths with `rules`. Unset: only the `identities` do.',
      ),
  })
  .refine((settings) => settings.identities.length > 0 || settings.subjectFrom !== undefined, {
    path: ['identities'],
    message: 'list at least one identity, or set subjectFrom (else no certificate could authenticate)',
  });

const failures = z.strictObject({
  max: positiveInt
    .default(10)
    .describe(
      'Bad credentials from one client IP (IPv6: one /64) within the window before it is locked out; no more than this are ever checked per window.',
    ),
  windowSeconds: positiveInt.default(60).describe('The counting window, in seconds.'),
  lockoutSeconds: positiveInt
    .default(300)
    .describe('Seconds a lockout lasts: the client gets 429 `too_many_failures` with `Retry-After`.'),
});

export const auth = z
  .strictObject({
    enabled: z
      .boolean()
      .default(true)
      .describe(
        '`false` skips the credential check (`allowedIPs` still applies); on a non-loopback address that needs `allowInsecure`.',
      ),
    allowInsecure: z
      .boolean()
      .default(false)
      .describe(
        'Allow a start with no credential check (auth disabled, or no credential configured) on a non-loopback address; logs a loud warning.',
      ),
    apiKey: z
      .string()
      .min(32, 'apiKey must be at least 32 characters')
      .regex(/^[^\s,]+$/, 'apiKey must not contain blanks or commas')
      // Presented gth_ keys are checksum-checked before lookup, so a hand-made one could never match.
      .refine(
        (key) => !key.startsWith(API_KEY_PREFIX) || hasValidKeyChecksum(key),
        `an apiKey starting with "${API_KEY_PREFIX}" must be a generated key (its checksum does not match)`,
      )
      .optional()
      .describe(
        'One plain key, sent as `X-API-Key` (32 or more characters, no blanks or commas) and reported as key id `default` (which no `apiKeys` entry may then use); usually `"${GATEHOUSE_API_KEY}"` or `{ file }`.',
      ),
    apiKeys: z
      .array(apiKeyItem)
      .default([])
      .transform((entries, ctx) => {
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
              for (const issue of parsed.error.issues)
                ctx.addIssue({ ...issue, path: [i, ...issue.path] } as z.core.$ZodRawIssue);
              return;
            }
            key = parsed.data;
          }
          const first = seen.get(key.id);
          if (first !== undefined)
            ctx.addIssue({
              code: 'custom',
              path: [i, 'id'],
              message: `duplicate key id "${key.id}" (also at apiKeys[${first}])`,
            });
          else seen.set(key.id, i);
          keys.push(key);
        });
        return keys;
      })
      .describe(
        'Hashed API keys, sent as `X-API-Key`, each with its own id and optional expiry, scopes and rate limit; ids are unique.',
      ),
    bearer: z
      .strictObject({
        jwt: jwtSettings.describe(
          'How tokens are verified: one key source (`jwksUri`, `secret` or `publicKey`) and the claims checked.',
        ),
      })
      .optional()
      .describe('Accept JWTs as `Authorization: Bearer <token>`. Unset: no bearer tokens.'),
    clientCertificate: clientCertificate
      .optional()
      .describe(
        'Accept a client certificate (mTLS, verified by `gateway.tls.clientCertificates`) as a credential: `identities` say which certificates, and who each one is. Unset: certificates are no credential.',
      ),
    require: z
      .enum(['any', 'all'])
      .default('any')
      .describe(
        '`"any"`: one valid credential suffices; `"all"`: every configured method (API key, bearer, client certificate) must be presented and valid.',
      ),
    allowedIPs: z
      .array(addressRange)
      .optional()
      .meta({ docsType: 'list of IPs or CIDRs' })
      .describe(
        'Client addresses (IPs or CIDRs, IPv4 or IPv6) allowed to call `/api/`, checked whenever set, also with `enabled: false`. Unset: any address.',
      ),
    failures: failures
      .prefault({})
      .describe(
        'The lockout: bad credentials are counted per client IP, on this listener and for guessable secrets on the webhook one.',
      ),
    forwardCredentials: z
      .boolean()
      .default(false)
      .describe('Send `X-API-Key` and the bearer `Authorization` header on to the upstream; `false` strips them.'),
    // Compiled and checked in src/gateway/authorize.ts.
    rules: z
      .array(
        z
          .strictObject({
            paths: pathPatterns.describe(
              'Path patterns under `/api/` (or `/_gatehouse/`): `*` is one segment, `**` (last only) any rest; ASCII case and a trailing slash do not matter.',
            ),
            methods: methods
              .optional()
              .describe('Methods the rule applies to (upper case; `GET` brings `HEAD`). Unset: every method.'),
            scopes: z
              .array(scopeToken)
              .min(1)
              .optional()
              .describe(
                "Scopes the request must hold, all of them (from its API key, or its token's `scope` and `scp`). A rule needs `scopes`, `claims` or both.",
              ),
            claims: z
              .record(z.string().min(1), z.string())
              .optional()
              .describe(
                'Top-level JWT claims the token must have: equal to the value, or, for an array claim, containing it. A request with only an API key fails such a rule.',
              ),
          })
          .refine(
            (rule) => rule.scopes !== undefined || (rule.claims !== undefined && Object.keys(rule.claims).length > 0),
            'a rule needs scopes or claims (what it requires)',
          ),
      )
      .default([])
      .describe(
        'What a request must hold: every rule whose paths and methods match must be satisfied, else 403 `insufficient_scope`.',
      ),
    defaultAllow: z
      .boolean()
      .default(true)
      .describe('A request no rule matches: allowed (`true`), or refused with 403 `insufficient_scope` (`false`).'),
    // Browsers cannot set headers on `new WebSocket()` or `new EventSource()` (src/gateway/browser-credentials.ts).
    browser: z
      .strictObject({
        websocketProtocol: z
          .boolean()
          .default(false)
          .describe(
            "Read a credential offered in a WebSocket upgrade's `Sec-WebSocket-Protocol` as `gatehouse, gatehouse.bearer.<JWT>` or `gatehouse, gatehouse.api-key.<key>`; both `gatehouse` entries are removed before the upstream.",
          ),
        queryParameter: z
          .string()
          .regex(/^[A-Za-z0-9_.~-]{1,64}$/, 'queryParameter: 1-64 characters of A-Z a-z 0-9 _ . ~ -')
          .optional()
          .describe(
            'A query parameter (e.g. `"access_token"`) that carries a credential on `GET` requests only (EventSource, WebSocket): a JWT or an API key, removed from the URL the upstream sees and never logged. Unset: none.',
          ),
      })
      .prefault({})
      .describe(
        'Credential forms a browser can send where it cannot set headers; both off by default. They are checked exactly like `X-API-Key` and `Authorization: Bearer`.',
      ),
  })
  // Two keys under one id would share its rules, rate limit and upstream identity.
  .superRefine((settings, ctx) => {
    if (settings.apiKey === undefined) return;
    const i = settings.apiKeys.findIndex((key) => key.id === PLAIN_API_KEY_ID);
    if (i !== -1)
      ctx.addIssue({
        code: 'custom',
        path: ['apiKeys', i, 'id'],
        message: `key id "${PLAIN_API_KEY_ID}" is the plain apiKey's: rename this one, or move the plain key into apiKeys`,
      });
  });
