import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { request, type Reply } from '../../test/helpers/http.js';
import { ENDPOINT, FAILURES, HOOK_SECRET, type Instance, type World } from './world.js';

/**
 * The load: an open loop (requests go out on schedule whether or not earlier ones answered, as
 * independent clients do) spread round-robin over the three instances, every request recorded
 * with when it went, where, with what, and how it ended.
 */

/** A client gives up on an answer after this long (a frozen database holds a webhook up to its 30 s query timeout). */
const CLIENT_TIMEOUT_MS = 45_000;
/** Requests in flight beyond this are not sent (counted as shed): a hung fault must not grow the harness without bound. */
const MAX_IN_FLIGHT = 400;
const TICK_MS = 50;

export type ApiCredential = 'steady' | 'rotating' | 'jwt' | 'metered' | 'retired' | 'bad-key' | 'bad-jwt';

export interface ApiRecord {
  id: string;
  credential: ApiCredential;
  /** For `rotating` and `retired`: which key id was sent. */
  keyId?: string;
  instance: string;
  client: string;
  sent: number;
  done?: number;
  status?: number;
  code?: string;
  error?: string;
}

export interface HookRecord {
  seq: number;
  key?: string;
  /** A resend of an earlier request's delivery id (the sender's retry). */
  resend: boolean;
  poison: boolean;
  instance: string;
  sent: number;
  done?: number;
  status?: number;
  eventId?: string;
  error?: string;
}

/** A bad client's burst of wrong credentials from its own address, one at a time over the instances. */
export interface LockoutBurst {
  client: string;
  kind: 'bad-key' | 'bad-jwt';
  start: number;
  end: number;
  statuses: number[];
}

export interface LoadRecords {
  api: ApiRecord[];
  hooks: HookRecord[];
  bursts: LockoutBurst[];
  shed: number;
}

export interface LoadRates {
  /** Webhooks per second over the three instances. */
  hooks: number;
  /** /api/ requests per second (valid credentials) over the three instances. */
  api: number;
}

/** A source address of its own for each bad client and probe (127.0.1.1 …), so one lock never hits another. */
function addresses(): () => string {
  let n = 0;
  return () => {
    n++;
    return `127.0.${1 + Math.floor(n / 250)}.${1 + (n % 250)}`;
  };
}

/** Runs the load until `stop` is aborted; the records are filled as answers come. */
export async function runLoad(world: World, rates: LoadRates, stop: AbortSignal, records: LoadRecords): Promise<void> {
  const nextAddress = addresses();
  let inFlight = 0;
  let turn = 0;
  let seq = 0;
  const pick = (): Instance => world.instances[turn++ % world.instances.length]!;
  /** Whether a request may go: a shed one is counted, not recorded (it was never sent). */
  const admit = () => {
    if (inFlight < MAX_IN_FLIGHT) return true;
    records.shed++;
    return false;
  };
  const tracked = <T>(work: () => Promise<T>) => {
    inFlight++;
    void work().finally(() => inFlight--);
  };

  const sendApi = (credential: ApiCredential, headers: Record<string, string>, client: string, keyId?: string) => {
    const instance = pick();
    const record: ApiRecord = {
      id: randomUUID(),
      credential,
      keyId,
      instance: instance.name,
      client,
      sent: Date.now(),
    };
    records.api.push(record);
    tracked(() =>
      request(instance.gatewayUrl, `/api/soak/${record.id}`, {
        headers: { ...headers, 'x-soak-id': record.id },
        localAddress: client,
        timeoutMs: CLIENT_TIMEOUT_MS,
      }).then(
        (reply) => settle(record, reply),
        (err: NodeJS.ErrnoException) => fail(record, err),
      ),
    );
  };

  const sendHook = (record: Omit<HookRecord, 'instance' | 'sent'>, instance = pick()) => {
    if (!admit()) return undefined;
    const full: HookRecord = { ...record, instance: instance.name, sent: Date.now() };
    records.hooks.push(full);
    const headers: Record<string, string> = { 'content-type': 'application/json', 'x-webhook-secret': HOOK_SECRET };
    if (record.key) headers['idempotency-key'] = record.key;
    const body = JSON.stringify({ seq: record.seq, key: record.key, poison: record.poison || undefined });
    tracked(() =>
      request(instance.hooksUrl, ENDPOINT, { method: 'POST', headers, body, timeoutMs: CLIENT_TIMEOUT_MS }).then(
        (reply) => {
          settle(full, reply);
          if (reply.status < 300) full.eventId = reply.json().id;
        },
        (err: NodeJS.ErrnoException) => fail(full, err),
      ),
    );
    return full;
  };

  const tokens = await Promise.all(Array.from({ length: 8 }, (_, i) => world.signToken(`soak-user-${i}`)));
  const apiMix = (n: number) => {
    const roll = n % 20;
    if (roll < 8) return sendApi('steady', { 'x-api-key': world.keys.steady }, '127.0.0.1');
    if (roll < 13) {
      const rotating = world.keys.rotating[world.keys.generation]!;
      return sendApi('rotating', { 'x-api-key': rotating.key }, '127.0.0.1', rotating.id);
    }
    sendApi('jwt', { authorization: `Bearer ${tokens[n % tokens.length]}` }, '127.0.0.1');
  };

  const timers: Promise<void>[] = [];
  // Valid traffic and webhooks, on a fixed schedule.
  timers.push(
    ticker(stop, TICK_MS, (tick) => {
      for (const n of spread(rates.api, tick)) apiMix(n);
      for (const _ of spread(rates.hooks, tick)) {
        seq++;
        const keyed = seq % 2 === 0;
        const sent = sendHook({ seq, key: keyed ? `dlv-${seq}` : undefined, resend: false, poison: seq % 50 === 7 });
        // One keyed webhook in ten is sent again to another instance, as a sender retrying would.
        if (sent?.key && seq % 10 === 0)
          setTimeout(() => sendHook({ seq, key: sent.key, resend: true, poison: false }), 200 + (seq % 7) * 150);
      }
    }),
  );
  // The metered key, twice its limit; a rotated-out key, probed from fresh addresses (its 401s lock nobody).
  timers.push(
    ticker(stop, 50, () => sendApi('metered', { 'x-api-key': world.keys.metered }, '127.0.0.4')),
    ticker(stop, 500, () => {
      for (const retired of world.keys.rotating.filter((k) => !k.inConfig))
        sendApi('retired', { 'x-api-key': retired.key }, nextAddress(), retired.id);
    }),
  );
  // Bad clients: one burst of 2 × max wrong credentials at a time, each from a new address.
  timers.push(
    (async () => {
      let kind: LockoutBurst['kind'] = 'bad-key';
      const forged = await world.signForged('mallory');
      while (!stop.aborted) {
        const burst: LockoutBurst = { client: nextAddress(), kind, start: Date.now(), end: 0, statuses: [] };
        for (let i = 0; i < FAILURES.max * 2 && !stop.aborted; i++) {
          const instance = pick();
          const headers: Record<string, string> =
            kind === 'bad-key'
              ? { 'x-api-key': 'gth_wrongwrongwrongwrongwrongwrongwrongwro' }
              : { authorization: `Bearer ${forged}` };
          const record: ApiRecord = {
            id: randomUUID(),
            credential: kind,
            instance: instance.name,
            client: burst.client,
            sent: Date.now(),
          };
          records.api.push(record);
          const reply = await request(instance.gatewayUrl, `/api/soak/${record.id}`, {
            headers: { ...headers, 'x-soak-id': record.id },
            localAddress: burst.client,
            timeoutMs: CLIENT_TIMEOUT_MS,
          }).catch((err: NodeJS.ErrnoException) => fail(record, err));
          if (reply) settle(record, reply);
          burst.statuses.push(record.status ?? 0);
        }
        burst.end = Date.now();
        records.bursts.push(burst);
        kind = kind === 'bad-key' ? 'bad-jwt' : 'bad-key';
        await sleep(1_000);
      }
    })(),
  );
  await Promise.all(timers);
  // Let what is in flight answer (or time out), so every record has an outcome.
  while (inFlight > 0) await sleep(100);
}

