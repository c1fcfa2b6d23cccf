import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import { generateApiKey, hashApiKey } from '../src/gateway/credentials/api-key.js';

/*
 * Where the /api/ edge's tail latency comes from (issue 29): gatehouse api-key beside node-bare,
 * each with bench/loop-probe.ts loaded (event-loop delay, GC pauses, CPU), on a quiet machine and
 * with a background process taking half a core (`busy`), in alternating rounds. Variants:
 * - `gatehouse`: as `npm run bench` runs it, its log piped into the load generator's process;
 * - `gatehouse log→file`: the same, its log written to a file (nobody else reads it meanwhile);
 * - `gatehouse log off`: `log.level: warn` (no request lines).
 * Run: `node --import tsx bench/tail.ts` after `npm run build`. TAIL_DURATION, TAIL_ROUNDS,
 * TAIL_CONDITIONS (quiet,busy), TAIL_CONNECTIONS tune it; it prints one table and writes
 * bench/results/tail.json. Findings: docs/benchmarks.md, "Where the tail comes from".
 */
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const DURATION = Number(process.env.TAIL_DURATION ?? 5);
const ROUNDS = Number(process.env.TAIL_ROUNDS ?? 3);
const CONNECTIONS = Number(process.env.TAIL_CONNECTIONS ?? 64);
const CONDITIONS = (process.env.TAIL_CONDITIONS ?? 'quiet,busy').split(',');
const VARIANTS = process.env.TAIL_VARIANTS?.split(',');
const work = mkdtempSync(path.join(os.tmpdir(), 'gatehouse-tail-'));
const probeFile = path.join(work, 'probe.jsonl');
const children: ChildProcess[] = [];
process.on('exit', () => children.forEach((c) => c.kill('SIGKILL')));

interface Server {
  name: string;
  child: ChildProcess;
  port: number;
}

/** Starts a server; resolves when `port` takes connections (or, for the references, when they print `ready <port>`). */
async function start(name: string, args: string[], port?: number, logTo?: string): Promise<Server> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', '--import', path.join(ROOT, 'bench/loop-probe.ts'), ...args],
    {
      cwd: ROOT,
      env: { ...process.env, LOOP_PROBE_FILE: probeFile },
      stdio: ['ignore', logTo ? openSync(logTo, 'a') : 'pipe', 'inherit'],
    },
  );
  children.push(child);
  const exited = new Promise<never>((_, reject) =>
    child.once('exit', (code) => reject(new Error(`${name} exited ${code}`))),
  );
  let printed: Promise<number> | undefined;
  if (!logTo) {
    // Keep reading the log (as bench/run.ts does, into the load generator's process).
    let buffer = '';
    printed = new Promise((resolve) =>
      child.stdout!.on('data', (d: Buffer) => {
        if (buffer.length > 10_000) return;
        buffer += d.toString();
        const m = /^ready (\d+)$/m.exec(buffer);
        if (m) resolve(Number(m[1]));
      }),
    );
  }
  const found = port !== undefined ? waitForPort(port).then(() => port) : printed!;
  return { name, child, port: await Promise.race([found, exited]) };
}

