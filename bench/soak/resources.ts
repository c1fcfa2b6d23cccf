import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import pg from 'pg';
import type { World } from './world.js';

/** One look at one process: resident memory, open descriptors, its PostgreSQL connections. */
export interface ResourceSample {
  at: number;
  instance: string;
  pid: number;
  rssKb: number;
  fds: number;
  /** Of those, sockets (TCP and Unix): what a connection leak would grow. */
  sockets: number;
  /** Rows of pg_stat_activity with this instance's application_name; undefined when the database did not answer. */
  pgConnections?: number;
}

/** Samples every instance's live process every `everyMs` until `stop` is aborted. */
export async function sampleResources(world: World, everyMs: number, stop: AbortSignal, out: ResourceSample[]) {
  // One client, made again after PostgreSQL restarted or froze (a failed query drops it).
  let connected: pg.Client | undefined;
  const connections = async (): Promise<Map<string, number> | undefined> => {
    try {
      if (!connected) {
        connected = new pg.Client({
          connectionString: world.databaseUrl,
          query_timeout: 2_000,
          connectionTimeoutMillis: 2_000,
        });
        connected.on('error', () => (connected = undefined));
        await connected.connect();
      }
      const { rows } = await connected.query<{ name: string; n: string }>(
        `SELECT application_name AS name, count(*) AS n FROM pg_stat_activity WHERE application_name LIKE 'soak-%' GROUP BY 1`,
      );
      return new Map(rows.map((r) => [r.name.slice('soak-'.length), Number(r.n)]));
    } catch {
      void connected?.end().catch(() => {});
      connected = undefined;
      return undefined;
    }
  };
  while (!stop.aborted) {
    const byInstance = await connections();
    const at = Date.now();
    for (const instance of world.instances) {
      const pid = instance.process?.child.pid;
      if (pid === undefined || instance.process!.child.exitCode !== null || instance.process!.child.signalCode !== null)
        continue;
      const process = readProcess(pid);
      if (!process) continue;
      out.push({
        at,
        instance: instance.name,
        pid,
        ...process,
        pgConnections: byInstance?.get(instance.name) ?? (byInstance ? 0 : undefined),
      });
    }
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
  await connected?.end().catch(() => {});
}

function readProcess(pid: number): { rssKb: number; fds: number; sockets: number } | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const rssKb = Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1]);
    const fds = readdirSync(`/proc/${pid}/fd`);
    let sockets = 0;
    for (const fd of fds) {
      try {
        if (readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith('socket:')) sockets++;
      } catch {
        // closed since the listing
      }
    }
    return { rssKb, fds: fds.length, sockets };
  } catch {
    return undefined; // exited between the check and the read
  }
}
