import { Writable } from 'node:stream';
import { parseConfig } from '../../src/config/load.js';
import { createLogger } from '../../src/observability/log.js';
import { startGatehouse, type RunningGatehouse } from '../../src/runtime/server.js';

export interface TestGatehouse extends RunningGatehouse {
  url: string;
  /** Every JSON log line written so far. */
  logs: Record<string, any>[];
  /** The raw log text (to assert secrets never appear). */
  logText(): string;
}

/** Loopback gateway on port 0 with sensible test defaults; `overrides` is deep-merged into the raw config. */
export function testConfig(upstreamUrl: string, overrides: Record<string, any> = {}): Record<string, any> {
  const base = {
    storage: { path: './data/test.db' },
    gateway: {
      listen: { host: '127.0.0.1', port: 0 },
      upstream: { target: upstreamUrl, timeoutMs: 5000 },
      auth: { apiKey: TEST_PLAIN_KEY },
    },
  };
  return merge(base, overrides);
}

export const TEST_PLAIN_KEY = 'test-plain-key-0123456789abcdefghijklmnop';

/** Starts gatehouse in-process on real sockets, logging into memory. */
export async function startTestGatehouse(rawConfig: Record<string, any>): Promise<TestGatehouse> {
  const lines: string[] = [];
  const destination = new Writable({
    write(chunk, _enc, done) {
      lines.push(...String(chunk).split('\n').filter(Boolean));
      done();
    },
  });
  const logger = createLogger({ level: 'debug', destination });
  const running = await startGatehouse(parseConfig(rawConfig), { logger });
  return {
    ...running,
    url: running.gateway.url,
    get logs() {
      return lines.map((l) => JSON.parse(l));
    },
    logText: () => lines.join('\n'),
  };
}

function merge(a: any, b: any): any {
  if (b === undefined) return a;
  if (
    a === null ||
    typeof a !== 'object' ||
    Array.isArray(a) ||
    b === null ||
    typeof b !== 'object' ||
    Array.isArray(b)
  )
    return b;
  const out: any = { ...a };
  // An explicit `undefined` removes the key (e.g. `{ apiKey: undefined }` for a bearer-only gateway).
  for (const [k, v] of Object.entries(b)) {
    if (v === undefined) delete out[k];
    else out[k] = merge(a[k], v);
  }
  return out;
}
