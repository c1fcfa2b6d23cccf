import { appendFileSync } from 'node:fs';
import { constants, monitorEventLoopDelay, performance, PerformanceObserver } from 'node:perf_hooks';

/*
 * Loaded with `--import` into a server under load (bench/tail.ts): what its event loop and garbage
 * collector did between two SIGUSR2s. Each SIGUSR2 appends one JSON line to $LOOP_PROBE_FILE with
 * the figures since the previous one, then starts counting afresh.
 */
const file = process.env.LOOP_PROBE_FILE;
if (file) {
  const delay = monitorEventLoopDelay({ resolution: 1 });
  delay.enable();
  let gc = fresh();
  let elu = performance.eventLoopUtilization();
  let cpu = process.cpuUsage();
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      const kind = (entry as { detail?: { kind?: number } }).detail?.kind;
      const major = kind === constants.NODE_PERFORMANCE_GC_MAJOR;
      gc.count++;
      gc.totalMs += entry.duration;
      gc.maxMs = Math.max(gc.maxMs, entry.duration);
      if (major) {
        gc.major++;
        gc.majorMs += entry.duration;
      }
      if (entry.duration >= 5) gc.over5ms++;
    }
  }).observe({ entryTypes: ['gc'] });
  process.on('SIGUSR2', () => {
    const ms = (ns: number) => Math.round(ns / 1e4) / 100;
    const used = process.cpuUsage(cpu);
    appendFileSync(
      file,
      JSON.stringify({
        pid: process.pid,
        loopDelayMs: {
          p50: ms(delay.percentile(50)),
          p99: ms(delay.percentile(99)),
          p999: ms(delay.percentile(99.9)),
          max: ms(delay.max),
        },
        eventLoopUtilization: Math.round(performance.eventLoopUtilization(elu).utilization * 1000) / 1000,
        cpuMs: Math.round((used.user + used.system) / 1000),
        gc: {
          ...gc,
          totalMs: Math.round(gc.totalMs),
          maxMs: Math.round(gc.maxMs * 10) / 10,
          majorMs: Math.round(gc.majorMs),
        },
      }) + '\n',
    );
    delay.reset();
    gc = fresh();
    elu = performance.eventLoopUtilization();
    cpu = process.cpuUsage();
  });
}

function fresh() {
  return { count: 0, totalMs: 0, maxMs: 0, major: 0, majorMs: 0, over5ms: 0 };
}
