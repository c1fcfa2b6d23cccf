import { randomBytes } from 'node:crypto';
import type { Command } from 'commander';
import { UsageError } from '../errors.js';
import { generateApiKey, hashApiKey } from '../gateway/credentials/api-key.js';

const DURATION = /^([1-9]\d*)(m|h|d|w|y)$/;
const UNIT_MS = { m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000, y: 31_536_000_000 } as const;

const MAX_DURATION_MS = 1000 * UNIT_MS.y;

/** `90d` → milliseconds (units m, h, d, w, y; at most 1000y); throws UsageError naming `flag` otherwise. */
export function parseDuration(value: string, flag: string): number {
  const match = DURATION.exec(value);
  if (!match) throw new UsageError(`${flag}: expected a duration like 90d, 12h, 30m, 2w, 1y, got "${value}"`);
  const ms = Number(match[1]) * UNIT_MS[match[2] as keyof typeof UNIT_MS];
  // Past this a date is no longer a date (and the database's bigint overflows): one line, not a stack.
  if (!(ms <= MAX_DURATION_MS)) throw new UsageError(`${flag}: ${value} is longer than 1000y`);
  return ms;
}

/** A duration from now (`90d`) or an ISO date-time, as an absolute expiry. */
export function parseExpiry(value: string, now: number = Date.now()): Date {
  if (DURATION.test(value)) return new Date(now + parseDuration(value, '--expires'));
  const absolute = Date.parse(value);
  // Date.parse rolls 2030-02-30 over to March: insist the calendar date survives the round trip.
  if (
    /^\d{4}-\d{2}-\d{2}/.test(value) &&
    !Number.isNaN(absolute) &&
    new Date(absolute).toISOString().slice(0, 10) === value.slice(0, 10)
  ) {
    if (absolute <= now) throw new UsageError(`--expires ${value} is in the past`);
    return new Date(absolute);
  }
  throw new UsageError(`--expires: expected a duration like 90d, 12h, 30m, 2w, 1y or an ISO date, got "${value}"`);
}

/** `gatehouse gateway api-key generate`: prints a new key once and the config entry holding its hash. */
export function registerGatewayCommands(program: Command): void {
  program
    .command('gateway')
    .description('manage the /api/ gateway')
    .command('api-key')
    .description('manage API keys')
    .command('generate')
    .description('generate a new API key and print the config entry for it')
    .option('--id <name>', 'key id, shown upstream as X-Gatehouse-Subject (default: key-<date>-<random>)')
    .option('--expires <when>', 'expiry: a duration (90d, 12h, 1y) or an ISO date-time')
    .option('--json', 'print { key, entry } as JSON')
    .action((options: { id?: string; expires?: string; json?: boolean }) => {
      const id = options.id ?? defaultKeyId();
      if (!/^[A-Za-z0-9._:-]{1,64}$/.test(id))
        throw new UsageError(`--id: 1-64 characters of A-Z a-z 0-9 . _ : - (got "${id}")`);
      const key = generateApiKey();
      const entry = {
        id,
        hash: hashApiKey(key),
        ...(options.expires !== undefined ? { expiresAt: parseExpiry(options.expires).toISOString() } : {}),
      };
      if (options.json) {
        process.stdout.write(JSON.stringify({ key, entry }) + '\n');
        return;
      }
      const fields = Object.entries(entry)
        .map(([k, v]) => `${k}: ${JSON.stringify(v)}`)
        .join(', ');
      process.stdout.write(
        `API key (shown once; store it now, gatehouse keeps only its hash):\n\n  ${key}\n\n` +
          `Add this entry to gateway.auth.apiKeys in your config, then reload (kill -HUP <pid>):\n\n  { ${fields} },\n`,
      );
    });
}

function defaultKeyId(): string {
  const day = new Date().toISOString().slice(0, 10).replace(/-/g, '');
  return `key-${day}-${randomBytes(2).toString('hex')}`;
}