function settle(record: ApiRecord | HookRecord, reply: Reply): void {
  record.done = Date.now();
  record.status = reply.status;
  if (reply.status >= 400 && 'credential' in record) {
    try {
      record.code = reply.json().error?.code;
    } catch {
      // not JSON: the status says enough
    }
  }
}

function fail(record: ApiRecord | HookRecord, err: NodeJS.ErrnoException): undefined {
  record.done = Date.now();
  record.error = err.code ?? err.message;
  return undefined;
}

/** The sequence numbers to send in this tick for `perSecond` (whole requests, evenly spread). */
function spread(perSecond: number, tick: number): number[] {
  const perTick = (perSecond * TICK_MS) / 1000;
  const from = Math.floor(tick * perTick);
  const to = Math.floor((tick + 1) * perTick);
  return Array.from({ length: to - from }, (_, i) => from + i);
}

async function ticker(stop: AbortSignal, everyMs: number, onTick: (tick: number) => void): Promise<void> {
  const started = Date.now();
  for (let tick = 0; !stop.aborted; tick++) {
    onTick(tick);
    const next = started + (tick + 1) * everyMs;
    await sleep(Math.max(0, next - Date.now()));
  }
}

/**
 * Capacity, measured briefly before the soak: `concurrency` closed-loop clients for `seconds` on
 * each listener (webhooks first, then /api/ with the steady key), answers per second. Its webhooks
 * carry a negative seq: the checks leave them out.
 */
export async function measureCapacity(world: World, seconds: number, concurrency = 16): Promise<LoadRates> {
  const closedLoop = async (send: (instance: Instance, n: number) => Promise<Reply>) => {
    const until = Date.now() + seconds * 1_000;
    let answered = 0;
    let n = 0;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (Date.now() < until) {
          const reply = await send(world.instances[n % world.instances.length]!, ++n).catch(() => undefined);
          if (reply && reply.status < 300) answered++;
        }
      }),
    );
    return answered / seconds;
  };
  const hooks = await closedLoop((instance, n) =>
    request(instance.hooksUrl, ENDPOINT, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-webhook-secret': HOOK_SECRET },
      body: JSON.stringify({ seq: -n }),
      timeoutMs: CLIENT_TIMEOUT_MS,
    }),
  );
  const api = await closedLoop((instance) =>
    request(instance.gatewayUrl, '/api/capacity', { headers: { 'x-api-key': world.keys.steady }, timeoutMs: 10_000 }),
  );
  return { hooks, api };
}
