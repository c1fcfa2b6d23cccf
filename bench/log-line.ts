/**
 * The CPU one log line costs, measured in a tight loop in one process (steadier than req/s on a
 * shared machine): the /api/ request line (src/http/request-context.ts, one per request) and an
 * ordinary pino line, with `log.format` json's level name and ISO 8601 time against pino's
 * defaults (level 30, epoch milliseconds), which gatehouse wrote before. Lines go to /dev/null in
 * 4 KiB writes, as `gatehouse start` writes stdout; synchronously here, since a loop that never
 * yields would let an asynchronous destination's buffer grow without end.
 *
 *   node --import tsx bench/log-line.ts
 */
import pino, { type Logger } from 'pino';
import { requestLogger } from '../src/http/request-context.js';
import { createLogger } from '../src/observability/log.js';

const destination = () => pino.destination({ dest: '/dev/null', sync: true, minLength: 4096 });
const base = { level: 'info', base: { name: 'gatehouse' } };
/** What logRequest passes for an authenticated 200 (src/http/request-context.ts). */
const fields = {
  id: '7ec8c39f-7b5d-4f59-95ce-34367534607b',
  method: 'GET',
  path: '/api/items',
  status: 200,
  ms: 1.27,
  auth: 'api-key',
  subject: 'bench',
  ip: '127.0.0.1',
};

function measure(name: string, line: () => void): void {
  const N = 200_000;
  for (let i = 0; i < 20_000; i++) line();
  const started = process.cpuUsage();
  for (let i = 0; i < N; i++) line();
  const cpu = process.cpuUsage(started);
  console.log(
    JSON.stringify({ case: name, cpuMicrosPerLine: Math.round(((cpu.user + cpu.system) / N) * 1000) / 1000 }),
  );
}

const defaults: Logger = pino(base, destination());
const json: Logger = createLogger({ level: 'info', destination: destination() });

for (let round = 0; round < 3; round++) {
  const writeDefault = requestLogger(defaults);
  const writeJson = requestLogger(json);
  measure('request line, pino defaults (level 30, epoch ms)', () => writeDefault(fields));
  measure('request line, log.format json (level name, ISO time)', () => writeJson(fields));
  measure('logger.info, pino defaults', () => defaults.info({ worker: 1 }, 'configuration reloaded'));
  measure('logger.info, log.format json', () => json.info({ worker: 1 }, 'configuration reloaded'));
}
defaults.flush();
json.flush();
