import pino, { type Logger } from 'pino';

/** Paths pino blanks out wherever they appear: defence in depth, since gatehouse never logs a secret on purpose. */
const REDACT = [
  'secret', '*.secret', 'apiKey', '*.apiKey', 'key', '*.key', 'token', '*.token', 'password', '*.password',
  'headers.authorization', 'headers["x-api-key"]', 'headers["x-webhook-secret"]',
  'req.headers.authorization', 'req.headers["x-api-key"]', 'req.headers["x-webhook-secret"]',
];

export interface LoggerOptions {
  level?: string;
  /** Human-readable output; default: when stdout is a terminal. */
  pretty?: boolean;
  /** Where JSON lines go (tests pass a stream); default stdout. */
  destination?: pino.DestinationStream;
}

/** pino JSON lines, pretty on a TTY, secrets redacted. */
export function createLogger(options: LoggerOptions = {}): Logger {
  const base = {
    level: options.level ?? 'info',
    base: { name: 'gatehouse' },
    redact: { paths: REDACT, censor: '[redacted]' },
  };
  if (options.destination) return pino(base, options.destination);
  if (options.pretty ?? process.stdout.isTTY) {
    return pino({ ...base, transport: { target: 'pino-pretty', options: { translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname,name' } } });
  }
  // Asynchronous stdout: lines written while a write is pending go out together in one syscall.
  // pino flushes it on a normal exit; a crash can lose the last lines, never a request.
  return pino(base, pino.destination({ dest: 1, sync: false }));
}
