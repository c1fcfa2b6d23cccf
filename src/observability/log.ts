import pino, { type Logger } from 'pino';

/** Paths pino blanks out wherever they appear: defence in depth, since gatehouse never logs a secret on purpose. */
const REDACT = [
  'secret',
  '*.secret',
  'apiKey',
  '*.apiKey',
  'key',
  '*.key',
  'token',
  '*.token',
  'password',
  '*.password',
  'headers.authorization',
  'headers["x-api-key"]',
  'headers["x-webhook-secret"]',
  'req.headers.authorization',
  'req.headers["x-api-key"]',
  'req.headers["x-webhook-secret"]',
];

export interface LoggerOptions {
  level?: string;
  /** `log.format`: `pretty` (readable text) or `json`; default: pretty when stdout is a terminal. */
  format?: 'json' | 'pretty';
  /** Where JSON lines go (tests pass a stream: always JSON then); default stdout. */
  destination?: pino.DestinationStream;
  /** Fields on every line, e.g. the worker number under gateway.workers. */
  bindings?: Record<string, string | number>;
}

/**
 * A JSON line's level as its name and its time as ISO 8601 in UTC (`"level":"info"`,
 * `"time":"2026-11-23T10:00:00.000Z"`), what log shippers and `jq` read without a table of
 * pino's numbers. pino builds the time string once per line (the bench's request-logging case
 * measures it).
 */
const JSON_LINES = {
  formatters: { level: (label: string) => ({ level: label }) },
  timestamp: pino.stdTimeFunctions.isoTime,
};

/** pino lines, secrets redacted: `format` pretty, or JSON (string levels, ISO times); unset, pretty on a TTY. */
export function createLogger(options: LoggerOptions = {}): Logger {
  const base = {
    level: options.level ?? 'info',
    base: { name: 'gatehouse', ...options.bindings },
    redact: { paths: REDACT, censor: '[redacted]' },
  };
  const pretty = !options.destination && (options.format ? options.format === 'pretty' : process.stdout.isTTY);
  if (pretty) {
    return pino({
      ...base,
      transport: { target: 'pino-pretty', options: { translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname,name' } },
    });
  }
  if (options.destination) return pino({ ...base, ...JSON_LINES }, options.destination);
  // Buffered asynchronous stdout: lines go out in 4 KiB writes, at least every 250 ms. A write
  // per request line was ~4 µs of the hot path. pino flushes on a normal exit; a crash can lose
  // the last quarter second of log lines, never a request.
  return pino(
    { ...base, ...JSON_LINES },
    pino.destination({ dest: 1, sync: false, minLength: 4096, periodicFlush: 250 }),
  );
}

/**
 * Warnings about a state rather than an event (a store that does not answer a probe, a scrape):
 * said when the state starts or its reason changes, and once when it ends, not at every check.
 * A load balancer probing every second would otherwise repeat one line for the whole outage.
 */
export class StateChangeLog {
  private readonly failing = new Map<string, string>();
  constructor(private readonly logger: Pick<Logger, 'warn' | 'info'>) {}

  /** `what` failed now (its `reason`): logged unless it was already failing for that reason. */
  failed(what: string, reason: string, fields: Record<string, unknown> = {}): void {
    if (this.failing.get(what) === reason) return;
    this.failing.set(what, reason);
    this.logger.warn({ ...fields, err: reason }, what);
  }

  /** `what` worked now: logged once if it had failed. */
  worked(what: string, message: string): void {
    if (this.failing.delete(what)) this.logger.info(message);
  }
}
