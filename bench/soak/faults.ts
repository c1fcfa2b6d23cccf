import { setTimeout as sleep } from 'node:timers/promises';
import { generateApiKey } from '../../src/gateway/credentials/api-key.js';
import { rawExchange } from '../../test/helpers/raw-socket.js';
import { waitUntilReady, type Instance, type TargetMode, type World } from './world.js';

/**
 * The fault schedule: every 20–40 s one fault drawn from a seeded generator, so SOAK_SEED replays
 * the same kinds, instances and durations (their wall-clock effects still depend on the machine).
 */

export type FaultKind =
  | 'kill-9'
  | 'sigterm'
  | 'sighup-rotate'
  | 'pg-restart'
  | 'pg-freeze'
  | 'target-503'
  | 'target-hang'
  | 'target-slow'
  | 'garbage';

const KINDS: FaultKind[] = [
  'kill-9',
  'sigterm',
  'sighup-rotate',
  'pg-restart',
  'pg-freeze',
  'target-503',
  'target-hang',
  'target-slow',
  'garbage',
];

export interface PlannedFault {
  kind: FaultKind;
  /** Seconds after the load started. */
  at: number;
  /** The instance it hits (kill-9, sigterm, garbage), by index. */
  instance?: number;
  /** How long it lasts (down time before a restart, freeze, target mode), in seconds. */
  seconds?: number;
}

/** A fault as it happened: wall-clock start and end (recovered: ready again, thawed, target back). */
export interface FaultWindow extends PlannedFault {
  start: number;
  end: number;
  /** For a rotation: each instance's `configuration reloaded` time, and the key id rotated out. */
  reloadedAt?: Record<string, number>;
  retiredKeyId?: string;
  note?: string;
}

/** mulberry32: a small seeded generator (the schedule must replay from SOAK_SEED, Math.random cannot). */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The faults of a run of `seconds`, the first after 20–40 s, none in the last 20 s (the load is ending). */
export function planFaults(seed: number, seconds: number, instances: number): PlannedFault[] {
  const random = seededRandom(seed);
  const between = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo + 1));
  const plan: PlannedFault[] = [];
  for (let at = between(20, 40); at < seconds - 20; at += between(20, 40)) {
    const kind = KINDS[Math.floor(random() * KINDS.length)]!;
    const fault: PlannedFault = { kind, at };
    if (kind === 'kill-9' || kind === 'sigterm' || kind === 'garbage') fault.instance = between(0, instances - 1);
    if (kind === 'kill-9' || kind === 'sigterm') fault.seconds = between(2, 10);
    if (kind === 'pg-freeze') fault.seconds = between(5, 40);
    if (kind === 'target-503' || kind === 'target-hang') fault.seconds = between(10, 30);
    if (kind === 'target-slow') fault.seconds = between(10, 30);
    plan.push(fault);
  }
  return plan;
}

/** Runs one fault to its recovery and returns its window. */
export async function runFault(world: World, fault: PlannedFault): Promise<FaultWindow> {
  const start = Date.now();
  const window: FaultWindow = { ...fault, start, end: start };
  const instance = fault.instance !== undefined ? world.instances[fault.instance] : undefined;
  switch (fault.kind) {
    case 'kill-9':
    case 'sigterm':
      await restart(world, instance!, fault.kind === 'kill-9' ? 'SIGKILL' : 'SIGTERM', fault.seconds! * 1_000);
      break;
    case 'sighup-rotate':
      Object.assign(window, await rotateKey(world));
      break;
    case 'pg-restart':
      await world.pg.stop();
      await world.pg.start();
      break;
    case 'pg-freeze':
      await world.pg.freeze();
      await sleep(fault.seconds! * 1_000);
      await world.pg.thaw();
      break;
    case 'target-503':
    case 'target-hang':
    case 'target-slow':
      world.target.mode = fault.kind.slice('target-'.length) as TargetMode;
      await sleep(fault.seconds! * 1_000);
      world.target.mode = 'ok';
      break;
    case 'garbage':
      window.note = await sendGarbage(instance!);
      break;
  }
  window.end = Date.now();
  return window;
}

async function restart(world: World, instance: Instance, signal: NodeJS.Signals, downMs: number): Promise<void> {
  const proc = instance.process!;
  if (signal === 'SIGKILL') proc.child.kill('SIGKILL');
  else proc.child.kill('SIGTERM'); // one SIGTERM: the whole drain (acceptGrace, then in-flight work), as a deploy does
  await new Promise<void>((resolve) =>
    proc.child.exitCode !== null || proc.child.signalCode !== null
      ? resolve()
      : proc.child.once('exit', () => resolve()),
  );
  await sleep(downMs);
  await world.startInstance(instance);
}

/**
 * A key rotation as an operator makes it, in two reloads of every instance: the new key is added
 * (SIGHUP, each waits for `configuration reloaded`), clients move to it, then the old key is removed
 * (SIGHUP again). `reloadedAt` is when each instance had reloaded without the old key.
 */
async function rotateKey(world: World): Promise<Pick<FaultWindow, 'reloadedAt' | 'retiredKeyId'>> {
  const retired = world.keys.rotating[world.keys.generation]!;
  world.keys.rotating.push({ id: `rotating-${world.keys.generation + 1}`, key: generateApiKey(), inConfig: true });
  world.writeConfigs();
  await reloadEverywhere(world);
  world.keys.generation++;
  await sleep(2_000); // requests already sent with the old key are answered before it goes
  retired.inConfig = false;
  world.writeConfigs();
  return { reloadedAt: await reloadEverywhere(world), retiredKeyId: retired.id };
}

/** SIGHUP to every instance; when each logged its reload. */
async function reloadEverywhere(world: World): Promise<Record<string, number>> {
  const reloadedAt: Record<string, number> = {};
  await Promise.all(
    world.instances.map(async (instance) => {
      const proc = instance.process!;
      const seen = proc.lines.length;
      proc.child.kill('SIGHUP');
      // Only a line logged after this SIGHUP counts (earlier reloads are in the log too).
      await waitForLineAfter(instance, seen, (l) => l.msg === 'configuration reloaded');
      reloadedAt[instance.name] = Date.now();
    }),
  );
  return reloadedAt;
}

async function waitForLineAfter(
  instance: Instance,
  seen: number,
  match: (line: Record<string, any>) => boolean,
): Promise<void> {
  const proc = instance.process!;
  await proc.waitFor((l) => proc.lines.indexOf(l) >= seen && match(l), 60_000);
  const line = proc.lines.slice(seen).find(match)!;
  if (line.level >= 50) throw new Error(`${instance.name}: ${JSON.stringify(line)}`);
}

/** A client that sends bytes that are not HTTP, then a request with a broken header, to both listeners. */
async function sendGarbage(instance: Instance): Promise<string> {
  const noise = Buffer.from(Array.from({ length: 512 }, (_, i) => (i * 131 + 7) % 256));
  const answers: string[] = [];
  for (const url of [instance.gatewayUrl, instance.hooksUrl]) {
    const binary = await rawExchange(url, noise, { timeoutMs: 5_000 });
    const header = await rawExchange(url, 'POST /api/x HTTP/1.1\r\nHost: a\r\nX: \x01\x02\r\n\r\n', {
      timeoutMs: 5_000,
    });
    answers.push(String(binary.responses[0]?.status ?? 'closed'), String(header.responses[0]?.status ?? 'closed'));
  }
  await waitUntilReady(instance, 10_000);
  return `answers ${answers.join(',')}`;
}
