import { z } from 'zod';
import { auth } from './auth.js';
import { cors } from './cors.js';
import {
  addressRange,
  duration,
  httpLimits,
  httpUrl,
  listen,
  methods,
  pathPatterns,
  positiveInt,
  rateLimitQuota,
} from './common.js';

/** `gateway.routes`: prefixes under /api/ sent to their own upstream (src/gateway/routes.ts). */
const upstreamSettings = (what: string) =>
  z.strictObject({
    target: httpUrl(what).describe(
      "The upstream's absolute http(s) URL (e.g. `http://127.0.0.1:3000`); the request path is appended unchanged.",
    ),
    timeoutMs: positiveInt
      .default(30_000)
      .describe('Milliseconds the upstream may stay silent (an idle timeout) before the request gets 504.'),
  });
const routes = z
  .array(
    z
      .strictObject({
        prefix: z
          .string()
          .regex(
            /^\/api\/(?:[A-Za-z0-9\-._~!$&()*+,=:@/]*\/)?$/,
            'prefix must start with /api/, end with "/" and use only unencoded path characters',
          )
          .refine((prefix) => prefix !== '/api/', '"/api/" is gateway.upstream (the default route)')
          .refine(
            (prefix) => !prefix.includes('//') && !prefix.split('/').some((seg) => seg === '.' || seg === '..'),
            'prefix must not contain empty, "." or ".." segments',
          )
          .describe(
            'The path prefix this route takes, starting `/api/` and ending `/` (e.g. `/api/billing/`); unique, compared in any case.',
          ),
        upstream: upstreamSettings('routes[].upstream.target').describe(
          "Where this route's requests go, as `gateway.upstream`.",
        ),
        stripPrefix: z
          .string()
          .regex(/^\/[^/]/, 'stripPrefix must start with "/"')
          .refine(
            (strip) => !strip.endsWith('/'),
            'stripPrefix must not end with "/" (the upstream path keeps its leading "/")',
          )
          .optional()
          .describe(
            'A leading part of `prefix` removed from the path on the way up, byte for byte (`"/api"` turns `/api/billing/x` into `/billing/x`, with `X-Forwarded-Prefix: /api`). Unset: the path goes up whole.',
          ),
        cors: z
          .union([cors, z.literal(false)])
          .optional()
          .describe(
            'CORS for this route, replacing `gateway.cors` whole; `false`: none here (the upstream answers preflights itself). Unset: `gateway.cors`.',
          ),
      })
      .refine((route) => route.stripPrefix === undefined || route.prefix.startsWith(route.stripPrefix + '/'), {
        path: ['stripPrefix'],
        message: 'stripPrefix must be a leading part of prefix, ending at a "/"',
      }),
  )
  .prefault([]) // not .default: zod leaves a default over a transform (`cors.maxAge`) out of the JSON Schema; both parse alike
  .superRefine((list, ctx) => {
    // Case aside: rules compare paths in any case, and a path in another case than its route's prefix is refused.
    const seen = new Map<string, number>();
    list.forEach((route, i) => {
      const first = seen.get(route.prefix.toLowerCase());
      if (first !== undefined) {
        const same = list[first]!.prefix === route.prefix;
        ctx.addIssue({
          code: 'custom',
          path: [i, 'prefix'],
          message: `duplicate prefix "${route.prefix}" (also at routes[${first}]${same ? '' : `, as "${list[first]!.prefix}": prefixes are compared in any case`})`,
        });
      } else seen.set(route.prefix.toLowerCase(), i);
    });
  })
  .describe(
    'Path prefixes under `/api/` sent to their own upstream, behind the same checks; the longest prefix a path starts with wins, the rest goes to `upstream`.',
  );

/** `gateway.rateLimits`: token buckets per API key, subject or client IP (src/gateway/rate-limit.ts). */
const rateLimits = z
  .array(
    z.strictObject({
      by: z
        .enum(['key', 'subject', 'ip'])
        .describe(
          'What a bucket is kept per: `"key"` (the API key id), `"subject"` (the JWT `sub`, else the key id) or `"ip"` (the client IP; IPv6 per /64). Requests without it are not counted.',
        ),
      ...rateLimitQuota,
      burst: positiveInt.optional().meta({
        description: 'The bucket size: how many requests may come at once after a quiet spell. Unset: `requests`.',
        docsDefault: '`requests`',
      }),
      paths: pathPatterns
        .optional()
        .describe(
          'Only requests on these path patterns count (as in rules: `*` one segment, `**` last for any rest). Unset: every path.',
        ),
      methods: methods
        .optional()
        .describe('Only requests with these methods count (upper case; `GET` brings `HEAD`). Unset: every method.'),
    }),
  )
  .prefault([]) // not .default: zod leaves a default over a transform (`per`) out of the JSON Schema; both parse alike
  .describe(
    'Token buckets per API key, subject or client IP, counted after the credentials and rules; a request finding any of its buckets empty gets 429 `rate_limited`.',
  );

