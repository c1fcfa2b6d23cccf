import { z } from 'zod';
import { CHANNEL_PATHS, isChannelPath } from './channels.js';
import { duration, hookSecret, httpLimits, httpUrl, listen, messageTemplate, positiveInt } from './common.js';
import { gmail } from './gmail.js';
import { normalizeVerify, verifySchema } from './verify.js';

export const webhookActions = ['system-event', 'message', 'agent'] as const;
export type WebhookAction = (typeof webhookActions)[number];

const webhookEndpoint = z
  .strictObject({
    path: z
      .string()
      .regex(/^\/webhook\/[A-Za-z0-9._~\-/]+$/, 'path must start with /webhook/ and use only A-Z a-z 0-9 . _ ~ - /')
      .refine(
        (p) => !p.includes('//') && !p.endsWith('/') && !p.split('/').some((seg) => seg === '.' || seg === '..'),
        'path must not contain empty, "." or ".." segments nor end with "/"',
      )
      .describe(
        'The exact path senders POST to, starting `/webhook/` (not `/webhook/channels/`), unique, compared case-sensitively; no empty, `.` or `..` segments, no trailing `/`.',
      ),
    secret: hookSecret('secret')
      .optional()
      .describe(
        'The value senders put in `X-Webhook-Secret`, 16 or more characters (`${VAR}` or `{ file }`), for senders you control. Give `secret` or `verify`.',
      ),
    verify: verifySchema
      .optional()
      .describe(
        'Instead of `secret`: how a sender that signs its requests is proven, by `type` (GitHub, Stripe, Slack, …). Give `secret` or `verify`.',
      ),
    action: z
      .enum(webhookActions)
      .describe("What an accepted event becomes, delivered to that action's target in `webhooks.targets`."),
    template: messageTemplate
      .optional()
      .describe(
        'Builds the action\'s `message` from the body with `{{a.b[0].c}}` paths, e.g. `"New message from {{sender.name}}: {{text}}"`. Unset: the body\'s own string `message`, if any.',
      ),
  })
  .superRefine((endpoint, ctx) => {
    if ((endpoint.secret === undefined) === (endpoint.verify === undefined)) {
      ctx.addIssue({
        code: 'custom',
        message:
          endpoint.secret === undefined
            ? 'give either secret (X-Webhook-Secret) or verify'
            : 'give secret or verify, not both',
      });
    }
    const v = endpoint.verify;
    if (
      v &&
      (v.type === 'github' || v.type === 'stripe' || v.type === 'standard-webhooks') &&
      (v.secret === undefined) === (v.secrets === undefined)
    ) {
      ctx.addIssue({ code: 'custom', path: ['verify'], message: `${v.type}: give secret or secrets (one of them)` });
    }
  })
  .transform(({ secret, verify, ...endpoint }) => ({
    ...endpoint,
    verify: normalizeVerify(verify ?? { type: 'secret', secret: secret! }),
  }));

const webhookTarget = z.strictObject({
  url: httpUrl('target url').describe('The absolute http(s) URL the action is POSTed to.'),
  secret: z
    .string()
    .min(16, 'target secret must be at least 16 characters')
    .optional()
    .describe(
      'Signs every delivery the Standard Webhooks way (`webhook-signature`), 16 or more characters; a `whsec_<base64>` secret is used decoded. Unset: unsigned.',
    ),
  timeoutMs: positiveInt.optional().meta({
    description:
      'Milliseconds this target has to answer, from the request sent (the wait for a connection is bounded apart, by as long). Unset: `webhooks.delivery.timeoutMs`.',
    docsDefault: '`delivery.timeoutMs`',
  }),
});
const targetFor = (action: string) =>
  webhookTarget
    .optional()
    .describe(
      `Where \`"${action}"\` actions are delivered. Unset: an endpoint, Gmail or channel with that action is a config error.`,
    );

const RETRY_FOR_DEFAULT = '72h';

