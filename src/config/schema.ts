import { z } from 'zod';
import { API_KEY_PREFIX, hasValidKeyChecksum } from '../gateway/credentials/api-key.js';
import { isValidAddressRange } from '../gateway/ip-allowlist.js';
import { pathPatternProblem } from '../gateway/path-pattern.js';
import { compileTemplate } from '../webhooks/translate.js';
import { redactUrlCredentials } from './redact.js';

/**
 * The configuration schema: the single source of the Config type.
 * Defaults live here; load.ts only expands ${ENV} and { file } references before parsing.
 */

/** An IP address or CIDR, IPv4 or IPv6 (`10.0.0.0/8`, `::1`). */
const addressRange = z.string().superRefine((value, ctx) => {
  if (!isValidAddressRange(value)) ctx.addIssue({ code: 'custom', message: `invalid CIDR "${value}"` });
});

const httpUrl = (what: string) =>
  z.string().superRefine((value, ctx) => {
    let url: URL;
    // "localhost:3000" parses as a URL with scheme "localhost:": say what is actually wrong.
    if (!/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(value)) {
      ctx.addIssue({ code: 'custom', message: `${what} must be an absolute http(s) URL: the scheme is missing in "${redactUrlCredentials(value)}" (e.g. "http://${redactUrlCredentials(value)}")` });
      return;
    }
    try {
      url = new URL(value);
    } catch {
      ctx.addIssue({ code: 'custom', message: `${what} must be an absolute http(s) URL, got "${redactUrlCredentials(value)}"` });
      return;
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') {
      ctx.addIssue({ code: 'custom', message: `${what} must use http or https, got "${url.protocol}"` });
    }
  });

const port = z.number().int().min(0).max(65535);
const positiveInt = z.number().int().positive();

const listen = (defaultPort: number) =>
  z.strictObject({
    host: z.string().min(1).default('127.0.0.1'),
    port: port.default(defaultPort),
  });

/**
 * The HTTP parser's limits on a listener, all explicit (Node's defaults are generous and some,
 * like its silent header-count cut, are unsafe for a proxy). See src/listener.ts.
 */
const httpLimits = (requestTimeoutMs: number) =>
  z.strictObject({
    /** Header lines per request; a request with more is refused (431), never cut. Apache's LimitRequestFields. */
    maxHeaderCount: z.number().int().min(16).max(1000).default(100),
    /** Bytes of the request line and headers together (431 past it). */
    maxHeaderBytes: z.number().int().min(1024).max(65_536).default(16_384),
    /** Time to receive the request line and headers (408, connection closed). */
    headersTimeoutMs: positiveInt.default(15_000),
    /** Time to receive the whole request, body included (408). */
    requestTimeoutMs: positiveInt.default(requestTimeoutMs),
    /** How long an idle keep-alive connection stays open (make it longer than a load balancer's idle timeout in front). */
    keepAliveTimeoutMs: positiveInt.default(5_000),
  }).superRefine((limits, ctx) => {
    if (limits.headersTimeoutMs > limits.requestTimeoutMs) ctx.addIssue({ code: 'custom', path: ['headersTimeoutMs'], message: 'headersTimeoutMs must not exceed requestTimeoutMs' });
  });

// Authorization and rate limits (issue 16): the pieces API key entries and the gateway section share.

/** An OAuth scope-token (RFC 6749 §3.3): printable ASCII except space, `"` and `\\`. */
const scopeToken = z.string().regex(/^[\x21\x23-\x5b\x5d-\x7e]{1,128}$/, 'a scope is 1-128 printable ASCII characters without space, " or \\ (RFC 6749 scope-token)');
/** A period like "1s", "30s", "1m", "1h", "1d", as seconds. */
const period = z.string({ error: (issue) => `per ${issue.input === undefined ? 'is required' : 'must be text'}: a whole number followed by s, m, h or d (e.g. "1m")` }).regex(/^[1-9]\d{0,5}[smhd]$/, 'per must be a whole number followed by s, m, h or d (e.g. "1m")')
  .transform((text) => Number(text.slice(0, -1)) * { s: 1, m: 60, h: 3600, d: 86_400 }[text.at(-1) as 's' | 'm' | 'h' | 'd']);
