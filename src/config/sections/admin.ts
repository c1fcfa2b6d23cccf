import { z } from 'zod';
import { httpLimits, listen } from './common.js';

/**
 * `admin`: the operator's listener (src/admin/listener.ts): /metrics, /readyz, /healthz. Off unless
 * configured. Anywhere but loopback it needs `token` (checked in configSchema's superRefine): the
 * metrics name endpoints, actions and error rates, which is for operators only.
 */
export const admin = z
  .strictObject({
    listen: listen(9090).prefault({}).describe('Where the admin listener listens. A change needs a restart.'),
    token: z
      .string()
      .min(16, 'admin token must be at least 16 characters')
      .regex(/^[\x21-\x7e]+$/, 'admin token must be printable ASCII without blanks')
      .optional()
      .describe(
        'When set, /metrics answers only `Authorization: Bearer <token>` (16 or more printable characters, e.g. `"${ADMIN_TOKEN}"` or `{ file }`); required when `listen.host` is not loopback. Reloaded on SIGHUP.',
      ),
    // Scrapes and probes are small and quick: short timeouts.
    limits: httpLimits(30_000)
      .prefault({})
      .describe("The HTTP parser's limits and timeouts on the admin listener. A change needs a restart."),
  })
  .optional()
  .describe(
    "The operator's listener: /metrics (Prometheus), /readyz and /healthz. Off unless this section is present.",
  );
