import { z } from 'zod';
import { auth } from './auth.js';
import { addressRange, httpLimits, httpUrl, listen, methods, pathPatterns, positiveInt, rateLimitQuota } from './common.js';

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

export const gateway = z.strictObject({
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