/** `/api/…` (or `/_gatehouse/…`) patterns: `*` one segment, `**` (last) any rest. */
const pathPatterns = z.array(z.string().superRefine((pattern, ctx) => {
  const problem = pathPatternProblem(pattern);
  if (problem) ctx.addIssue({ code: 'custom', message: problem });
})).min(1);
/** Methods as Node reports them: upper case tokens. */
const methods = z.array(z.string().regex(/^[A-Z]{1,20}$/, 'methods are upper case, e.g. "GET"')).min(1);
const rateLimitQuota = { requests: positiveInt, per: period };

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

const jwtSettings = z
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

const auth = z.strictObject({
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

/** `gateway.routes`: prefixes under /api/ sent to their own upstream (src/gateway/routes.ts). */
const upstreamSettings = (what: string) => z.strictObject({
  target: httpUrl(what),
  timeoutMs: positiveInt.default(30_000),
});
const routes = z.array(z.strictObject({
  prefix: z.string().regex(/^\/api\/(?:[A-Za-z0-9\-._~!$&()*+,=:@/]*\/)?$/, 'prefix must start with /api/, end with "/" and use only unencoded path characters')
    .refine((prefix) => prefix !== '/api/', '"/api/" is gateway.upstream (the default route)')
    .refine((prefix) => !prefix.includes('//') && !prefix.split('/').some((seg) => seg === '.' || seg === '..'), 'prefix must not contain empty, "." or ".." segments'),
  upstream: upstreamSettings('routes[].upstream.target'),
  /** Removed from the front of the path on the way up (`/api` turns `/api/billing/x` into `/billing/x`). */
  stripPrefix: z.string().regex(/^\/[^/]/, 'stripPrefix must start with "/"').refine((strip) => !strip.endsWith('/'), 'stripPrefix must not end with "/" (the upstream path keeps its leading "/")').optional(),
}).refine((route) => route.stripPrefix === undefined || route.prefix.startsWith(route.stripPrefix + '/'), { path: ['stripPrefix'], message: 'stripPrefix must be a leading part of prefix, ending at a "/"' }))
  .default([])
  .superRefine((list, ctx) => {
    // Case aside: rules compare paths in any case, and a path in another case than its route's prefix is refused.
    const seen = new Map<string, number>();
    list.forEach((route, i) => {
      const first = seen.get(route.prefix.toLowerCase());
      if (first !== undefined) {
        const same = list[first]!.prefix === route.prefix;
        ctx.addIssue({ code: 'custom', path: [i, 'prefix'], message: `duplicate prefix "${route.prefix}" (also at routes[${first}]${same ? '' : `, as "${list[first]!.prefix}": prefixes are compared in any case`})` });
      } else seen.set(route.prefix.toLowerCase(), i);
    });
  });

/** `gateway.rateLimits`: token buckets per API key, subject or client IP (src/gateway/rate-limit.ts). */
const rateLimits = z.array(z.strictObject({
  by: z.enum(['key', 'subject', 'ip']),
  ...rateLimitQuota,
  /** Bucket size (requests at once after a quiet spell); default `requests`. */
  burst: positiveInt.optional(),
  paths: pathPatterns.optional(),
  methods: methods.optional(),
})).default([]);

const gateway = z.strictObject({
  listen: listen(8080).prefault({}),
  upstream: upstreamSettings('upstream.target'),
  routes,
  rateLimits,
  trustProxy: z.array(addressRange).default([]),
  tls: z.strictObject({ cert: z.string().min(1), key: z.string().min(1) }).optional(),
  /** Uploads stream through to the upstream, so the whole-request time is generous. */
  limits: httpLimits(300_000).prefault({}),
  auth: auth.prefault({}),
  /** Processes serving /api/ (node:cluster, sharing the port): "auto" = one per CPU. The webhook receiver stays in one. */
  workers: z.union([z.literal('auto'), z.number().int().min(1).max(256)], { error: 'workers must be "auto" or a whole number from 1 to 256' }).default(1),
});

export const webhookActions = ['system-event', 'message', 'agent'] as const;
export type WebhookAction = (typeof webhookActions)[number];

const hookSecret = (what: string) => z.string().min(16, `${what} must be at least 16 characters`);
const rotatingSecrets = {
  secret: hookSecret('secret').optional(),
  /** Several secrets at once: old and new both pass while a sender rotates. */
  secrets: z.array(hookSecret('each secret')).min(1).optional(),
};
const tolerance = { toleranceSeconds: z.number().int().min(1).max(3600).default(300) };

/** `verify` on an endpoint: how its sender proves a webhook is theirs (see src/webhooks/verifiers/). */
const verifySchema = z.discriminatedUnion('type', [
  z.strictObject({ type: z.literal('secret'), secret: hookSecret('secret') }),
  z.strictObject({ type: z.literal('github'), ...rotatingSecrets }),
  z.strictObject({ type: z.literal('stripe'), ...rotatingSecrets, ...tolerance }),
  z.strictObject({ type: z.literal('slack'), signingSecret: hookSecret('signingSecret'), ...tolerance }),
  z.strictObject({
    type: z.literal('standard-webhooks'),
    secret: z.string().regex(/^(whsec_)?[A-Za-z0-9+/]{16,}={0,2}$/, 'a Standard Webhooks secret is "whsec_" + base64').optional(),
    secrets: z.array(z.string().regex(/^(whsec_)?[A-Za-z0-9+/]{16,}={0,2}$/, 'a Standard Webhooks secret is "whsec_" + base64')).min(1).optional(),
    ...tolerance,
  }),
  z.strictObject({ type: z.literal('telegram'), secretToken: z.string().regex(/^[A-Za-z0-9_-]{16,256}$/, 'secretToken: 16-256 characters of A-Z a-z 0-9 _ - (Telegram allows only these)') }),
  z.strictObject({ type: z.literal('discord'), publicKey: z.string().regex(/^[0-9a-fA-F]{64}$/, 'publicKey must be the 32-byte Ed25519 key as 64 hex digits'), ...tolerance }),
  z.strictObject({ type: z.literal('meta'), appSecret: hookSecret('appSecret'), verifyToken: z.string().min(8, 'verifyToken must be at least 8 characters') }),
  z.strictObject({
    type: z.literal('pubsub-oidc'),
    audience: z.string().min(1),
    serviceAccountEmail: z.email(),
    jwksUri: httpUrl('jwksUri').default('https://www.googleapis.com/oauth2/v3/certs'),
  }),
], { error: (issue) => (issue.code === 'invalid_union' ? 'verify.type must be one of secret, github, stripe, slack, standard-webhooks, telegram, discord, meta, pubsub-oidc' : undefined) });

type RawVerify = z.output<typeof verifySchema>;
type WithSecrets<T> = Omit<T, 'secret' | 'secrets'> & { secrets: string[] };
/** The normalised `verify` every endpoint has after parsing (`secret` alone becomes `{ type: "secret" }`). */
export type VerifyConfig =
  | Exclude<RawVerify, { type: 'github' | 'stripe' | 'standard-webhooks' }>
  | WithSecrets<Extract<RawVerify, { type: 'github' }>>
  | WithSecrets<Extract<RawVerify, { type: 'stripe' }>>
  | WithSecrets<Extract<RawVerify, { type: 'standard-webhooks' }>>;

const webhookEndpoint = z
  .strictObject({
    path: z.string()
      .regex(/^\/webhook\/[A-Za-z0-9._~\-/]+$/, 'path must start with /webhook/ and use only A-Z a-z 0-9 . _ ~ - /')
      .refine((p) => !p.includes('//') && !p.endsWith('/') && !p.split('/').some((seg) => seg === '.' || seg === '..'), 'path must not contain empty, "." or ".." segments nor end with "/"'),
    secret: hookSecret('secret').optional(),
    verify: verifySchema.optional(),
    action: z.enum(webhookActions),
    template: z.string().superRefine((template, ctx) => {
      try {
        compileTemplate(template);
      } catch (err) {
        ctx.addIssue({ code: 'custom', message: (err as Error).message });
      }
    }).optional(),
  })
  .superRefine((endpoint, ctx) => {
    if ((endpoint.secret === undefined) === (endpoint.verify === undefined)) {
      ctx.addIssue({ code: 'custom', message: endpoint.secret === undefined ? 'give either secret (X-Webhook-Secret) or verify' : 'give secret or verify, not both' });
    }
    const v = endpoint.verify;
    if (v && (v.type === 'github' || v.type === 'stripe' || v.type === 'standard-webhooks') && (v.secret === undefined) === (v.secrets === undefined)) {
      ctx.addIssue({ code: 'custom', path: ['verify'], message: `${v.type}: give secret or secrets (one of them)` });
    }
  })
  .transform(({ secret, verify, ...endpoint }) => ({ ...endpoint, verify: normalizeVerify(verify ?? { type: 'secret', secret: secret! }) }));

function normalizeVerify(verify: RawVerify): VerifyConfig {
  if (verify.type === 'github' || verify.type === 'stripe' || verify.type === 'standard-webhooks') {
    const { secret, secrets, ...rest } = verify;
    return { ...rest, secrets: secrets ?? [secret!] } as VerifyConfig;
  }
  return verify;
}

const webhookTarget = z.strictObject({
  url: httpUrl('target url'),
  secret: z.string().min(16, 'target secret must be at least 16 characters').optional(),
  timeoutMs: positiveInt.optional(),
});

/** `webhooks.gmail`: new emails as actions (src/integrations/gmail/); written by `gatehouse webhooks gmail setup`. */
const gmail = z
  .strictObject({
    account: z.email(),
    project: z.string().regex(/^[a-z][a-z0-9-]{4,28}[a-z0-9]$/, 'project must be a Google Cloud project id (6-30 lowercase letters, digits, hyphens)'),
    topic: z.string().regex(/^[A-Za-z][\w.~+%-]{2,254}$/, 'topic: a Pub/Sub topic name (3-255 characters, starting with a letter)').default('gatehouse-gmail'),
    subscription: z.string().regex(/^[A-Za-z][\w.~+%-]{2,254}$/, 'subscription: a Pub/Sub subscription name').default('gatehouse-gmail-push'),
    mode: z.enum(['push', 'pull']).default('push'),
    labels: z.array(z.string().min(1)).min(1).default(['INBOX']),
    action: z.enum(['message', 'agent']).default('message'),
    template: z.string().superRefine((template, ctx) => {
      try {
        compileTemplate(template);
      } catch (err) {
        ctx.addIssue({ code: 'custom', message: (err as Error).message });
      }
    }).default('New email from {{from}}: {{subject}}'),
    includeBody: z.boolean().default(false),
    maxBytes: positiveInt.default(20_000),
    renewMinutes: z.number().int().min(1).max(10_080).default(720),
    /** Push mode: Pub/Sub POSTs to `path` on the webhook listener with an OIDC token for `audience`, signed as `serviceAccountEmail`. */
    push: z.strictObject({
      path: z.string().regex(/^\/webhook\/[A-Za-z0-9._~\-/]+$/, 'push.path must start with /webhook/').default('/webhook/gmail'),
      audience: httpUrl('push.audience'),
      serviceAccountEmail: z.email(),
      /** Default: the key set under googleApiUrl when that is set, else Google's (https://www.googleapis.com/oauth2/v3/certs); when given, always this one. */
      jwksUri: httpUrl('push.jwksUri').optional(),
    }).optional(),
    /** Pull mode: how long to wait after an empty pull before asking again. */
    pull: z.strictObject({ intervalMs: positiveInt.default(1_000), maxMessages: z.number().int().min(1).max(1000).default(10) }).prefault({}),
    /** One base URL for every Google endpoint (Gmail, Pub/Sub, OAuth): for tests and egress proxies only. */
    googleApiUrl: httpUrl('googleApiUrl').optional(),
  })
  .superRefine((g, ctx) => {
    if (g.mode === 'push' && !g.push) ctx.addIssue({ code: 'custom', path: ['push'], message: 'mode "push" needs push: { audience, serviceAccountEmail } (or use mode: "pull")' });
  });

/** Channels' own routes live under this path; nothing else may be configured there. */
const CHANNEL_PATHS = '/webhook/channels/';

/** Gatehouse's own channel API on the gateway listener, outside the proxied /api/ space. */
export const CHANNEL_SEND_PREFIX = '/_gatehouse/channels/';
/** The path that sends through channel `name` (what rules, rate limits and `send.scopes` match). */
export const channelSendPath = (name: string) => `${CHANNEL_SEND_PREFIX}${name}/messages`;
const isChannelPath = (path: string) => path === CHANNEL_PATHS.slice(0, -1) || path.startsWith(CHANNEL_PATHS);

const DURATION_UNIT_MS = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;
const RETRY_FOR_DEFAULT = '72h';
/** A duration as text (`72h`, `30m`, `7d`, `90s`), parsed to milliseconds. */
const retryBudget = z.string({ error: (issue) => `${issue.input === undefined ? 'required: ' : ''}a duration as text, like "72h", "30m", "7d" or "90s"` })
  .regex(/^[1-9]\d*(ms|s|m|h|d)$/, 'a duration like "72h", "30m", "7d" or "90s"')
  .transform((text) => {
    const [, amount, unit] = /^(\d+)(ms|s|m|h|d)$/.exec(text)!;
    return Number(amount) * DURATION_UNIT_MS[unit as keyof typeof DURATION_UNIT_MS];
  });

const webhooks = z
  .strictObject({
    enabled: z.boolean().default(false),
    listen: listen(8081).prefault({}),
    /** Bodies are small and bounded by bodyTimeoutMs: a short whole-request time. */
    limits: httpLimits(60_000).prefault({}),
    maxBodyBytes: positiveInt.default(262_144),
    /**
     * How deep a JSON body may nest arrays and objects (the top level is 1); deeper is 400
     * invalid_json, checked before parsing. Capped well below where JSON.stringify runs out of stack.
     */
    maxJsonDepth: z.number().int().min(1).max(1000).default(64),
    /** A body that has not fully arrived after this long gets 408 (slow-loris guard). */
    bodyTimeoutMs: positiveInt.default(15_000),
    endpoints: z.array(webhookEndpoint).default([]),
    targets: z.strictObject({
      'system-event': webhookTarget.optional(),
      message: webhookTarget.optional(),
      agent: webhookTarget.optional(),
    }).prefault({}),
    delivery: z.strictObject({
      /** How long after acceptance an event is retried before it goes dead (Stripe: 3 days): "72h", "30m", "7d". In ms once parsed. */
      retryFor: retryBudget.prefault(RETRY_FOR_DEFAULT),
      /** An optional cap on attempts per round (acceptance, or a `deliveries retry`); unset: only retryFor limits them. */
      maxAttempts: positiveInt.optional(),
      initialBackoffMs: positiveInt.default(1_000),
      maxBackoffMs: positiveInt.default(3_600_000),
      timeoutMs: positiveInt.default(10_000),
      concurrency: positiveInt.default(16),
    }).prefault({}),
    gmail: gmail.optional(),
  })
  .superRefine((hooks, ctx) => {
    const seen = new Map<string, number>();
    hooks.endpoints.forEach((endpoint, i) => {
      const first = seen.get(endpoint.path);
      if (first !== undefined) ctx.addIssue({ code: 'custom', path: ['endpoints', i, 'path'], message: `duplicate endpoint path "${endpoint.path}" (also at endpoints[${first}])` });
      else seen.set(endpoint.path, i);
      if (isChannelPath(endpoint.path)) ctx.addIssue({ code: 'custom', path: ['endpoints', i, 'path'], message: `${CHANNEL_PATHS} is reserved for channels` });
      if (!hooks.targets[endpoint.action]) {
        ctx.addIssue({ code: 'custom', path: ['endpoints', i, 'action'], message: `action "${endpoint.action}" has no target: add webhooks.targets["${endpoint.action}"]` });
      }
    });
    const { gmail } = hooks;
    if (gmail) {
      if (!hooks.enabled) ctx.addIssue({ code: 'custom', path: ['gmail'], message: 'webhooks.gmail needs webhooks.enabled: true (emails go through the webhook queue)' });
      if (!hooks.targets[gmail.action]) ctx.addIssue({ code: 'custom', path: ['gmail', 'action'], message: `action "${gmail.action}" has no target: add webhooks.targets["${gmail.action}"]` });
      const clash = gmail.mode === 'push' && gmail.push && seen.has(gmail.push.path);
      if (clash) ctx.addIssue({ code: 'custom', path: ['gmail', 'push', 'path'], message: `"${gmail.push!.path}" is also an endpoint path` });
      if (gmail.push && isChannelPath(gmail.push.path)) ctx.addIssue({ code: 'custom', path: ['gmail', 'push', 'path'], message: `${CHANNEL_PATHS} is reserved for channels` });
    }
  });

/**
 * `storage`: where durable state lives. `sqlite` (the default; `{ path }` alone means it): one
 * server per file. `postgres`: several gatehouse instances share one database (src/storage/postgres/).
 */
const DEFAULT_STORAGE_PATH = './data/gatehouse.db';
const storageDriver = z.discriminatedUnion('driver', [
  z.strictObject({
    driver: z.literal('sqlite'),
    path: z.string().min(1).default(DEFAULT_STORAGE_PATH),
  }),
  z.strictObject({
    driver: z.literal('postgres'),
    url: z.string({ error: (issue) => (issue.input === undefined ? 'required with driver "postgres": a postgres:// connection URL, e.g. "${DATABASE_URL}"' : undefined) }).regex(/^postgres(ql)?:\/\/./, 'url must be a postgres:// (or postgresql://) connection URL, e.g. "${DATABASE_URL}"'),
    pool: z.strictObject({ max: z.number().int().min(2).max(1000).default(10) }).prefault({}),
  }),
], { error: (issue) => (issue.code === 'invalid_union' ? 'must be "sqlite" (the default) or "postgres"' : undefined) });
const storage = z.preprocess(
  // No driver: the SQLite of every earlier config (`storage: { path }`, or nothing at all).
  (value) => (value !== null && typeof value === 'object' && !Array.isArray(value) && !('driver' in value) ? { ...value, driver: 'sqlite' } : value),
  storageDriver,
).prefault({});

/**
 * `channels`: messaging platforms, each proving itself its own way (src/channels/). Tokens won
 * by `gatehouse channels login` live sealed in storage; these are the static settings.
 */
const channelName = z.string().regex(/^[a-z0-9][a-z0-9_-]{0,31}$/, 'channel names: 1-32 characters of a-z 0-9 _ - (they appear in paths)');
const channelCommon = {
  action: z.enum(['message', 'agent']).default('message'),
  /**
   * Who may send through this channel (`POST /_gatehouse/channels/<name>/messages`): a credential
   * needs every one of these scopes, whatever gateway.auth.rules say; a rule for the channel's path itself.
   */
  send: z.strictObject({ scopes: z.array(scopeToken).min(1) }).optional(),
};
const channelSchema = z.discriminatedUnion('kind', [
  z.strictObject({
    kind: z.literal('qr'),
    ...channelCommon,
    /** The base URL devices reach the webhook listener at (what the QR code encodes); default: the listener's own address. */
    publicUrl: httpUrl('publicUrl').optional(),
    pairingMinutes: z.number().int().min(1).max(60).default(10),
  }),
  z.strictObject({
    kind: z.literal('bot-token'),
    platform: z.literal('telegram'),
    ...channelCommon,
    botToken: z.string().regex(/^\d+:[A-Za-z0-9_-]{20,}$/, 'botToken must look like 123456:ABC… (from @BotFather)'),
    publicUrl: httpUrl('publicUrl'),
    apiBaseUrl: httpUrl('apiBaseUrl').default('https://api.telegram.org'),
  }),
  z.strictObject({
    kind: z.literal('oauth-bot'),
    platform: z.literal('discord'),
    ...channelCommon,
    clientId: z.string().regex(/^\d{5,25}$/, 'clientId: the application id (digits)'),
    clientSecret: z.string().min(8),
    botToken: z.string().min(20),
    /** Where the platform reaches the webhook listener: the OAuth callback of `login --public`. */
    publicUrl: httpUrl('publicUrl').optional(),
    publicKey: z.string().regex(/^[0-9a-fA-F]{64}$/, 'publicKey must be the 32-byte Ed25519 key as 64 hex digits'),
    permissions: z.string().regex(/^\d+$/).default('2048'),
    scopes: z.array(z.string().min(1)).min(1).default(['bot', 'applications.commands']),
    toleranceSeconds: z.number().int().min(1).max(3600).default(300),
    apiBaseUrl: httpUrl('apiBaseUrl').default('https://discord.com/api/v10'),
    authorizeUrl: httpUrl('authorizeUrl').default('https://discord.com/oauth2/authorize'),
    tokenUrl: httpUrl('tokenUrl').default('https://discord.com/api/oauth2/token'),
  }),
  z.strictObject({
    kind: z.literal('oauth'),
    platform: z.literal('slack'),
    ...channelCommon,
    clientId: z.string().min(1),
    clientSecret: z.string().min(8),
    signingSecret: hookSecret('signingSecret'),
    publicUrl: httpUrl('publicUrl').optional(),
    scopes: z.array(z.string().min(1)).min(1).default(['chat:write', 'channels:history']),
    toleranceSeconds: z.number().int().min(1).max(3600).default(300),
    apiBaseUrl: httpUrl('apiBaseUrl').default('https://slack.com/api'),
    authorizeUrl: httpUrl('authorizeUrl').default('https://slack.com/oauth/v2/authorize'),
    tokenUrl: httpUrl('tokenUrl').default('https://slack.com/api/oauth.v2.access'),
  }),
], { error: (issue) => (issue.code === 'invalid_union' ? 'kind must be one of qr, bot-token, oauth-bot, oauth (with platform telegram, discord, slack respectively)' : undefined) });

/**
 * `admin`: the operator's listener (src/admin.ts): /metrics, /readyz, /healthz. Off unless
 * configured. Anywhere but loopback it needs `token` (checked in the superRefine below): the
 * metrics name endpoints, actions and error rates, which is for operators only.
 */
const admin = z.strictObject({
  listen: listen(9090).prefault({}),
  /** Required as `Authorization: Bearer <token>` on /metrics when set. */
  token: z.string().min(16, 'admin token must be at least 16 characters').regex(/^[\x21-\x7e]+$/, 'admin token must be printable ASCII without blanks').optional(),
  /** Scrapes and probes are small and quick: short timeouts. */
  limits: httpLimits(30_000).prefault({}),
});

export const configSchema = z
  .strictObject({
    /** For editors: the JSON Schema this file follows (`gatehouse config schema`); gatehouse ignores it. */
    $schema: z.string().optional(),
    storage,
    log: z.strictObject({ level: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info') }).prefault({}),
    gateway,
    webhooks: webhooks.prefault({}),
    channels: z.record(channelName, channelSchema).default({}),
    admin: admin.optional(),
  })
  .superRefine((config, ctx) => {
    if (config.admin && config.admin.token === undefined && !isLoopbackHost(config.admin.listen.host)) {
      ctx.addIssue({ code: 'custom', path: ['admin', 'token'], message: `required when admin.listen.host is not loopback (${config.admin.listen.host}): set token, e.g. "\${ADMIN_TOKEN}"` });
    }
    for (const [name, channel] of Object.entries(config.channels)) {
      if (!config.webhooks.enabled) ctx.addIssue({ code: 'custom', path: ['channels', name], message: 'channels need webhooks.enabled: true (their events arrive on the webhook listener)' });
      else if (!config.webhooks.targets[channel.action]) ctx.addIssue({ code: 'custom', path: ['channels', name, 'action'], message: `action "${channel.action}" has no target: add webhooks.targets["${channel.action}"]` });
    }
    const { auth, listen: at } = config.gateway;
    const hooksAt = config.webhooks.listen;
    const wildcard = (host: string) => host === '0.0.0.0' || host === '::';
    if (config.webhooks.enabled && at.port !== 0 && at.port === hooksAt.port && (at.host === hooksAt.host || wildcard(at.host) || wildcard(hooksAt.host))) {
      ctx.addIssue({ code: 'custom', path: ['webhooks', 'listen', 'port'], message: `the webhook receiver and the gateway cannot both listen on ${hooksAt.host}:${hooksAt.port}; give webhooks.listen another port` });
    }
    const hasCredential = auth.apiKey !== undefined || auth.apiKeys.length > 0 || auth.bearer !== undefined;
    // Secure by default: an open edge on a reachable address needs an explicit opt-in.
    if ((!auth.enabled || !hasCredential) && !isLoopbackHost(at.host) && !auth.allowInsecure) {
      ctx.addIssue({
        code: 'custom',
        path: ['gateway', 'auth'],
        message: `${auth.enabled ? 'no credential is configured' : 'auth is disabled'} while listening on non-loopback ${at.host}; configure apiKey/apiKeys/bearer or set gateway.auth.allowInsecure: true`,
      });
    }
  });

export function isLoopbackHost(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** The validated configuration, as every part of gatehouse sees it (deep-frozen at load). */
export type Config = z.output<typeof configSchema>;
export type GatewayConfig = Config['gateway'];
export type AuthConfig = GatewayConfig['auth'];
export type RouteConfig = GatewayConfig['routes'][number];
export type RuleConfig = AuthConfig['rules'][number];
export type RateLimitConfig = GatewayConfig['rateLimits'][number];
export type HttpLimits = z.output<ReturnType<typeof httpLimits>>;
export type JwtConfig = z.output<typeof jwtSettings>;
export type WebhooksConfig = Config['webhooks'];
export type GmailConfig = NonNullable<WebhooksConfig['gmail']>;
export type ChannelConfig = Config['channels'][string];
export type StorageConfig = Config['storage'];
export type AdminConfig = NonNullable<Config['admin']>;
export type PostgresStorageConfig = Extract<StorageConfig, { driver: 'postgres' }>;
