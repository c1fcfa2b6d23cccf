import type http from 'node:http';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { request, type Reply } from './http.js';
import { startServerProcess, type ServerProcess } from './process.js';

/** One `gatehouse start` process of a multi-instance test, and its two listeners. */
export interface Instance {
  name: string;
  process: ServerProcess;
  gatewayUrl: string;
  hooksUrl: string;
}

/**
 * Starts `count` real `gatehouse start` processes on one PostgreSQL database, together (as a
 * deploy does: they race for the migration lock). `configOf(i)` is instance i's raw config; its
 * storage is set to `databaseUrl`.
 */
export async function startInstances(
  count: number,
  databaseUrl: string,
  configOf: (i: number) => Record<string, any>,
): Promise<Instance[]> {
  const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-instances-'));
  const started = Array.from({ length: count }, (_, i) => {
    const file = path.join(dir, `instance-${i}.json5`);
    writeFileSync(file, JSON.stringify({ ...configOf(i), storage: { driver: 'postgres', url: databaseUrl } }, null, 2));
    return startServerProcess(file);
  });
  try {
    return await Promise.all(
      started.map(async (proc, i) => {
        // A loaded 2-core machine has taken over 20 s to start tsx processes three at a time.
        const [gateway, hooks] = await Promise.all([
          proc.waitFor((l) => l.msg === 'gateway listening', 45_000),
          proc.waitFor((l) => l.msg === 'webhook receiver listening', 45_000),
        ]);
        return { name: `i${i}`, process: proc, gatewayUrl: gateway.url as string, hooksUrl: hooks.url as string };
      }),
    );
  } catch (err) {
    await stopInstances(started);
    throw err;
  }
}

/** SIGKILLs whatever is still running (test cleanup). */
export async function stopInstances(processes: (ServerProcess | Instance)[]): Promise<void> {
  await Promise.all(processes.map((p) => ('process' in p ? p.process : p).stop('SIGKILL')));
}

/** POSTs one JSON webhook with the `x-webhook-secret` verifier's headers and an optional delivery id. */
export function postWebhook(
  hooksUrl: string,
  endpoint: string,
  secret: string,
  body: unknown,
  deliveryId?: string,
  agent?: http.Agent,
): Promise<Reply> {
  const headers: Record<string, string> = { 'content-type': 'application/json', 'x-webhook-secret': secret };
  if (deliveryId !== undefined) headers['idempotency-key'] = deliveryId;
  return request(hooksUrl, endpoint, { method: 'POST', headers, body: JSON.stringify(body), agent });
}
