import type { ReceivedRequest } from '../../test/helpers/upstream.js';
import type { DatabaseFacts } from './database.js';
import type { FaultKind, FaultWindow } from './faults.js';
import type { ApiRecord, HookRecord, LoadRecords } from './load.js';
import type { ResourceSample } from './resources.js';
import { FAILURES, INSTANCES, METERED, type Receipt } from './world.js';

/**
 * The soak's checks, each a pure function of what was recorded: the rules are in docs/soak.md,
 * and each check's `detail` says what it saw, so a failing table row is its own first clue.
 */

export interface Check {
  name: string;
  pass: boolean;
  detail: string;
  /** The evidence behind a failure (event ids, request ids, samples), cut to a few. */
  evidence?: unknown[];
}

/** After a fault ends, this long still counts as inside it: a restarted database or instance takes a few seconds to serve again. */
export const RECOVERY_MS = 10_000;
/** A delivery answered this shortly before a fault may not have been recorded yet (the settle batch): the fault explains it. */
export const SETTLE_MS = 2_000;
const EVIDENCE = 10;

export interface SoakInputs {
  records: LoadRecords;
  receipts: Receipt[];
  upstream: ReceivedRequest[];
  faults: FaultWindow[];
  samples: ResourceSample[];
  database: DatabaseFacts;
  loadStart: number;
  loadEnd: number;
  /** Samples of a process younger than this are warm-up, left out of the flatness check. */
  warmUpMs: number;
}

const delivered = (r: Receipt) => r.end !== undefined && r.status !== undefined && r.status < 300;
const overlaps = (from: number, to: number, w: { start: number; end: number }, margin = 0) =>
  from <= w.end + margin && to >= w.start;

export function runChecks(inputs: SoakInputs): Check[] {
  return [
    deliveredAtLeastOnce(inputs),
    duplicatesExplained(inputs),
    noDeliveryAfterDead(inputs),
    dedupeHeld(inputs),
    drained(inputs),
    noLeftoverLeases(inputs),
    ...resourcesFlat(inputs),
    onlyValidCredentialsUpstream(inputs),
    rotatedKeyRefused(inputs),
    lockoutWithinBound(inputs),
    rateLimitWithinBound(inputs),
    noErrorsOutsideFaults(inputs),
  ];
}

function accepted(hooks: HookRecord[]): Map<string, HookRecord> {
  const out = new Map<string, HookRecord>();
  for (const h of hooks) if (h.status === 202 && h.eventId) out.set(h.eventId, h);
  return out;
}

function deliveredAtLeastOnce({ records, receipts, database }: SoakInputs): Check {
  const byEvent = new Map<string, Receipt[]>();
  for (const r of receipts) byEvent.set(r.eventId, [...(byEvent.get(r.eventId) ?? []), r]);
  const missing: unknown[] = [];
  let poison = 0;
  for (const [id, hook] of accepted(records.hooks)) {
    const got = byEvent.get(id) ?? [];
    if (hook.poison) {
      poison++;
      if (got.length === 0 || database.events.get(id)?.status !== 'dead')
        missing.push({ id, seq: hook.seq, poison: true, status: database.events.get(id)?.status });
    } else if (!got.some(delivered)) missing.push({ id, seq: hook.seq, status: database.events.get(id)?.status });
  }
  const count = accepted(records.hooks).size;
  return {
    name: 'every 202 delivered at least once',
    pass: missing.length === 0,
    detail: `${count} accepted (${poison} poison, refused 400 by the target: dead after one attempt); ${missing.length} not delivered`,
    evidence: missing.slice(0, EVIDENCE),
  };
}

/** A fault explains a duplicate when the first delivery was in flight (or not yet settled) during it, on the instance it hit. */
function explains(w: FaultWindow, first: Receipt): boolean {
  const kinds: FaultKind[] = ['pg-restart', 'pg-freeze', 'target-hang', 'target-slow', 'target-503'];
  const onInstance = (w.kind === 'kill-9' || w.kind === 'sigterm') && `i${w.instance}` === first.by;
  return (kinds.includes(w.kind) || onInstance) && overlaps(first.start, first.end! + SETTLE_MS, w);
}

