import { compileMethodSet, compilePathPatterns } from '../gateway/path-pattern.js';
import { formatPath } from './problems.js';
import { channelSendPath, isLoopbackHost, type Config } from './schema.js';
import type { CorsConfig } from './sections/cors.js';

const EXPIRY_NOTICE_MS = 7 * 86_400_000;

/**
 * Likely mistakes in a valid config: `config check` prints them and the server logs them at
 * start (and after a reload); neither refuses to run. One line each, `path: what and why`.
 */
export function configWarnings(config: Config, now: number = Date.now()): string[] {
  const warnings: string[] = [];
  const { auth } = config.gateway;
  const jwt = auth.bearer?.jwt;
  // An identity provider signs tokens for every client it serves with the same keys: without an
  // audience, a token issued to any other application of that provider is accepted here.
  if (jwt?.jwksUri !== undefined && jwt.audience === undefined) {
    warnings.push(
      "gateway.auth.bearer.jwt.audience: not set, so tokens the identity provider issued for any other client or API are accepted; set it to this API's audience",
    );
  }
  const hasCredential =
    auth.apiKey !== undefined ||
    auth.apiKeys.length > 0 ||
    auth.bearer !== undefined ||
    auth.clientCertificate !== undefined;
  if (auth.enabled && !hasCredential) {
    warnings.push(
      `gateway.auth: no credential is configured (apiKey, apiKeys, bearer or clientCertificate), so every /api/ request is refused with 401${isLoopbackHost(config.gateway.listen.host) ? '' : ' (allowInsecure is set)'}`,
    );
  }
  // gatehouse ends TLS itself: what stands in front can only pass TCP through and cannot set
  // X-Forwarded-For, so a trusted address's X-Forwarded-For is the client's own claim.
  if (config.gateway.tls?.clientCertificates !== undefined && config.gateway.trustProxy.length > 0) {
    warnings.push(
      "gateway.trustProxy: set beside gateway.tls.clientCertificates, but gatehouse ends TLS itself, so a proxy in front can only pass TCP through: X-Forwarded-For from a trusted address is the client's own claim (the lockout and allowedIPs then follow it); leave trustProxy empty",
    );
  }
  auth.apiKeys.forEach((key, i) => {
    if (key.expiresAt === undefined) return;
    const left = Date.parse(key.expiresAt) - now;
    if (left <= 0)
      warnings.push(`gateway.auth.apiKeys[${i}].expiresAt: key "${key.id}" expired at ${key.expiresAt}; it is refused`);
    else if (left <= EXPIRY_NOTICE_MS)
      warnings.push(
        `gateway.auth.apiKeys[${i}].expiresAt: key "${key.id}" expires in ${Math.ceil(left / 3_600_000)} h (${key.expiresAt}); issue its successor`,
      );
  });
  const { webhooks } = config;
  if (!webhooks.enabled && webhooks.endpoints.length > 0) {
    warnings.push(
      `webhooks.enabled: false, so the ${webhooks.endpoints.length} configured endpoint(s) receive nothing; set it to true`,
    );
  }
  const templates: [(string | number)[], string | undefined][] = [
    ...webhooks.endpoints.map((e, i): [(string | number)[], string | undefined] => [
      ['webhooks', 'endpoints', i, 'template'],
      e.template,
    ]),
    [['webhooks', 'gmail', 'template'], webhooks.gmail?.template],
  ];
  for (const [at, template] of templates) {
    if (template === undefined) continue;
    const opened = template.split('{{').length - 1;
    const closed = template.split('}}').length - 1;
    // A lone "{{" or "}}" is kept as literal text, so the placeholder it was meant to be never fills in.
    if (opened !== closed)
      warnings.push(
        `${formatPath(at)}: unbalanced {{ }} (${opened} "{{" against ${closed} "}}"): the unmatched part is sent as literal text`,
      );
  }
  // Rules and limits that can never apply as written (issue 16): valid, but surely not what was meant.
  const { rateLimits } = config.gateway;
  auth.rules.forEach((rule, i) => {
    if (rule.claims !== undefined && Object.keys(rule.claims).length > 0 && auth.bearer === undefined) {
      warnings.push(
        `gateway.auth.rules[${i}].claims: no bearer JWT is configured, so no request has claims and this rule refuses every request it matches`,
      );
    }
  });
  const hasKeys = auth.apiKey !== undefined || auth.apiKeys.length > 0;
  rateLimits.forEach((limit, i) => {
    if (limit.by === 'key' && !hasKeys)
      warnings.push(`gateway.rateLimits[${i}]: by "key" with no API key configured limits nothing`);
  });
  // The channel API posts as the organisation's bot: open to every credential, it is an egress point anyone with a key can use.
  for (const name of Object.keys(config.channels)) {
    if (config.channels[name]!.send !== undefined || !auth.defaultAllow) continue;
    const path = channelSendPath(name);
    const covered = auth.rules.some(
      (rule) => compilePathPatterns(rule.paths)(path) && (compileMethodSet(rule.methods)?.has('POST') ?? true),
    );
    if (!covered) {
      warnings.push(
        `channels.${name}: any credential the gateway accepts can send through this channel (no send.scopes, no rule covers POST ${path}, gateway.auth.defaultAllow is true); set send: { scopes: ["channels:send:${name}"] } and grant that scope to the callers that send`,
      );
    }
  }
  // A page served over plain HTTP can be rewritten by anyone on its network, script included: allowing it lets them call the API as its visitors.
  const corsSettings: [string, CorsConfig | false | undefined][] = [
    ['gateway.cors', config.gateway.cors],
    ...config.gateway.routes.map((route, i): [string, CorsConfig | false | undefined] => [
      `gateway.routes[${i}].cors`,
      route.cors,
    ]),
  ];
  for (const [at, settings] of corsSettings) {
    if (!settings) continue;
    settings.origins.forEach((origin, i) => {
      const host = /^http:\/\/(?:\*\.)?(\[[^\]]*\]|[^:]*)/i.exec(origin)?.[1]?.toLowerCase();
      if (host === undefined || isLoopbackHost(host.replace(/^\[|\]$/g, '')) || host.endsWith('.localhost')) return;
      warnings.push(
        `${at}.origins[${i}]: "${origin}" is plain http: anyone on that page's network can change it and call the API as its visitors; use https`,
      );
    });
  }
  return warnings;
}