export const webhooks = z
  .strictObject({
    enabled: z
      .boolean()
      .default(false)
      .describe('`true` starts the receiver; otherwise it does not listen at all. A change needs a restart.'),
    listen: listen(8081)
      .prefault({})
      .describe("Where the receiver listens: its own port, apart from the gateway's. A change needs a restart."),
    // Bodies are small and bounded by bodyTimeoutMs: a short whole-request time.
    limits: httpLimits(60_000)
      .prefault({})
      .describe("The HTTP parser's limits and timeouts on the receiver's listener. A change needs a restart."),
    maxBodyBytes: positiveInt
      .default(262_144)
      .describe('The largest body accepted, in bytes: larger gets 413, and reading stops at the limit.'),
    // Capped well below where JSON.stringify runs out of stack.
    maxJsonDepth: z
      .number()
      .int()
      .min(1)
      .max(1000)
      .default(64)
      .describe(
        'How deep a JSON body may nest arrays and objects (the top level is 1); deeper is 400 `invalid_json`, found before the body is parsed.',
      ),
    bodyTimeoutMs: positiveInt
      .default(15_000)
      .describe('Milliseconds a body may take to arrive in full; past it, 408 (slow senders, slow-loris).'),
    // prefault, not default: zod leaves a default over a transform out of the JSON Schema; both parse alike.
    endpoints: z
      .array(webhookEndpoint)
      .prefault([])
      .describe('The paths that accept webhooks: how each sender is proven, and the action its events become.'),
    targets: z
      .strictObject({
        'system-event': targetFor('system-event'),
        message: targetFor('message'),
        agent: targetFor('agent'),
      })
      .prefault({})
      .describe('Where each action is delivered: one internal target per action.'),
    delivery: z
      .strictObject({
        retryFor: duration
          .prefault(RETRY_FOR_DEFAULT)
          .describe(
            'How long after acceptance an event is retried before it is dead (`"72h"` as Stripe, `"30m"`, `"7d"`, `"90s"`); the last attempt is made at the deadline itself.',
          ),
        maxAttempts: positiveInt
          .optional()
          .describe(
            'A cap on attempts per round (from acceptance, or from a `deliveries retry`): the event is dead on reaching it, even within `retryFor`. Unset: only `retryFor` limits them.',
          ),
        initialBackoffMs: positiveInt
          .default(1_000)
          .describe(
            'The first retry waits a random time up to this many milliseconds; the cap doubles with each failed attempt.',
          ),
        maxBackoffMs: positiveInt
          .default(3_600_000)
          .describe("The longest wait between two attempts, in milliseconds; it also caps a target's `Retry-After`."),
        timeoutMs: positiveInt
          .default(10_000)
          .describe(
            'Milliseconds a target has to answer, from the request sent on a connected socket, before the attempt counts as failed and is retried. Getting the connection is bounded apart, by as long (a connect failure).',
          ),
        concurrency: positiveInt.default(16).describe('Attempts in flight at once, per action.'),
      })
      .prefault({})
      .describe(
        'How events reach their targets: at least once, retried with capped exponential backoff and full jitter until a 2xx or dead.',
      ),
    gmail: gmail
      .optional()
      .describe(
        'New emails of a Gmail mailbox as actions, through Google Pub/Sub; written by `gatehouse webhooks gmail setup`. A change needs a restart.',
      ),
  })
  .superRefine((hooks, ctx) => {
    const seen = new Map<string, number>();
    hooks.endpoints.forEach((endpoint, i) => {
      const first = seen.get(endpoint.path);
      if (first !== undefined)
        ctx.addIssue({
          code: 'custom',
          path: ['endpoints', i, 'path'],
          message: `duplicate endpoint path "${endpoint.path}" (also at endpoints[${first}])`,
        });
      else seen.set(endpoint.path, i);
      if (isChannelPath(endpoint.path))
        ctx.addIssue({
          code: 'custom',
          path: ['endpoints', i, 'path'],
          message: `${CHANNEL_PATHS} is reserved for channels`,
        });
      if (!hooks.targets[endpoint.action]) {
        ctx.addIssue({
          code: 'custom',
          path: ['endpoints', i, 'action'],
          message: `action "${endpoint.action}" has no target: add webhooks.targets["${endpoint.action}"]`,
        });
      }
    });
    const { gmail } = hooks;
    if (gmail) {
      if (!hooks.enabled)
        ctx.addIssue({
          code: 'custom',
          path: ['gmail'],
          message: 'webhooks.gmail needs webhooks.enabled: true (emails go through the webhook queue)',
        });
      if (!hooks.targets[gmail.action])
        ctx.addIssue({
          code: 'custom',
          path: ['gmail', 'action'],
          message: `action "${gmail.action}" has no target: add webhooks.targets["${gmail.action}"]`,
        });
      const clash = gmail.mode === 'push' && gmail.push && seen.has(gmail.push.path);
      if (clash)
        ctx.addIssue({
          code: 'custom',
          path: ['gmail', 'push', 'path'],
          message: `"${gmail.push!.path}" is also an endpoint path`,
        });
      if (gmail.push && isChannelPath(gmail.push.path))
        ctx.addIssue({
          code: 'custom',
          path: ['gmail', 'push', 'path'],
          message: `${CHANNEL_PATHS} is reserved for channels`,
        });
    }
  })
  .prefault({})
  .describe(
    'The webhook receiver: a second listener that proves each sender, stores the event durably, answers 202, and delivers it as an action to a target.',
  );
