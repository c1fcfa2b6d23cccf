import { z } from 'zod';
import { compileTemplate } from '../../webhooks/translate.js';
import { CHANNEL_PATHS, isChannelPath } from './channels.js';
import { hookSecret, httpLimits, httpUrl, listen, positiveInt } from './common.js';
import { gmail } from './gmail.js';
import { normalizeVerify, verifySchema } from './verify.js';

export const webhookActions = ['system-event', 'message', 'agent'] as const;
export type WebhookAction = (typeof webhookActions)[number];

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

const webhookTarget = z.strictObject({
  url: httpUrl('target url'),
  secret: z.string().min(16, 'target secret must be at least 16 characters').optional(),
  timeoutMs: positiveInt.optional(),
});

const DURATION_UNIT_MS = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;
const RETRY_FOR_DEFAULT = '72h';
/** A duration as text (`72h`, `30m`, `7d`, `90s`), parsed to milliseconds. */
const retryBudget = z.string({ error: (issue) => `${issue.input === undefined ? 'required: ' : ''}a duration as text, like "72h", "30m", "7d" or "90s"` })
  .regex(/^[1-9]\d*(ms|s|m|h|d)$/, 'a duration like "72h", "30m", "7d" or "90s"')
  .transform((text) => {
    const [, amount, unit] = /^(\d+)(ms|s|m|h|d)$/.exec(text)!;
    return Number(amount) * DURATION_UNIT_MS[unit as keyof typeof DURATION_UNIT_MS];
  });

export const webhooks = z
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
