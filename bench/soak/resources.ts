import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import pg from 'pg';
import type { World } from './world.js';

const run = promisify(execFile);

/** One look at one process: resident memory, open descriptors, its PostgreSQL connections. */
export interface ResourceSample {
  at: number;
  instance: string;
  pid: number;
  rssKb: number;
  fds: number;
  /** Of those, sockets (TCP and Unix): what a connection leak would grow. */
  sockets: number;
  /**
   * Of those, keep-alive connections to the target and the upstream: pools bounded by configuration
   * (delivery concurrency, the proxy's agent) that grow to a high-water mark after a backlog.
   */
  pooled: number;
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
  const pooledPorts = [world.target.url, world.upstream.url].map((u) => new URL(u).port);
  while (!stop.aborted) {
    const byInstance = await connections();
    const pooled = await pooledSockets(pooledPorts);
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
        pooled: pooled.get(pid) ?? 0,
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

/** Established TCP connections to `ports`, per owning pid (from `ss`: /proc/net/tcp has no pid). */
async function pooledSockets(ports: string[]): Promise<Map<number, number>> {
  const out = new Map<number, number>();
  const { stdout } = await run('ss', ['-tnpH', 'state', 'established']).catch(() => ({ stdout: '' }));
  for (const line of stdout.split('\n')) {
    const [, , , peer, users] = line.trim().split(/\s+/);
    if (!peer || !ports.includes(peer.slice(peer.lastIndexOf(':') + 1))) continue;
    const pid = Number(/pid=(\d+)/.exec(users ?? '')?.[1]);
    if (pid) out.set(pid, (out.get(pid) ?? 0) + 1);
  }
  return out;
}