function duplicatesExplained({ receipts, faults }: SoakInputs): Check {
  const byEvent = new Map<string, Receipt[]>();
  for (const r of receipts)
    if (delivered(r) && r.payload.seq >= 0) byEvent.set(r.eventId, [...(byEvent.get(r.eventId) ?? []), r]);
  let duplicates = 0;
  const unexplained: unknown[] = [];
  const byKind: Record<string, number> = {};
  for (const [id, got] of byEvent) {
    if (got.length < 2) continue;
    duplicates += got.length - 1;
    const first = got[0]!;
    const cause = faults.find((w) => explains(w, first));
    if (cause) byKind[cause.kind] = (byKind[cause.kind] ?? 0) + got.length - 1;
    else
      unexplained.push({
        id,
        seq: first.payload.seq,
        deliveries: got.map((r) => ({ by: r.by, start: new Date(r.start).toISOString(), ms: r.end! - r.start })),
      });
  }
  const total = byEvent.size;
  const share = total ? ((unexplained.length / total) * 100).toFixed(2) : '0';
  return {
    name: 'duplicates explained by a fault',
    pass: unexplained.length === 0,
    detail: `${duplicates} duplicate deliveries of ${total} events (${JSON.stringify(byKind)}); ${unexplained.length} events unexplained (${share} %)`,
    evidence: unexplained.slice(0, EVIDENCE),
  };
}

/**
 * A dead event is posted at most once from the start of the attempt that killed it (that attempt
 * itself): a second post from then on is a delivery after it was marked dead (another claim of it).
 */
function noDeliveryAfterDead({ receipts, database }: SoakInputs): Check {
  const fromLast = new Map<string, Receipt[]>();
  let dead = 0;
  for (const [, e] of database.events) if (e.status === 'dead') dead++;
  for (const r of receipts) {
    const lastAttemptAt = database.events.get(r.eventId)?.deadAt;
    if (lastAttemptAt !== undefined && r.start >= lastAttemptAt)
      fromLast.set(r.eventId, [...(fromLast.get(r.eventId) ?? []), r]);
  }
  const late = [...fromLast].filter(([, posts]) => posts.length > 1);
  return {
    name: 'no delivery after dead',
    pass: late.length === 0,
    detail: `${dead} dead events; ${late.length} posted again after the attempt that made them dead`,
    evidence: late
      .slice(0, EVIDENCE)
      .map(([id, posts]) => ({ id, posts: posts.map((p) => ({ by: p.by, at: p.start })) })),
  };
}

function dedupeHeld({ records, receipts }: SoakInputs): Check {
  const answered = new Map<string, Set<string>>();
  for (const h of records.hooks)
    if (h.key && h.eventId && h.status !== undefined && h.status < 300)
      answered.set(h.key, (answered.get(h.key) ?? new Set()).add(h.eventId));
  const posted = new Map<string, Set<string>>();
  for (const r of receipts)
    if (r.payload.key) posted.set(r.payload.key, (posted.get(r.payload.key) ?? new Set()).add(r.eventId));
  const broken: unknown[] = [];
  for (const [key, ids] of answered) if (ids.size > 1) broken.push({ key, answered: [...ids] });
  for (const [key, ids] of posted) if (ids.size > 1) broken.push({ key, posted: [...ids] });
  const resent = records.hooks.filter((h) => h.resend).length;
  return {
    name: 'dedupe held for every delivery id',
    pass: broken.length === 0,
    detail: `${answered.size} delivery ids answered 2xx (${resent} resends); ${broken.length} with two events`,
    evidence: broken.slice(0, EVIDENCE),
  };
}

function drained({ database }: SoakInputs): Check {
  return {
    name: 'queue drained within 60 s',
    pass: database.drainMs !== undefined,
    detail:
      database.drainMs !== undefined
        ? `0 queued ${(database.drainMs / 1000).toFixed(1)} s after the load stopped`
        : `${database.queuedAtEnd} still queued after 60 s`,
  };
}

function noLeftoverLeases({ database }: SoakInputs): Check {
  const held = database.leasesAfterDrain.reduce((n, l) => n + l.events, 0);
  return {
    name: 'no lease held after the drain',
    pass: held === 0,
    detail: `${held} events still leased after the drain`,
    evidence: database.leasesAfterDrain.slice(0, EVIDENCE),
  };
}

