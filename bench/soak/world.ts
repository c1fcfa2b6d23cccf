import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { generateApiKey, hashApiKey } from '../../src/gateway/credentials/api-key.js';
import { request } from '../../test/helpers/http.js';
import { freePort, startPostgres, type PostgresCluster } from '../../test/helpers/postgres.js';
import { startServerProcess, type ServerProcess } from '../../test/helpers/process.js';
import { startRecordingUpstream, type ReceivedRequest, type RecordingServer } from '../../test/helpers/upstream.js';
import { waitFor } from '../../test/helpers/wait.js';

/**
 * Everything the soak runs against, as real processes on real sockets: a PostgreSQL cluster,
 * three `gatehouse start` processes on it (fixed ports, so a restarted instance comes back where a
 * load balancer expects it), a recording upstream, a recording webhook target that can be made to
 * fail, and a JWKS server for the bearer tokens.
 */

export const INSTANCES = 3;
export const HOOK_SECRET = 'soak-hook-secret-0123456789abcdef';
export const ENDPOINT = '/webhook/soak';
export const ADMIN_TOKEN = 'soak-admin-token-0123456789';
export const FAILURES = { max: 5, windowSeconds: 60, lockoutSeconds: 20 };
/** The metered key's own limit: checked against the documented cross-instance bound. */
export const METERED = { requests: 10, per: '1s', perMs: 1_000 };
/** An attempt may take this long: the slow target's 2 s answers fit, a hung one times out. */
export const DELIVERY_TIMEOUT_MS = 4_000;
export const POOL_MAX = 10;

export type TargetMode = 'ok' | '503' | 'hang' | 'slow';

/** One POST the webhook target received. */
export interface Receipt {
  eventId: string;
  /** The instance that posted it (each instance's target URL ends in its name). */
  by: string;
  payload: { seq: number; key?: string; poison?: boolean };
  start: number;
  /** When the answer was flushed; undefined when it never was (hung, or the poster gave up). */
  end?: number;
  status?: number;
}

export interface Instance {
  name: string;
  configFile: string;
  gatewayUrl: string;
  hooksUrl: string;
  adminUrl: string;
  process?: ServerProcess;
  /** Every pid this instance has had, in order, with when it started and ended, and its JSON log lines. */
  lives: { pid: number; start: number; end?: number; lines: Record<string, any>[] }[];
}

export interface World {
  pg: PostgresCluster;
  databaseUrl: string;
  instances: Instance[];
  upstream: RecordingServer;
  target: { url: string; receipts: Receipt[]; mode: TargetMode; close(): Promise<void> };
  jwksUrl: string;
  /**
   * The rotating key's generations: clients send `rotating[generation]`; the configs hold those
   * `inConfig` says (old and new together while a rotation is under way, as an operator does it).
   */
  keys: {
    steady: string;
    metered: string;
    rotating: { id: string; key: string; inConfig: boolean }[];
    generation: number;
  };
  signToken(sub: string): Promise<string>;
  signForged(sub: string): Promise<string>;
  /** Writes every instance's config with the keys as they are now. */
  writeConfigs(): void;
  startInstance(instance: Instance): Promise<void>;
  close(): Promise<void>;
}

