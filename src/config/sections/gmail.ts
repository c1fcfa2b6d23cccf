import { z } from 'zod';
import { compileTemplate } from '../../webhooks/translate.js';
import { httpUrl, positiveInt } from './common.js';

/** `webhooks.gmail`: new emails as actions (src/integrations/gmail/); written by `gatehouse webhooks gmail setup`. */
export const gmail = z
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