/** Per process lifetime (pid): the last third's mean within 15 % of the first third's, after warm-up. */
function resourcesFlat({ samples, warmUpMs, loadStart, loadEnd, faults }: SoakInputs): Check[] {
  // A fault's window (+ recovery) is left out: a backlog drained after it opens connections for a while; a leak outlasts it.
  const steady = (s: ResourceSample) => !faults.some((w) => overlaps(s.at, s.at, w, RECOVERY_MS));
  const byPid = new Map<number, (ResourceSample & { unpooledFds: number })[]>();
  for (const s of samples) byPid.set(s.pid, [...(byPid.get(s.pid) ?? []), { ...s, unpooledFds: s.fds - s.pooled }]);
  const metrics = [
    { name: 'rssKb', label: 'RSS', slack: 0 },
    // Less the pooled keep-alive connections to the target and upstream: bounded, and checked on their own below.
    { name: 'unpooledFds', label: 'open fds (less pooled keep-alive)', slack: 2 },
    // Small integers: the pool (storage.pool.max 10) keeps a connection 30 s after its last use, so after a
    // backlog two more are its breathing (seed 404 on the fixed code: 6-9 all run long, 6.4 → 8.4 by the means).
    { name: 'pgConnections', label: 'PostgreSQL connections', slack: 2 },
  ] as const;
  // A lifetime is judged when its steady samples span at least a third of the load after its warm-up, 9 or more
  // (three kills, one per instance, still leave each a life that long in a 10-minute run).
  const minSpan = (loadEnd - loadStart) / 3;
  return metrics.map(({ name, label, slack }) => {
    const rows: string[] = [];
    const failures: unknown[] = [];
    for (const [pid, all] of byPid) {
      const start = all[0]!.at;
      const kept = all.filter((s) => s.at >= start + warmUpMs && s.at <= loadEnd && s[name] !== undefined && steady(s));
      if (kept.length < 9 || kept.at(-1)!.at - kept[0]!.at < minSpan) continue;
      const third = Math.floor(kept.length / 3);
      const mean = (xs: typeof kept) => xs.reduce((n, s) => n + (s[name] as number), 0) / xs.length;
      const first = mean(kept.slice(0, third));
      const last = mean(kept.slice(-third));
      const ok = last <= first * 1.15 + slack;
      rows.push(`${all[0]!.instance}/${pid} ${first.toFixed(0)}→${last.toFixed(0)}`);
      const series = kept.map((s) =>
        name === 'unpooledFds' ? `${s.fds} (${s.sockets} sockets, ${s.pooled} pooled)` : s[name],
      );
      if (!ok) failures.push({ instance: all[0]!.instance, pid, first, last, series });
    }
    return {
      name: `${label} flat after warm-up`,
      pass: failures.length === 0 && rows.length > 0,
      detail: rows.length ? rows.join(', ') : 'no process lived long enough to judge',
      evidence: failures,
    };
  });
}

function onlyValidCredentialsUpstream({ records, upstream, faults }: SoakInputs): Check {
  const byId = new Map(records.api.map((r) => [r.id, r]));
  const wrong: unknown[] = [];
  let seen = 0;
  for (const req of upstream) {
    if (req.url === '/api/capacity') continue;
    seen++;
    const id = String(req.headers['x-soak-id']);
    const record = byId.get(id);
    const keyId = req.headers['x-gatehouse-key-id'];
    const subject = req.headers['x-gatehouse-subject'];
    if (!record) wrong.push({ why: 'no such request sent', url: req.url });
    else if (record.credential === 'bad-key' || record.credential === 'bad-jwt')
      wrong.push({ why: `${record.credential} passed`, id });
    else if (
      record.credential === 'jwt'
        ? !String(subject).startsWith('soak-user-')
        : keyId !== (record.keyId ?? record.credential)
    )
      wrong.push({ why: 'identity headers do not match the credential sent', id, keyId, subject });
    else if (record.credential === 'retired' && sentAfterReload(record, faults))
      wrong.push({ why: 'a rotated-out key passed after its reload', id, keyId });
  }
  return {
    name: '/api/: only valid credentials reach the upstream',
    pass: wrong.length === 0,
    detail: `${seen} upstream requests, each matched to what was sent; ${wrong.length} wrong`,
    evidence: wrong.slice(0, EVIDENCE),
  };
}

/** Whether a request with a retired key went after the reload that retired it had completed on its instance. */
function sentAfterReload(record: ApiRecord, faults: FaultWindow[]): boolean {
  const rotation = faults.find((w) => w.retiredKeyId === record.keyId);
  const reloaded = rotation?.reloadedAt?.[record.instance];
  return reloaded !== undefined && record.sent > reloaded;
}

function rotatedKeyRefused({ records, faults }: SoakInputs): Check {
  const probes = records.api.filter((r) => r.credential === 'retired' && sentAfterReload(r, faults));
  const passed = probes.filter((r) => r.status !== undefined && r.status < 300);
  const rotations = faults.filter((w) => w.kind === 'sighup-rotate').length;
  return {
    name: '/api/: a rotated-out key never passes after its reload',
    pass: passed.length === 0,
    detail: `${rotations} rotations; ${probes.length} probes with a retired key after its reload, ${passed.length} passed`,
    evidence: passed.slice(0, EVIDENCE).map((r) => ({ id: r.id, keyId: r.keyId, instance: r.instance })),
  };
}

/**
 * Bad credentials checked before the lock, per burst (a fresh client address each): at most
 * max + N (docs/operations/several-instances.md: each instance's first check may overlap), or
 * N × max while a fault left an instance counting alone.
 */
