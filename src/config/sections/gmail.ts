import { z } from 'zod';
import { httpUrl, messageTemplate, positiveInt } from './common.js';

/** `webhooks.gmail`: new emails as actions (src/integrations/gmail/); written by `gatehouse webhooks gmail setup`. */
export const gmail = z
  .strictObject({
    account: z.email().describe('The mailbox watched (setup signs in as it).'),
    project: z
      .string()
      .regex(
        /^[a-z][a-z0-9-]{4,28}[a-z0-9]$/,
        'project must be a Google Cloud project id (6-30 lowercase letters, digits, hyphens)',
      )
      .describe(
        'The Google Cloud project id of the Pub/Sub topic and subscription (6-30 lowercase letters, digits, hyphens).',
      ),
    topic: z
      .string()
      .regex(/^[A-Za-z][\w.~+%-]{2,254}$/, 'topic: a Pub/Sub topic name (3-255 characters, starting with a letter)')
      .default('gatehouse-gmail')
      .describe("The Pub/Sub topic Gmail publishes the mailbox's changes to."),
    subscription: z
      .string()
      .regex(/^[A-Za-z][\w.~+%-]{2,254}$/, 'subscription: a Pub/Sub subscription name')
      .default('gatehouse-gmail-push')
      .describe('The Pub/Sub subscription that pushes to gatehouse, or that gatehouse pulls from.'),
    mode: z
      .enum(['push', 'pull'])
      .default('push')
      .describe(
        '`"push"`: Pub/Sub POSTs to `push.path` on the webhook listener (needs a public URL and `push`); `"pull"`: gatehouse pulls, no public URL needed.',
      ),
    labels: z.array(z.string().min(1)).min(1).default(['INBOX']).describe('The Gmail label ids watched.'),
    action: z
      .enum(['message', 'agent'])
      .default('message')
      .describe('What each new email becomes; that action needs a `webhooks.targets` entry.'),
    template: messageTemplate
      .default('New email from {{from}}: {{subject}}')
      .describe(
        "Builds the action's `message` from the email (`{{from}}`, `{{to}}`, `{{subject}}`, `{{snippet}}`, …).",
      ),
    includeBody: z
      .boolean()
      .default(false)
      .describe("Add the text body (text/plain, else the HTML's text) to the payload, cut to `maxBytes`."),
    maxBytes: positiveInt.default(20_000).describe('The most bytes of body included, cut at a whole UTF-8 character.'),
    renewMinutes: z
      .number()
      .int()
      .min(1)
      .max(10_080)
      .default(720)
      .describe(
        'Minutes between renewals of the Gmail watch; at start it is renewed when it expires within this time.',
      ),
    push: z
      .strictObject({
        path: z
          .string()
          .regex(/^\/webhook\/[A-Za-z0-9._~\-/]+$/, 'push.path must start with /webhook/')
          .default('/webhook/gmail')
          .describe('The path on the webhook listener that Pub/Sub pushes to.'),
        audience: httpUrl('push.audience').describe(
          'The `aud` of the push tokens: the push endpoint URL setup gave Pub/Sub.',
        ),
        serviceAccountEmail: z.email().describe('The service account Pub/Sub signs the push tokens as.'),
        jwksUri: httpUrl('push.jwksUri').optional().meta({
          description:
            "The key set push tokens are checked against, always when given. Unset: the one under `googleApiUrl` when that is set, else Google's.",
          docsDefault: "under `googleApiUrl`, else Google's",
        }),
      })
      .optional()
      .describe(
        'Push mode: Pub/Sub POSTs to `path` with an OIDC token for `audience`, signed as `serviceAccountEmail`. Required with `mode: "push"`.',
      ),
    pull: z
      .strictObject({
        intervalMs: positiveInt
          .default(1_000)
          .describe('Milliseconds to wait after an empty pull before pulling again.'),
        maxMessages: z.number().int().min(1).max(1000).default(10).describe('The most messages asked for per pull.'),
      })
      .prefault({})
      .describe('Pull mode: how often and how much gatehouse pulls.'),
    googleApiUrl: httpUrl('googleApiUrl')
      .optional()
      .describe(
        "One base URL for every Google endpoint (OAuth, Gmail, Pub/Sub, the push key set), for egress proxies and tests; setup uses it too. Unset: Google's own hosts.",
      ),
  })
  .superRefine((g, ctx) => {
    if (g.mode === 'push' && !g.push)
      ctx.addIssue({
        code: 'custom',
        path: ['push'],
        message: 'mode "push" needs push: { audience, serviceAccountEmail } (or use mode: "pull")',
      });
  });
