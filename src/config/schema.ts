import { z } from 'zod';
import { admin } from './sections/admin.js';
import type { jwtSettings } from './sections/auth.js';
import { channels } from './sections/channels.js';
import type { httpLimits } from './sections/common.js';
import { gateway } from './sections/gateway.js';
import { log } from './sections/log.js';
import { observability } from './sections/observability.js';
import { shutdown } from './sections/shutdown.js';
import { storage } from './sections/storage.js';
import { webhooks } from './sections/webhooks.js';

/**
 * The configuration schema: the single source of the Config type, assembled from one file per
 * section under sections/. Defaults live there; load.ts only expands ${ENV} and { file }
 * references before parsing.
 */

export { CHANNEL_SEND_PREFIX, channelSendPath } from './sections/channels.js';
export { webhookActions, type WebhookAction } from './sections/webhooks.js';
export type { VerifyConfig } from './sections/verify.js';

export const configSchema = z
  .strictObject({
    $schema: z
      .string()
      .optional()
      .describe(
        'For editors: the JSON Schema this file follows (e.g. `"./gateway.schema.json"`, from `gatehouse config schema`); gatehouse ignores it.',
      ),
    storage,
    log,
    gateway,
    webhooks,
    channels,
    admin,
    observability,
    shutdown,
  })
  .superRefine((config, ctx) => {
    if (config.admin && config.admin.token === undefined && !isLoopbackHost(config.admin.listen.host)) {
      ctx.addIssue({
        code: 'custom',
        path: ['admin', 'token'],
        message: `required when admin.listen.host is not loopback (${config.admin.listen.host}): set token, e.g. "\${ADMIN_TOKEN}"`,
      });
    }
    for (const [name, channel] of Object.entries(config.channels)) {
      if (!config.webhooks.enabled)
        ctx.addIssue({
          code: 'custom',
          path: ['channels', name],
          message: 'channels need webhooks.enabled: true (their events arrive on the webhook listener)',
        });
      else if (!config.webhooks.targets[channel.action])
        ctx.addIssue({
          code: 'custom',
          path: ['channels', name, 'action'],
          message: `action "${channel.action}" has no target: add webhooks.targets["${channel.action}"]`,
        });
    }
    const { auth, listen: at } = config.gateway;
    const hooksAt = config.webhooks.listen;
    const wildcard = (host: string) => host === '0.0.0.0' || host === '::';
    if (
      config.webhooks.enabled &&
      at.port !== 0 &&
      at.port === hooksAt.port &&
      (at.host === hooksAt.host || wildcard(at.host) || wildcard(hooksAt.host))
    ) {
      ctx.addIssue({
        code: 'custom',
        path: ['webhooks', 'listen', 'port'],
        message: `the webhook receiver and the gateway cannot both listen on ${hooksAt.host}:${hooksAt.port}; give webhooks.listen another port`,
      });
    }
    // A certificate is a credential only once verified: the CA is gateway.tls.clientCertificates.
    if (auth.clientCertificate && !config.gateway.tls?.clientCertificates)
      ctx.addIssue({
        code: 'custom',
        path: ['gateway', 'auth', 'clientCertificate'],
        message: `needs ${config.gateway.tls ? 'gateway.tls.clientCertificates' : 'gateway.tls with clientCertificates'} (the CA that verifies client certificates)`,
      });
    const hasCredential =
      auth.apiKey !== undefined ||
      auth.apiKeys.length > 0 ||
      auth.bearer !== undefined ||
      auth.clientCertificate !== undefined;
    // Secure by default: an open edge on a reachable address needs an explicit opt-in.
    if ((!auth.enabled || !hasCredential) && !isLoopbackHost(at.host) && !auth.allowInsecure) {
      ctx.addIssue({
        code: 'custom',
        path: ['gateway', 'auth'],
        message: `${auth.enabled ? 'no credential is configured' : 'auth is disabled'} while listening on non-loopback ${at.host}; configure apiKey/apiKeys/bearer/clientCertificate or set gateway.auth.allowInsecure: true`,
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
export type ClientCertificateConfig = NonNullable<AuthConfig['clientCertificate']>;
export type WebhooksConfig = Config['webhooks'];
export type GmailConfig = NonNullable<WebhooksConfig['gmail']>;
export type ChannelConfig = Config['channels'][string];
export type StorageConfig = Config['storage'];
export type AdminConfig = NonNullable<Config['admin']>;
export type TracingConfig = NonNullable<Config['observability']['tracing']>;
export type PostgresStorageConfig = Extract<StorageConfig, { driver: 'postgres' }>;
