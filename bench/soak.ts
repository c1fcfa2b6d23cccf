/**
 * `npm run soak` (issue #32): three gatehouse instances on one PostgreSQL under ~60 % of their
 * measured capacity on both listeners, with a fault every 20–40 s, then checks that nothing was
 * lost, nothing unexplained was delivered twice, nothing leaked, and no credential slipped through.
 * docs/soak.md has each check's rule.
 *
 *   SOAK_MINUTES=2 SOAK_SEED=7 npm run soak
 *
 * Exit code 1 when a check fails; the table on stdout, the whole report in bench/results/soak.json.
 */
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { runChecks } from './soak/checks.js';
import { readDatabaseFacts } from './soak/database.js';
import { planFaults, runFault, type FaultWindow } from './soak/faults.js';
import { measureCapacity, runLoad, type LoadRecords } from './soak/load.js';
import { checkTable, faultTable, writeReport } from './soak/report.js';
import { sampleResources, type ResourceSample } from './soak/resources.js';
import { startWorld } from './soak/world.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const MINUTES = Number(process.env.SOAK_MINUTES ?? 10);
// A seed is always printed, so any run (CI's included) can be replayed.
const SEED = Number(process.env.SOAK_SEED ?? Math.floor(Math.random() * 1_000_000));
/**
 * Share of the measured capacity the load runs at: 60 %, split between the two listeners (each
 * was measured alone, with the whole machine to itself: together, 30 % of each is 60 % in all).
 */
const LOAD_SHARE = 0.3;
/**
 * The harness is one Node process on the same two cores as everything else: above these rates it,
 * not gatehouse, is what saturates, and its own delays would be read as gatehouse's.
 */
const MAX_RATES = { hooks: 60, api: 100 };
const DRAIN_LIMIT_MS = 60_000;
const OUTPUT = process.env.SOAK_OUTPUT ?? path.join(ROOT, 'bench/results/soak.json');

const log = (line: string) => process.stderr.write(`[soak ${new Date().toISOString().slice(11, 19)}] ${line}\n`);

async function main(): Promise<boolean> {
  const startedAt = new Date().toISOString();
  const loadAtStart = os.loadavg()[0]!;
  log(`seed ${SEED}, ${MINUTES} min, load average ${loadAtStart.toFixed(2)}`);
  const world = await startWorld();
  // Ctrl-C: the instances and the cluster are this run's, so they go with it.
  process.once('SIGINT', () => void world.close().finally(() => process.exit(130)));
  try {
    const capacity = await measureCapacity(world, 5);
    const rates = {
      hooks: Math.max(5, Math.min(MAX_RATES.hooks, Math.round(capacity.hooks * LOAD_SHARE))),
      api: Math.max(5, Math.min(MAX_RATES.api, Math.round(capacity.api * LOAD_SHARE))),
    };
    log(
      `capacity ${capacity.hooks.toFixed(0)} webhooks/s, ${capacity.api.toFixed(0)} /api/ per s; load ${rates.hooks} + ${rates.api} per s`,
    );

    const records: LoadRecords = { api: [], hooks: [], bursts: [], shed: 0 };
    const samples: ResourceSample[] = [];
    const stopLoad = new AbortController();
    const stopSampling = new AbortController();
    const loadStart = Date.now();
    const loading = runLoad(world, rates, stopLoad.signal, records);
    const sampling = sampleResources(world, 3_000, stopSampling.signal, samples);

    const plan = planFaults(SEED, MINUTES * 60, world.instances.length);
    const faults: FaultWindow[] = [];
    for (const fault of plan) {
      const wait = loadStart + fault.at * 1_000 - Date.now();
      if (wait > 0) await sleep(wait);
      log(
        `fault: ${fault.kind}${fault.instance !== undefined ? ` i${fault.instance}` : ''}${fault.seconds ? ` ${fault.seconds} s` : ''}`,
      );
      faults.push(await runFault(world, fault));
    }
    const untilEnd = loadStart + MINUTES * 60_000 - Date.now();
    if (untilEnd > 0) await sleep(untilEnd);
    stopLoad.abort();
    // The drain is timed from here: the answers still in flight are part of it.
    const loadEnd = Date.now();
    await loading;
    log(`load stopped: ${records.hooks.length} webhooks, ${records.api.length} /api/ requests, ${records.shed} shed`);

    const database = await readDatabaseFacts(world.databaseUrl, loadEnd, DRAIN_LIMIT_MS);
    stopSampling.abort();
    await sampling;
    // The last posts of the drain may still be answering: give the target a moment to flush.
    await sleep(1_000);

    const checks = runChecks({
      records,
      receipts: world.target.receipts,
      upstream: world.upstream.received,
      faults,
      samples,
      database,
      loadStart,
      loadEnd,
      warmUpMs: Math.min(60_000, (MINUTES * 60_000) / 5),
    });
    // An unexplained duplicate comes with what the instances logged about its event: the first clue for a fix.
    for (const check of checks)
      for (const item of check.evidence ?? []) {
        const id = (item as { id?: unknown }).id;
        if (check.pass || typeof id !== 'string' || !id.startsWith('evt_')) continue;
        (item as { log?: unknown[] }).log = world.instances.flatMap((instance) =>
          instance.lives.flatMap((life) =>
            life.lines.filter((l) => JSON.stringify(l).includes(id)).map((l) => ({ instance: instance.name, ...l })),
          ),
        );
      }
    const pass = checks.every((c) => c.pass);
    const loadAtEnd = os.loadavg()[0]!;
    process.stdout.write(
      `\nsoak: seed ${SEED}, ${MINUTES} min, load average ${loadAtStart.toFixed(2)} → ${loadAtEnd.toFixed(2)}\n`,
    );
    process.stdout.write(
      `rates: ${rates.hooks} webhooks/s + ${rates.api} /api/ per s (30 % of each of ${capacity.hooks.toFixed(0)} and ${capacity.api.toFixed(0)}, capped)\n\n`,
    );
    process.stdout.write(`${faultTable(faults, loadStart)}\n\n${checkTable(checks)}\n\n`);
    for (const c of checks)
      if (!c.pass && c.evidence?.length) process.stdout.write(`${c.name}:\n${JSON.stringify(c.evidence, null, 1)}\n`);
    writeReport(OUTPUT, {
      seed: SEED,
      minutes: MINUTES,
      startedAt,
      load: { start: loadAtStart, end: loadAtEnd },
      capacity,
      rates,
      sent: { hooks: records.hooks.length, api: records.api.length, shed: records.shed },
      faults,
      checks,
      pass,
    });
    process.stdout.write(`${pass ? 'PASS' : 'FAIL'} (report: ${path.relative(ROOT, OUTPUT)})\n`);
    return pass;
  } finally {
    await world.close();
  }
}

main().then(
  (pass) => process.exit(pass ? 0 : 1),
  (err: Error) => {
    process.stderr.write(`soak: ${err.stack ?? err.message}\n`);
    process.exit(1);
  },
);
