import { z } from 'zod';

/** `log`: what gatehouse logs and how it is written (src/observability/log.ts). Read at start only. */
export const log = z
  .strictObject({
    level: z
      .enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'])
      .default('info')
      .describe('The least severe level logged, from `"fatal"` to `"trace"`; `"silent"` logs nothing.'),
    format: z.enum(['json', 'pretty']).optional().meta({
      description:
        '`"json"`: one JSON object a line, with `"level":"info"` and an ISO 8601 `"time"` (UTC). `"pretty"`: readable text, for a terminal. Unset: pretty when stdout is a terminal, JSON otherwise.',
      docsDefault: 'pretty on a terminal, else `json`',
    }),
  })
  .prefault({})
  .describe('What gatehouse logs, on stdout. Changes take effect at the next restart.');