async function waitForPort(port: number): Promise<void> {
  for (;;) {
    const open = await new Promise<boolean>((resolve) =>
      net
        .connect(port, '127.0.0.1')
        .once('connect', function (this: net.Socket) {
          this.destroy();
          resolve(true);
        })
        .once('error', () => resolve(false)),
    );
    if (open) return;
    await new Promise((r) => setTimeout(r, 50));
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const server = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** Reads the probe line a SIGUSR2 makes `pid` append. */
async function probe(pid: number): Promise<Record<string, unknown>> {
  const before = readFileSync(probeFile, { encoding: 'utf8', flag: 'a+' }).length;
  process.kill(pid, 'SIGUSR2');
  for (let i = 0; i < 100; i++) {
    await new Promise((r) => setTimeout(r, 20));
    const text = readFileSync(probeFile, 'utf8').slice(before);
    const line = text.split('\n').find((l) => l.includes(`"pid":${pid},`));
    if (line) return JSON.parse(line);
  }
  throw new Error(`no probe line from ${pid}`);
}

/** Half a core busy: 20 ms of work, 20 ms of sleep, again and again. */
function busy(): ChildProcess {
  const child = spawn(process.execPath, [
    '-e',
    'setInterval(() => { const end = Date.now() + 20; while (Date.now() < end); }, 40);',
  ]);
  children.push(child);
  return child;
}

async function main() {
  const key = generateApiKey();
  const upstream = await start('upstream', [path.join(ROOT, 'bench/upstream.ts')]);
  const upstreamUrl = `http://127.0.0.1:${upstream.port}`;
  const gatehouse = async (name: string, level: string, logTo?: string) => {
    const port = await freePort();
    const file = path.join(work, `${name.replace(/\W+/g, '-')}.json5`);
    writeFileSync(
      file,
      JSON.stringify({
        storage: { path: path.join(work, `${name.replace(/\W+/g, '-')}.db`) },
        log: { level },
        gateway: {
          listen: { host: '127.0.0.1', port },
          upstream: { target: upstreamUrl },
          auth: { apiKeys: [{ id: 'bench', hash: hashApiKey(key) }], allowedIPs: ['127.0.0.1', '::1', '10.0.0.0/8'] },
        },
      }),
    );
    return start(name, [path.join(ROOT, 'bin/gatehouse.js'), 'start', '--config', file], port, logTo);
  };
  const all = [
    await start('node-bare', [path.join(ROOT, 'bench/node-bare.ts'), String(upstream.port), key]),
    await gatehouse('gatehouse', 'info'),
    await gatehouse('gatehouse log→file', 'info', path.join(work, 'gatehouse.log')),
    await gatehouse('gatehouse log off', 'warn'),
  ];
  const servers = all.filter((s) => s.name === 'node-bare' || !VARIANTS || VARIANTS.includes(s.name));
  const rows: Record<string, unknown>[] = [];
  for (const condition of CONDITIONS) {
    const hog = condition === 'busy' ? busy() : undefined;
    for (let round = 0; round < ROUNDS; round++) {
      // Rotate the order each round: no server always runs right after another.
      const order = servers.map((_, i) => servers[(i + round) % servers.length]!);
      for (const server of order) {
        const url = `http://127.0.0.1:${server.port}/api/items`;
        const headers = { 'x-api-key': key };
        await autocannon({ url, headers, connections: CONNECTIONS, duration: round === 0 ? 2 : 1 });
        await probe(server.child.pid!);
        const load = os.loadavg()[0]!;
        const r = await autocannon({ url, headers, connections: CONNECTIONS, duration: DURATION });
        const p = await probe(server.child.pid!);
        const l = r.latency as unknown as Record<string, number>;
        rows.push({
          condition,
          round,
          server: server.name,
          load: Math.round(load * 10) / 10,
          rps: Math.round(r.requests.average),
          p50: l.p50,
          p99: l.p99,
          p999: l.p99_9,
          max: l.max,
          errors: r.errors + r.timeouts + r.non2xx,
          cpuUsPerReq: Math.round(((p.cpuMs as number) * 1000) / r.requests.total),
          ...flatten(p),
        });
        console.error(JSON.stringify(rows.at(-1)));
      }
    }
    hog?.kill('SIGKILL');
  }
  writeFileSync(
    path.join(ROOT, 'bench/results/tail.json'),
    JSON.stringify({ load: os.loadavg(), cpus: os.cpus().length, rows }, null, 2),
  );
  printSummary(rows);
  process.exit(0);
}

function flatten(p: Record<string, unknown>): Record<string, unknown> {
  const d = p.loopDelayMs as Record<string, number>;
  const gc = p.gc as Record<string, number>;
  return {
    elu: p.eventLoopUtilization,
    loopP99: d.p99,
    loopMax: d.max,
    gcCount: gc.count,
    gcTotalMs: gc.totalMs,
    gcMaxMs: gc.maxMs,
    gcMajor: gc.major,
    gcOver5ms: gc.over5ms,
  };
}

/** Medians over the rounds, per condition and server. */
function printSummary(rows: Record<string, unknown>[]) {
  const keys = [
    'rps',
    'p50',
    'p99',
    'p999',
    'max',
    'cpuUsPerReq',
    'elu',
    'loopP99',
    'loopMax',
    'gcTotalMs',
    'gcMaxMs',
    'gcMajor',
    'load',
  ];
  const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;
  const table: Record<string, unknown>[] = [];
  for (const condition of new Set(rows.map((r) => r.condition)))
    for (const server of new Set(rows.map((r) => r.server))) {
      const mine = rows.filter((r) => r.condition === condition && r.server === server);
      table.push({
        condition,
        server,
        ...Object.fromEntries(keys.map((k) => [k, median(mine.map((r) => r[k] as number))])),
      });
    }
  console.table(table);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