function lockoutWithinBound({ records, faults }: SoakInputs): Check {
  const over: unknown[] = [];
  const seen = new Map<number, number>();
  for (const burst of records.bursts) {
    const checked = burst.statuses.filter((s) => s === 401).length;
    seen.set(checked, (seen.get(checked) ?? 0) + 1);
    const faulted = faults.some((w) => overlaps(burst.start, burst.end, w, RECOVERY_MS));
    const bound = faulted ? INSTANCES * FAILURES.max : FAILURES.max + INSTANCES;
    if (checked > bound)
      over.push({ client: burst.client, kind: burst.kind, checked, bound, statuses: burst.statuses });
  }
  const histogram = [...seen].sort(([a], [b]) => a - b).map(([n, times]) => `${n}×${times}`);
  return {
    name: '/api/: lockout within its bound',
    pass: over.length === 0,
    detail: `${records.bursts.length} bursts of ${FAILURES.max * 2} bad credentials; 401s before the lock: ${histogram.join(' ')} (max ${FAILURES.max})`,
    evidence: over.slice(0, EVIDENCE),
  };
}

/**
 * The metered key's passes against the documented bound (docs/gateway.md, rate limits with several
 * instances): burst + rate × T + (P − 1) × (burst + 1 s of refill), plus, for every time a process
 * started fresh or PostgreSQL was away (each instance counting alone), another burst + refill per process.
 */
function rateLimitWithinBound({ records, faults }: SoakInputs): Check {
  const metered = records.api.filter((r) => r.credential === 'metered');
  if (metered.length === 0)
    return { name: '/api/: rate limit within its bound', pass: false, detail: 'no metered requests' };
  const seconds = (metered.at(-1)!.sent - metered[0]!.sent) / 1000;
  const rate = METERED.requests / (METERED.perMs / 1000);
  const passed = metered.filter((r) => r.status === 200).length;
  const limited = metered.filter((r) => r.status === 429).length;
  const perProcess = METERED.requests + rate;
  let bound = METERED.requests + rate * seconds + (INSTANCES - 1) * perProcess;
  for (const w of faults) {
    if (w.kind === 'kill-9' || w.kind === 'sigterm') bound += perProcess;
    if (w.kind === 'pg-restart' || w.kind === 'pg-freeze')
      bound += (INSTANCES - 1) * (perProcess + (rate * (w.end - w.start + RECOVERY_MS)) / 1000);
  }
  return {
    name: '/api/: rate limit within its bound',
    pass: passed <= bound && limited > 0,
    detail: `${passed} of ${metered.length} passed in ${seconds.toFixed(0)} s (${limited} limited); bound ${bound.toFixed(0)} (limit ${rate}/s)`,
  };
}

/** Which requests a fault excuses: the listeners it can touch, and only on its instance when it hits one. */
function excuses(w: FaultWindow, listener: 'api' | 'hooks', instance: string): boolean {
  switch (w.kind) {
    case 'kill-9':
    case 'sigterm':
      return `i${w.instance}` === instance;
    case 'pg-restart':
    case 'pg-freeze':
      return listener === 'hooks'; // /api/ keeps serving without the database (docs/operations/several-instances.md)
    default:
      // A rotation keeps both keys valid while clients move; a slow or failing target and a
      // garbage-sending client touch no listener.
      return false;
  }
}

function noErrorsOutsideFaults({ records, faults }: SoakInputs): Check {
  const errors: unknown[] = [];
  let inside = 0;
  let judged = 0;
  const judge = (r: ApiRecord | HookRecord, listener: 'api' | 'hooks', ok: boolean, api?: ApiRecord) => {
    const end = r.done ?? Date.now();
    const excused = faults.some((w) => excuses(w, listener, r.instance) && overlaps(r.sent, end, w, RECOVERY_MS));
    if (ok) return void judged++;
    if (excused) return void inside++;
    judged++;
    errors.push({
      listener,
      instance: r.instance,
      sent: new Date(r.sent).toISOString(),
      status: r.status,
      error: r.error,
      ...(api ? { credential: api.credential, code: api.code } : { seq: (r as HookRecord).seq }),
    });
  };
  for (const r of records.api) {
    if (r.credential === 'bad-key' || r.credential === 'bad-jwt' || r.credential === 'retired') continue;
    const limited = r.credential === 'metered' && r.status === 429 && r.code === 'rate_limited';
    judge(r, 'api', limited || (r.status !== undefined && r.status < 300), r);
  }
  for (const h of records.hooks) judge(h, 'hooks', h.status !== undefined && h.status < 300);
  return {
    name: 'no errors outside fault windows',
    pass: errors.length === 0,
    detail: `${judged} valid requests outside fault windows, ${errors.length} failed; ${inside} failed inside windows (excused)`,
    evidence: errors.slice(0, EVIDENCE),
  };
}
