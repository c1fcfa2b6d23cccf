/**
 * What exact rate limits across gateway workers would cost if the primary held the buckets: one
 * IPC round trip (worker → primary → worker, node:cluster with the 'advanced' serialization
 * workers.ts uses) per request. Two workers each keep `INFLIGHT` takes in flight, as 64
 * connections would; the primary answers each from a Map, as a bucket take would.
 *
 *   node --import tsx bench/ipc-round-trip.ts      (BENCH_DURATION seconds, default 5)
 *
 * Prints round trips per second, their mean latency, and the CPU each side spent per round trip.
 */
import cluster from 'node:cluster';

const DURATION_MS = Number(process.env.BENCH_DURATION ?? 5) * 1000;
const INFLIGHT = 32;
const WORKERS = 2;

type Take = { type: 'take'; id: number; key: string; now: number };
type Taken = { type: 'taken'; id: number; allowed: boolean; left: number };

if (cluster.isPrimary) {
  cluster.setupPrimary({ serialization: 'advanced' });
  const buckets = new Map<string, number>();
  const results: { trips: number; micros: number; cpuMicros: number }[] = [];
  const cpuStart = process.cpuUsage();
  let startedAt = 0;
  let ready = 0;
  for (let i = 0; i < WORKERS; i++) {
    const worker = cluster.fork();
    worker.on(
      'message',
      (message: Take | { type: 'ready' } | { type: 'done'; trips: number; micros: number; cpuMicros: number }) => {
        if (message.type === 'ready') {
          if (++ready === WORKERS) {
            startedAt = performance.now();
            for (const w of Object.values(cluster.workers!)) w!.send({ type: 'go' });
          }
        } else if (message.type === 'take') {
          const left = (buckets.get(message.key) ?? 1e9) - 1;
          buckets.set(message.key, left);
          worker.send({ type: 'taken', id: message.id, allowed: left >= 0, left } satisfies Taken);
        } else {
          results.push(message);
          if (results.length === WORKERS) {
            const seconds = (performance.now() - startedAt) / 1000;
            const cpu = process.cpuUsage(cpuStart);
            const trips = results.reduce((n, r) => n + r.trips, 0);
            console.log(
              JSON.stringify({
                workers: WORKERS,
                inflightPerWorker: INFLIGHT,
                roundTripsPerSec: Math.round(trips / seconds),
                meanLatencyMicros: Math.round(results.reduce((n, r) => n + r.micros, 0) / trips),
                primaryCpuMicrosPerTrip: Math.round(((cpu.user + cpu.system) / trips) * 10) / 10,
                workerCpuMicrosPerTrip: Math.round((results.reduce((n, r) => n + r.cpuMicros, 0) / trips) * 10) / 10,
              }),
            );
            for (const w of Object.values(cluster.workers!)) w!.kill();
          }
        }
      },
    );
  }
} else {
  const pending = new Map<number, number>();
  let nextId = 0;
  let trips = 0;
  let micros = 0;
  let running = true;
  let cpuStart = process.cpuUsage();
  const send = () => {
    const id = nextId++;
    pending.set(id, performance.now());
    process.send!({ type: 'take', id, key: `key-${id % 100}`, now: Date.now() } satisfies Take);
  };
  process.on('message', (message: Taken | { type: 'go' }) => {
    if (message.type === 'go') {
      cpuStart = process.cpuUsage();
      setTimeout(() => {
        running = false;
      }, DURATION_MS);
      for (let i = 0; i < INFLIGHT; i++) send();
      return;
    }
    micros += (performance.now() - pending.get(message.id)!) * 1000;
    pending.delete(message.id);
    trips++;
    if (running) send();
    else if (pending.size === 0) {
      const cpu = process.cpuUsage(cpuStart);
      process.send!({ type: 'done', trips, micros, cpuMicros: cpu.user + cpu.system });
    }
  });
  process.send!({ type: 'ready' });
}
