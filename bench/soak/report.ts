import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Check } from './checks.js';
import type { FaultWindow } from './faults.js';

/** What a run says about itself, printed and written as JSON (bench/results/ is not committed). */
export interface SoakReport {
  seed: number;
  minutes: number;
  startedAt: string;
  /** The 1-minute load average at start and at the end: the machine is shared. */
  load: { start: number; end: number };
  capacity: { hooks: number; api: number };
  rates: { hooks: number; api: number };
  sent: { hooks: number; api: number; shed: number };
  faults: FaultWindow[];
  checks: Check[];
  pass: boolean;
}

/** The fault schedule as it ran, one line a fault: offset from the load's start, kind, target, length. */
export function faultTable(faults: FaultWindow[], loadStart: number): string {
  const rows = faults.map((w) => {
    const offset = ((w.start - loadStart) / 1000).toFixed(0).padStart(4);
    const where = w.instance !== undefined ? ` i${w.instance}` : '';
    const asked = w.seconds !== undefined ? ` ${w.seconds} s` : '';
    const took = ((w.end - w.start) / 1000).toFixed(1);
    return `| ${offset} s | ${w.kind}${where}${asked} | ${took} s |${w.note ? ` ${w.note}` : ''}${w.retiredKeyId ? ` retired ${w.retiredKeyId}` : ''}`;
  });
  return ['| at | fault | until recovered |', '|---|---|---|', ...rows].join('\n');
}

export function checkTable(checks: Check[]): string {
  const rows = checks.map((c) => `| ${c.pass ? 'PASS' : 'FAIL'} | ${c.name} | ${c.detail} |`);
  return ['| | check | what the run saw |', '|---|---|---|', ...rows].join('\n');
}

export function writeReport(file: string, report: SoakReport): void {
  mkdirSync(path.dirname(file), { recursive: true });
  writeFileSync(file, JSON.stringify(report, null, 2));
}
