import { z } from 'zod';
import { httpLimits, listen } from './common.js';

/**
 * `admin`: the operator's listener (src/admin/listener.ts): /metrics, /readyz, /healthz. Off unless
 * configured. Anywhere but loopback it needs `token` (checked in the superRefine below): the
 * metrics name endpoints, actions and error rates, which is for operators only.
 */
export const admin = z.strictObject({
  listen: listen(9090).prefault({}),
  /** Required as `Authorization: Bearer <token>` on /metrics when set. */
  token: z.string().min(16, 'admin token must be at least 16 characters').regex(/^[\x21-\x7e]+$/, 'admin token must be printable ASCII without blanks').optional(),
  /** Scrapes and probes are small and quick: short timeouts. */
  limits: httpLimits(30_000).prefault({}),
});