export async function startWorld(): Promise<World> {
  const cluster = await startPostgres({ purpose: 'npm run soak', required: true, maxConnections: 300 });
  if ('skip' in cluster) throw new Error(cluster.skip);
  const databaseUrl = await cluster.createDatabase('soak');
  const upstream = await startRecordingUpstream();
  const target = await startTarget();
  const jwks = await startJwks();
  const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-soak-'));
  const keys = {
    steady: generateApiKey(),
    metered: generateApiKey(),
    rotating: [{ id: 'rotating-0', key: generateApiKey(), inConfig: true }],
    generation: 0,
  };
  const instances: Instance[] = [];
  for (let i = 0; i < INSTANCES; i++) {
    const [gateway, hooks, admin] = [await freePort(), await freePort(), await freePort()];
    instances.push({
      name: `i${i}`,
      configFile: path.join(dir, `i${i}.json`),
      gatewayUrl: `http://127.0.0.1:${gateway}`,
      hooksUrl: `http://127.0.0.1:${hooks}`,
      adminUrl: `http://127.0.0.1:${admin}`,
      lives: [],
    });
  }
  const configOf = (instance: Instance) => {
    return {
      log: { level: 'info' },
      // application_name in the URL (it wins over the driver's default) tells the instances' connections apart.
      storage: {
        driver: 'postgres',
        url: `${databaseUrl}?application_name=soak-${instance.name}`,
        pool: { max: POOL_MAX },
      },
      gateway: {
        listen: { host: '127.0.0.1', port: Number(new URL(instance.gatewayUrl).port) },
        upstream: { target: upstream.url, timeoutMs: 10_000 },
        auth: {
          apiKeys: [
            { id: 'steady', hash: hashApiKey(keys.steady) },
            {
              id: 'metered',
              hash: hashApiKey(keys.metered),
              rateLimit: { requests: METERED.requests, per: METERED.per },
            },
            ...keys.rotating.filter((k) => k.inConfig).map((k) => ({ id: k.id, hash: hashApiKey(k.key) })),
          ],
          require: 'any',
          bearer: { jwt: { jwksUri: jwks.url, audience: 'soak', jwksCooldownSeconds: 0 } },
          failures: FAILURES,
        },
      },
      webhooks: {
        enabled: true,
        listen: { host: '127.0.0.1', port: Number(new URL(instance.hooksUrl).port) },
        endpoints: [{ path: ENDPOINT, secret: HOOK_SECRET, action: 'system-event' }],
        targets: { 'system-event': { url: `${target.url}/deliver/${instance.name}` } },
        delivery: { timeoutMs: DELIVERY_TIMEOUT_MS, initialBackoffMs: 200, maxBackoffMs: 5_000, concurrency: 16 },
      },
      admin: { listen: { host: '127.0.0.1', port: Number(new URL(instance.adminUrl).port) }, token: ADMIN_TOKEN },
      shutdown: { acceptGrace: '1s', timeout: '10s' },
    };
  };
  const world: World = {
    pg: cluster,
    databaseUrl,
    instances,
    upstream,
    target,
    jwksUrl: jwks.url,
    keys,
    signToken: (sub) => jwks.sign(sub, jwks.ours),
    signForged: (sub) => jwks.sign(sub, jwks.stranger),
    writeConfigs() {
      for (const instance of instances) writeFileSync(instance.configFile, JSON.stringify(configOf(instance), null, 2));
    },
    async startInstance(instance) {
      // --no-watch: a rotation reaches an instance by its SIGHUP, as the fault schedule says, not by the file poll.
      const proc = startServerProcess(instance.configFile, { command: ['start', '--no-watch'] });
      instance.process = proc;
      const life: Instance['lives'][number] = { pid: proc.child.pid!, start: Date.now(), lines: proc.lines };
      instance.lives.push(life);
      proc.child.once('exit', () => (life.end = Date.now()));
      await proc.waitFor((l) => l.msg === 'webhook receiver listening', 60_000);
      await proc.waitFor((l) => l.msg === 'gateway listening', 60_000);
      await waitUntilReady(instance);
    },
    async close() {
      await Promise.all(instances.map((i) => i.process?.stop('SIGKILL')));
      await Promise.all([upstream.close(), target.close(), jwks.close()]);
      await cluster.destroy();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  world.writeConfigs();
  await Promise.all(instances.map((i) => world.startInstance(i)));
  return world;
}

/** /readyz answers 200 (its store probe has committed). */
export async function waitUntilReady(instance: Instance, timeoutMs = 90_000): Promise<void> {
  await waitFor(
    () =>
      request(instance.adminUrl, '/readyz', { timeoutMs: 2_000 }).then(
        (r) => r.status === 200,
        () => false,
      ),
    { timeoutMs, intervalMs: 250, what: `${instance.name} /readyz` },
  );
}

/** The delivery target: records every POST; answers 200, 503, slowly (2 s) or never, as `mode` says. */
async function startTarget(): Promise<World['target']> {
  const receipts: Receipt[] = [];
  const state = { mode: 'ok' as TargetMode };
  const answer = (receipt: Receipt, res: http.ServerResponse, status: number) => {
    if (res.destroyed) return; // the poster gave up (timeout) or died: nothing was delivered
    res.once('finish', () => (receipt.end = Date.now()));
    receipt.status = status;
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(status === 200 ? '{"ok":true}' : '{"error":"soak"}');
  };
  const hung: http.ServerResponse[] = [];
  const recorder = await startRecordingUpstream((req: ReceivedRequest, res) => {
    const envelope = JSON.parse(req.body);
    const receipt: Receipt = {
      eventId: String(req.headers['idempotency-key']),
      by: req.url.split('/').pop()!,
      payload: JSON.parse(JSON.stringify(envelope.payload)),
      start: Date.now(),
    };
    receipts.push(receipt);
    // A poison event is refused for good (400): it goes dead at its first attempt.
    if (receipt.payload.poison) return answer(receipt, res, 400);
    if (state.mode === '503') return answer(receipt, res, 503);
    if (state.mode === 'hang') return void hung.push(res);
    if (state.mode === 'slow') return void setTimeout(() => answer(receipt, res, 200), 2_000);
    answer(receipt, res, 200);
  });
  return {
    url: recorder.url,
    receipts,
    get mode() {
      return state.mode;
    },
    set mode(mode: TargetMode) {
      state.mode = mode;
      if (mode !== 'hang') for (const res of hung.splice(0)) res.destroy();
    },
    close: () => recorder.close(),
  };
}

type Keys = Awaited<ReturnType<typeof generateKeyPair>>;

/** A JWKS server with our key; `stranger` signs tokens the JWKS does not vouch for. */
async function startJwks() {
  const ours = await generateKeyPair('RS256');
  const stranger = await generateKeyPair('RS256');
  const jwk = { ...(await exportJWK(ours.publicKey)), kid: 'soak-1', alg: 'RS256', use: 'sig' };
  const server = http.createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ keys: [jwk] }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/jwks.json`,
    ours,
    stranger,
    sign: (sub: string, keys: Keys) =>
      new SignJWT({})
        .setProtectedHeader({ alg: 'RS256', kid: 'soak-1' })
        .setSubject(sub)
        .setAudience('soak')
        .setExpirationTime('2h')
        .sign(keys.privateKey),
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