/** `gateway.tls.clientCertificates`: ask clients for a certificate and verify it (mTLS; src/http/tls.ts). */
const clientCertificates = z
  .strictObject({
    ca: z
      .string()
      .min(1)
      .describe(
        "The PEM file of the CA certificates a client certificate must chain to (only these: never the system's roots), relative to the config file's folder.",
      ),
    mode: z
      .enum(['optional', 'required'])
      .describe(
        '`"required"`: a handshake without a valid client certificate fails (no HTTP at all); `"optional"`: a client may present one, and a valid one is a credential (`gateway.auth.clientCertificate`).',
      ),
    crl: z
      .string()
      .min(1)
      .optional()
      .describe(
        "A PEM file of CRLs, relative to the config file's folder: one from every CA of a client's chain (a CA without one, or an out-of-date CRL, fails its certificates). Unset: no revocation check.",
      ),
  })
  .describe(
    'Client certificates (mTLS): verified in the handshake against `ca` (and `crl`), for clients (`extendedKeyUsage` clientAuth when present). Read again at every reload with the pair; a change closes the connections verified under the old ones. TLS session resumption is off while set. See docs/client-certificates.md.',
  );

export const gateway = z
  .strictObject({
    listen: listen(8080)
      .prefault({})
      .describe('Where the gateway listens for `/api/` (and the channel send API). A change needs a restart.'),
    upstream: upstreamSettings('upstream.target').describe(
      'The internal API behind `/api/`: every request no route claims goes there.',
    ),
    routes,
    rateLimits,
    cors: cors
      .optional()
      .describe(
        "Let pages on other origins call `/api/` from a browser: preflights answered at the edge before credentials, and CORS headers on every answer to an allowed origin (see docs/browsers-and-websockets.md). Unset: no CORS headers, and the upstream's pass unchanged.",
      ),
    trustProxy: z
      .array(addressRange)
      .default([])
      .meta({ docsType: 'list of IPs or CIDRs' })
      .describe(
        'Proxies in front of gatehouse (IPs or CIDRs) whose `X-Forwarded-For`, `-Proto` and `-Host` are believed. Empty: the peer is the client.',
      ),
    tls: z
      .strictObject({
        cert: z
          .string()
          .min(1)
          .describe("The PEM certificate file (with its chain), relative to the config file's folder."),
        key: z
          .string()
          .min(1)
          .describe("The PEM private key file of that certificate, relative to the config file's folder."),
        clientCertificates: clientCertificates.optional(),
      })
      .optional()
      .describe(
        'Serve HTTPS on the gateway listener. Its files are read again at every reload; turning TLS on or off needs a restart. Unset: plain HTTP.',
      ),
    // Uploads stream through to the upstream, so the whole-request time is generous.
    limits: httpLimits(300_000)
      .prefault({})
      .describe("The HTTP parser's limits and timeouts on the gateway listener. A change needs a restart."),
    auth: auth
      .prefault({})
      .describe(
        'Who may call `/api/`: credentials, the client IP allow-list, the lockout after failures, and authorization rules.',
      ),
    websocket: z
      .strictObject({
        enabled: z
          .boolean()
          .default(true)
          .describe(
            'Proxy WebSocket upgrades on `/api/` after the whole pipeline (credentials, rules, rate limits). `false`: an upgrade is answered 501 `upgrade_not_supported`.',
          ),
        maxConnections: positiveInt
          .default(10_000)
          .describe(
            'Open WebSocket connections at most, per gateway process; past it an upgrade gets 503 `too_many_connections`.',
          ),
        maxConnectionsPerSubject: positiveInt
          .optional()
          .describe(
            'Open WebSocket connections at most per subject (JWT `sub`, else API key id), per gateway process; past it 429 `rate_limited`. Unset: no limit per subject.',
          ),
        idleTimeout: duration
          .prefault('15m')
          .describe('A connection with no bytes in either direction for this long is closed.'),
        maxLifetime: duration
          .optional()
          .describe('A connection open this long is closed, whatever it carries (e.g. `"24h"`). Unset: no limit.'),
      })
      .prefault({})
      .describe(
        'WebSockets through `/api/`. A connection also lives no longer than its credential: it is closed when a reload removes its key or a rule refuses it, and when its JWT expires.',
      ),
    workers: z
      .union([z.literal('auto'), z.number().int().min(1).max(256)], {
        error: 'workers must be "auto" or a whole number from 1 to 256',
      })
      .default(1)
      .describe(
        'Processes serving `/api/` on the one port (node:cluster): a number, or `"auto"` for one per CPU. The webhook receiver stays in the primary. A change needs a restart.',
      ),
  })
  .describe('The `/api/` edge: where it listens, the upstreams behind it, and who may pass.');
