/**
 * The CPU the issue-16 steps add to one /api/ request, measured in a tight loop in one process
 * (steadier than req/s on a shared machine): the decoded path, three rules (one matching) and a
 * by-key rate limit with its two headers, as the bench case "gatehouse api-key + 3 rules + rate limit"
 * configures them.
 *
 *   node --import tsx bench/authorization-steps.ts
 */
import { parseConfig } from '../src/config/load.js';
import { compileAuthorizer } from '../src/gateway/authorize.js';
import type { Identity } from '../src/gateway/credentials/authenticate.js';
import { matchablePath } from '../src/gateway/path-pattern.js';
import { compileRateLimiter, RateLimitState } from '../src/gateway/rate-limit.js';

const config = parseConfig({
  gateway: {
    upstream: { target: 'http://127.0.0.1:1' },
    rateLimits: [{ by: 'key', requests: 100_000_000, per: '1s' }],
    auth: {
      rules: [
        { paths: ['/api/items/**'], methods: ['GET', 'HEAD'], scopes: ['items:read'] },
        { paths: ['/api/items/**'], methods: ['POST', 'PUT', 'PATCH', 'DELETE'], scopes: ['items:write'] },
        { paths: ['/api/admin/**'], claims: { groups: 'admins' } },
      ],
    },
  },
});
const authorize = compileAuthorizer(config.gateway.auth);
const limiter = compileRateLimiter(config.gateway.rateLimits, [], new RateLimitState());
const identity: Identity = {
  methods: ['api-key'],
  subject: 'bench',
  keyId: 'bench',
  scopes: ['items:read'],
  claims: undefined,
  keyRateLimit: undefined,
};
const headers = new Map<string, string>();

function once(url: string): void {
  const path = matchablePath(url);
  if (typeof path !== 'string' || authorize('GET', path, identity)) throw new Error('refused');
  const outcome = limiter.check('GET', path, identity, '127.0.0.1');
  if (outcome.refused) throw new Error('limited');
  for (const name in outcome.headers) headers.set(name, outcome.headers[name]!);
}

const N = 1_000_000;
for (let i = 0; i < 100_000; i++) once('/api/items');
const started = process.cpuUsage();
for (let i = 0; i < N; i++) once('/api/items');
const cpu = process.cpuUsage(started);
console.log(
  JSON.stringify({ requests: N, cpuMicrosPerRequest: Math.round(((cpu.user + cpu.system) / N) * 100) / 100 }),
);
