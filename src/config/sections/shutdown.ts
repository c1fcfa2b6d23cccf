import { z } from 'zod';
import { duration } from './common.js';

/**
 * `shutdown`: how SIGTERM/SIGINT drains (src/cli/start.ts, RunningGatehouse.close). /readyz turns
 * 503 at once; the listeners keep accepting for `acceptGrace` (answers say `Connection: close`) so a
 * load balancer that has not yet seen /readyz fail sends no client into a refused connection; then
 * they stop accepting and in-flight requests get `timeout` to finish.
 */
export const shutdown = z
  .strictObject({
    acceptGrace: z
      .union([z.literal(0), duration], {
        error: 'acceptGrace must be 0 or a duration as text, like "5s" or "1500ms"',
      })
      .prefault('5s')
      .meta({ docsType: '0 or duration like "5s"' })
      .describe(
        'After SIGTERM/SIGINT, how long the listeners (`/api/`, webhooks) keep accepting new connections while /readyz already answers 503; every answer in that window says `Connection: close`. Longer than the load balancer takes to see /readyz fail (health check interval × unhealthy threshold). `0`: stop accepting at once. A second signal ends it early. Reloaded on SIGHUP.',
      ),
    timeout: duration
      .prefault('10s')
      .describe(
        "Then, once the listeners stop accepting, how long in-flight requests and open WebSockets have to finish before they are cut. With webhooks, delivery attempts in flight then get as long again. A supervisor's stop timeout (systemd's `TimeoutStopSec`, `docker stop -t`) must exceed `acceptGrace` + `timeout` (+ `timeout` again with webhooks) + 3 s: by then gatehouse has exited, with 1 if closing was still unfinished.",
      ),
  })
  .prefault({})
  .describe('How gatehouse drains on SIGTERM/SIGINT: keep accepting for a grace, then finish what is in flight.');
