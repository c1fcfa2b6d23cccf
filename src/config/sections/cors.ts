import { z } from 'zod';
import { ALWAYS_ALLOWED, ALWAYS_EXPOSED, parseOriginPattern } from '../../gateway/cors.js';
import { duration, methods } from './common.js';

/** RFC 9110 §5.6.2 token: what a header name may be. */
const headerName = z
  .string()
  .regex(/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/, 'a header name is a token (RFC 9110), e.g. "X-Trace-Id"');

const origin = z
  .string()
  .superRefine((text, ctx) => {
    const pattern = parseOriginPattern(text);
    if (typeof pattern === 'string') ctx.addIssue({ code: 'custom', message: pattern });
  })
  .meta({ docsType: 'origin, `https://*.host` or `"*"`' });

const MAX_AGE_LIMIT_MS = 86_400_000;

/** `gateway.cors` and `gateway.routes[].cors`: the browser origins that may call /api/ (src/gateway/cors.ts). */
export const cors = z
  .strictObject({
    origins: z
      .array(origin)
      .min(1)
      .describe(
        'The pages that may call the API from a browser: origins as the browser sends them (`"https://app.example.com"`, scheme, host and port only, no path), `"https://*.example.com"` for its direct subdomains (one label), or `"*"` for any page (only with `credentials: false`). `"null"` is refused.',
      ),
    methods: methods
      .default(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'])
      .describe(
        'The methods a preflight answer lists (`Access-Control-Allow-Methods`). A browser always allows `GET`, `HEAD` and `POST`; what a credential may do is decided by `auth.rules`.',
      ),
    allowHeaders: z
      .array(
        headerName.refine(
          (name) => name !== '*',
          '"*" is not accepted: leave allowHeaders unset to allow whatever headers the page asks for',
        ),
      )
      .optional()
      .describe(
        `The request headers a page may send: a preflight answer lists those the page asked for that are here, always with \`${ALWAYS_ALLOWED.join('` and `')}\`. Unset: any the page asks for.`,
      ),
    exposeHeaders: z
      .array(headerName)
      .default([])
      .describe(
        `Response headers a page may read besides the CORS-safelisted ones and gatehouse's own (\`${ALWAYS_EXPOSED.join('`, `')}\`, always exposed), e.g. the upstream's \`ETag\`. \`"*"\` exposes every header (only with \`credentials: false\`).`,
      ),
    credentials: z
      .boolean()
      .default(false)
      .describe(
        'Send `Access-Control-Allow-Credentials: true`, for pages that call with `credentials: "include"` (cookies, TLS client certificates). Not needed for `X-API-Key` or `Authorization` set by the page\'s own code.',
      ),
    maxAge: duration
      .refine(
        (ms) => ms % 1000 === 0 && ms <= MAX_AGE_LIMIT_MS,
        'maxAge must be whole seconds, at most "24h" (Chromium caps it at 2 h, Firefox at 24 h)',
      )
      .prefault('10m')
      .describe(
        'How long a browser may reuse a preflight answer (`Access-Control-Max-Age`), e.g. `"10m"`; Chromium uses at most 2 h.',
      ),
  })
  .superRefine((settings, ctx) => {
    if (!settings.credentials) return;
    // The Fetch standard refuses "*" on a credentialed answer; answering every origin with credentials instead is the classic CORS hole.
    settings.origins.forEach((text, i) => {
      if (text === '*')
        ctx.addIssue({
          code: 'custom',
          path: ['origins', i],
          message:
            '"*" cannot be combined with credentials: true (any page could call with its visitors\' cookies); list the origins',
        });
    });
    settings.exposeHeaders.forEach((name, i) => {
      if (name === '*')
        ctx.addIssue({
          code: 'custom',
          path: ['exposeHeaders', i],
          message: '"*" means every header only without credentials; with credentials: true list the names',
        });
    });
  });

export type CorsConfig = z.output<typeof cors>;
