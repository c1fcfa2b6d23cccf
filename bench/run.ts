/**
 * `npm run bench`: every case side by side in one run, on loopback, each after a warm-up.
 * The machine is shared and noisy, so the numbers that matter are the ratios to the
 * references started by this same run (node-bare for the /api/ edge, ingest-bare for webhooks,
 * pipeline-bare-pg for the webhook pipeline on PostgreSQL: receiving and delivering, as gatehouse does).
 *
 * The PostgreSQL cases run on a throwaway cluster this run starts (fsync on) and removes
 * (test/helpers/postgres.ts); without PostgreSQL they are skipped, saying so. Under BENCH_ONLY
 * the PostgreSQL pipeline pair runs only when an entry names it ("pipeline-bare-pg", or "ingest"
 * and "postgres" or "-pg"); "gatehouse api-key (postgres)" is selected by prefix like the other gateway cases.
 *
 *   BENCH_DURATION=10 BENCH_CONNECTIONS=64 npm run bench
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import WebSocket from 'ws';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import pg from 'pg';
import { generateApiKey, hashApiKey } from '../src/gateway/credentials/api-key.js';
import { createTestCa } from '../test/helpers/client-certificates.js';
import { startPostgres, type PostgresCluster } from '../test/helpers/postgres.js';
import { checkScaleTargets, printScaleTables, runScaleCases, type ScaleResult } from './scale.js';
import { checkConsoleTargets, printConsoleTables, runConsoleScale, type ConsoleScaleResult } from './console-scale.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const DURATION = Number(process.env.BENCH_DURATION ?? 10);
const WARMUP = Number(process.env.BENCH_WARMUP ?? 3);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 64);
/**
 * BENCH_RATE=800: every request/response case is held at that many requests a second (autocannon's
 * overallRate), so cases compare their CPU per request at the same rate: a case the loaded machine
 * slows down otherwise spreads the process's fixed per-second work over fewer requests.
 */
const RATE = process.env.BENCH_RATE === undefined ? undefined : Number(process.env.BENCH_RATE);
const ONLY = process.env.BENCH_ONLY?.split(',');
/** Each gatehouse case alternates with node-bare this many times; its ratio is the median of the rounds. */
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
/**
 * The webhook ingest cases' `webhooks.delivery.concurrency` (default 32). An experiment's knob: 1
 * leaves the receiver nearly alone during the burst (what receiving costs without deliveries beside it).
 */
const DELIVERY_CONCURRENCY = Number(process.env.BENCH_DELIVERY_CONCURRENCY ?? 32);
/** Where the report goes (the CI smoke writes elsewhere, so latest.json keeps the last real run). */
const OUTPUT = path.resolve(ROOT, process.env.BENCH_OUTPUT ?? 'bench/results/latest.json');
/**
 * BENCH_PROFILE=1: gatehouse runs with --cpu-prof, profiles land in bench/results/ (open in Chrome
 * DevTools). BENCH_NODE_ARGS: other flags for gatehouse's node (e.g. `--import ./count-queries.mjs`).
 */
const PROFILE = [
  ...(process.env.BENCH_PROFILE === '1' ? ['--cpu-prof', '--cpu-prof-dir', path.join(ROOT, 'bench/results')] : []),
  ...(process.env.BENCH_NODE_ARGS?.split(' ').filter(Boolean) ?? []),
];

interface CaseResult {
  name: string;
  requestsPerSec: number;
  p50: number;
  p99: number;
  errors: number;
  non2xx: number;
  expectedStatus: number;
  ratio?: number;
  ratioTo?: string;
  /** CPU time (user + system) the server process spent per answered request: steadier than req/s on a shared machine. */
  cpuMicrosPerRequest?: number;
  extra?: Record<string, number | string>;
}

/** CPU time in µs of a process and its direct children (gateway workers) from /proc (Linux); undefined elsewhere. */
function processCpuMicros(pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined;
  const stat = (p: number | string) => readFileSync(`/proc/${p}/stat`, 'utf8').split(') ')[1]!.split(' ');
  const micros = (fields: string[]) => (Number(fields[11]) + Number(fields[12])) * (1_000_000 / 100); // clock ticks at USER_HZ 100
  try {
    let total = micros(stat(pid));
    for (const entry of readdirSync('/proc')) {
      if (!/^\d+$/.test(entry)) continue;
      try {
        const fields = stat(entry);
        if (Number(fields[1]) === pid) total += micros(fields); // field 4 of stat: the parent's pid
      } catch {
        // gone meanwhile
      }
    }
    return total;
  } catch {
    return undefined;
  }
}

const children: ChildProcess[] = [];
process.on('exit', () => children.forEach((c) => c.kill('SIGKILL')));

/** Starts a Node process and resolves with the port it prints as `ready <port>`, or finds in its JSON log. */
function startProcess(
  args: string[],
  portFrom: (line: string) => number | undefined = readyPort,
): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(child);
  return new Promise((resolve, reject) => {
    let buffer = '';
    let found = false;
    child.stdout!.on('data', (d: Buffer) => {
      if (found) return; // keep draining the log (pino writes it), ignore it
      buffer += d.toString();
      for (const line of buffer.split('\n')) {
        const port = portFrom(line);
        if (port !== undefined) {
          found = true;
          resolve({ child, port });
          return;
        }
      }
    });
    child.once('exit', (code) => !found && reject(new Error(`${args.join(' ')} exited ${code}`)));
  });
}

function readyPort(line: string): number | undefined {
  const m = /^ready (\d+)$/.exec(line.trim());
  return m ? Number(m[1]) : undefined;
}

function logPort(message: string) {
  return (line: string): number | undefined => {
    try {
      const entry = JSON.parse(line);
      return entry.msg === message ? Number(new URL(entry.url).port) : undefined;
    } catch {
      return undefined;
    }
  };
}

const tsx = (file: string, ...args: string[]) => ['--import', 'tsx', path.join(ROOT, 'bench', file), ...args];

async function load(
  name: string,
  options: autocannon.Options,
  expectedStatus: number,
  duration = DURATION,
  warmup = WARMUP,
  pid?: number,
): Promise<CaseResult> {
  if (RATE !== undefined) options = { ...options, overallRate: RATE };
  if (warmup > 0) await autocannon({ ...options, duration: warmup, connections: CONNECTIONS });
  const cpuBefore = processCpuMicros(pid);
  const r = await autocannon({ ...options, duration, connections: CONNECTIONS });
  const cpuAfter = processCpuMicros(pid);
  const wrongStatus = Object.entries(r.statusCodeStats ?? {})
    .filter(([code]) => Number(code) !== expectedStatus)
    .reduce((n, [, v]) => n + (v as { count: number }).count, 0);
  return {
    name,
    requestsPerSec: Math.round(r.requests.average),
    p50: r.latency.p50,
    p99: r.latency.p99,
    errors: r.errors + r.timeouts,
    non2xx: wrongStatus,
    expectedStatus,
    cpuMicrosPerRequest:
      cpuBefore !== undefined && cpuAfter !== undefined && r.requests.total > 0
        ? Math.round((cpuAfter - cpuBefore) / r.requests.total)
        : undefined,
  };
}

/**
 * WebSockets: `CONNECTIONS` clients each send a 64-byte message and wait for its echo, again and
 * again, for `duration` s (round trips per second, and their latency); then 16 loops open and
 * close connections for half as long (connections per second, handshake through the edge).
 */
async function loadWebSocket(
  name: string,
  url: string,
  headers: Record<string, string>,
  duration: number,
  pid?: number,
): Promise<CaseResult> {
  const open = () =>
    new Promise<WebSocket>((resolve, reject) => {
      const ws = new WebSocket(url, { headers, perMessageDeflate: false });
      ws.once('open', () => resolve(ws));
      ws.once('error', reject);
    });
  const message = Buffer.alloc(64, 'x');
  const clients = await Promise.all(Array.from({ length: CONNECTIONS }, open));
  const latencies: number[] = [];
  let errors = 0;
  const cpuBefore = processCpuMicros(pid);
  const deadline = performance.now() + duration * 1000;
  await Promise.all(
    clients.map(
      (ws) =>
        new Promise<void>((resolve) => {
          let sentAt = 0;
          const send = () => {
            if (performance.now() >= deadline) return resolve();
            sentAt = performance.now();
            ws.send(message);
          };
          ws.on('message', () => {
            latencies.push(performance.now() - sentAt);
            send();
          });
          ws.on('error', () => {
            errors++;
            resolve();
          });
          send();
        }),
    ),
  );
  const cpuAfter = processCpuMicros(pid);
  for (const ws of clients) ws.terminate();
  const connectDeadline = performance.now() + (duration / 2) * 1000;
  let connects = 0;
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (performance.now() < connectDeadline) {
        try {
          const ws = await open();
          connects++;
          await new Promise<void>((resolve) => {
            ws.once('close', () => resolve());
            ws.close();
          });
        } catch {
          errors++;
        }
      }
    }),
  );
  const sorted = latencies.sort((a, b) => a - b);
  const at = (q: number) =>
    Math.round((sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? 0) * 100) / 100;
  return {
    name,
    requestsPerSec: Math.round(latencies.length / duration),
    p50: at(0.5),
    p99: at(0.99),
    errors,
    non2xx: 0,
    expectedStatus: 101,
    cpuMicrosPerRequest:
      cpuBefore !== undefined && cpuAfter !== undefined && latencies.length > 0
        ? Math.round((cpuAfter - cpuBefore) / latencies.length)
        : undefined,
    extra: { connectsPerSec: Math.round(connects / (duration / 2)) },
  };
}

async function stop(child: ChildProcess) {
  if (child.exitCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  // A profiled gatehouse writes its profile only once its drain (shutdown.acceptGrace) is over.
  await Promise.race([exited, new Promise((r) => setTimeout(r, PROFILE.length > 0 ? 60_000 : 5000))]);
  child.kill('SIGKILL');
}

async function main() {
  const work = mkdtempSync(path.join(os.tmpdir(), 'gatehouse-bench-'));
  const results: CaseResult[] = [];
  const skipped: string[] = [];
  // A BENCH_ONLY entry is a name prefix; one ending in `$` is a whole name (`gatehouse api-key$` is that case alone).
  const want = (name: string) =>
    !ONLY || ONLY.some((o) => (o.endsWith('$') ? name === o.slice(0, -1) : name.startsWith(o)));
  const wantPostgresIngest =
    !ONLY ||
    ONLY.some(
      (o) =>
        o.startsWith('pipeline-bare-pg') || (o.includes('ingest') && (o.includes('postgres') || o.includes('-pg'))),
    );
  // One throwaway cluster for every PostgreSQL case, started when the first needs it.
  let cluster: Promise<PostgresCluster | { skip: string }> | undefined;
  const postgresCluster = () =>
    (cluster ??= startPostgres({ durable: true, purpose: 'the PostgreSQL bench cases', required: false }));
  const key = generateApiKey();
  const hs256Secret = 'bench-hs256-secret-0123456789abcdefghijkl';

  const upstream = await startProcess(tsx('upstream.ts'));
  const upstreamUrl = `http://127.0.0.1:${upstream.port}`;

  // A JWKS server in this process: gatehouse fetches it once at start and caches it.
  const { publicKey, privateKey } = await generateKeyPair('RS256');
  const jwk = { ...(await exportJWK(publicKey)), kid: 'bench', alg: 'RS256', use: 'sig' };
  let jwksFetches = 0;
  const jwksServer = http.createServer((_req, res) => {
    jwksFetches++;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ keys: [jwk] }));
  });
  await new Promise<void>((r) => jwksServer.listen(0, '127.0.0.1', r));
  const jwksUri = `http://127.0.0.1:${(jwksServer.address() as AddressInfo).port}/jwks.json`;
  const exp = Math.floor(Date.now() / 1000) + 3600;
  const hsToken = await new SignJWT({ sub: 'bench-user' })
    .setProtectedHeader({ alg: 'HS256' })
    .setExpirationTime(exp)
    .sign(new TextEncoder().encode(hs256Secret));
  const rsToken = await new SignJWT({ sub: 'bench-user' })
    .setProtectedHeader({ alg: 'RS256', kid: 'bench' })
    .setExpirationTime(exp)
    .sign(privateKey);

  if (want('direct')) results.push(await load('direct', { url: `${upstreamUrl}/api/items` }, 200));

  // node-bare stays up and is measured right next to each gatehouse case (alternating which goes
  // first): on a shared machine, the ratio of two adjacent runs is what survives the noise.
  const bare = await startProcess(tsx('node-bare.ts', String(upstream.port), key));
  const bareRuns: CaseResult[] = [];
  const measureBare = async (duration = DURATION, warmup = WARMUP) => {
    const run = await load(
      'node-bare',
      { url: `http://127.0.0.1:${bare.port}/api/items`, headers: { 'x-api-key': key } },
      200,
      duration,
      warmup,
      bare.child.pid,
    );
    bareRuns.push(run);
    return run;
  };

  // TLS cases: the test fixtures' server pair, a client CA, a client certificate and a CRL (openssl CLI).
  const fixtures = path.join(ROOT, 'test', 'fixtures', 'tls');
  const serverTls = { cert: path.join(fixtures, 'cert.pem'), key: path.join(fixtures, 'key.pem') };
  const benchCa = createTestCa(work, 'bench-clients-ca');
  const benchClient = benchCa.issue('bench-client', { san: ['URI:spiffe://bench/client'] });
  const benchCrl = benchCa.crl('bench-crl');

  // Issue 31: an OTLP/HTTP sink for the tracing cases, in a process of its own as a collector is:
  // it reads each export and answers 200. Not in this process: autocannon keeps this event loop
  // saturated, so its answers came late and gatehouse held every exported batch (and the spans
  // queued behind it) for that long, which is not what a collector on its own costs.
  // `GET /exports`: how many export requests it has read.
  const otlpSink = await startProcess([
    '-e',
    `let n=0;require('http').createServer((q,s)=>{if(q.method==='GET')return s.end(String(n));q.resume();q.on('end',()=>{n++;s.writeHead(200,{'content-type':'application/json'}).end('{}')})}).listen(0,'127.0.0.1',function(){console.log('ready '+this.address().port)})`,
  ]);
  const otlpSinkUrl = `http://127.0.0.1:${otlpSink.port}`;
  const otlpExportCount = async () => Number(await (await fetch(`${otlpSinkUrl}/exports`)).text());

  const gatewayCases: [
    string,
    Record<string, unknown>,
    Record<string, string>,
    number,
    Record<string, unknown>?,
    Record<string, unknown>?,
  ][] = [
    ['gatehouse api-key', {}, { 'x-api-key': key }, 200],
    // Issue 16: a scoped key, three rules (one matching) and a rate limit that never refuses.
    [
      'gatehouse api-key + 3 rules + rate limit',
      {
        apiKeys: [{ id: 'bench', hash: hashApiKey(key), scopes: ['items:read'] }],
        rules: [
          { paths: ['/api/items/**'], methods: ['GET', 'HEAD'], scopes: ['items:read'] },
          { paths: ['/api/items/**'], methods: ['POST', 'PUT', 'PATCH', 'DELETE'], scopes: ['items:write'] },
          { paths: ['/api/admin/**'], claims: { groups: 'admins' } },
        ],
      },
      { 'x-api-key': key },
      200,
      { rateLimits: [{ by: 'key', requests: 100_000_000, per: '1s' }] },
    ],
    // The same with the admin listener on, so every request is counted and timed (src/observability/metrics.ts).
    [
      'gatehouse api-key (metrics)',
      {},
      { 'x-api-key': key },
      200,
      {},
      { admin: { listen: { host: '127.0.0.1', port: 0 } } },
    ],
    // Issue 31: OpenTelemetry tracing, every request recorded (3 spans) and exported, or none (ratio 0: a traceparent still goes up).
    [
      'gatehouse api-key (tracing 1.0)',
      {},
      { 'x-api-key': key },
      200,
      {},
      { observability: { tracing: { endpoint: otlpSinkUrl, sampleRatio: 1 } } },
    ],
    [
      'gatehouse api-key (tracing 0)',
      {},
      { 'x-api-key': key },
      200,
      {},
      { observability: { tracing: { endpoint: otlpSinkUrl, sampleRatio: 0 } } },
    ],
    // gateway.workers: 2 on the same machine (which also runs the load generator and the upstream).
    ['gatehouse api-key 2 workers', {}, { 'x-api-key': key }, 200, { workers: 2 }],
    // Issue 13: storage on PostgreSQL (the shared lockout, checked in memory) must not slow /api/.
    ['gatehouse api-key (postgres)', {}, { 'x-api-key': key }, 200],
    // Issue 27: gateway.cors configured; plain requests (no Origin) must cost what they did, and a browser's (with Origin) little more.
    [
      'gatehouse api-key (cors)',
      {},
      { 'x-api-key': key },
      200,
      { cors: { origins: ['https://app.example.com', 'https://*.example.com'] } },
    ],
    [
      'gatehouse api-key (cors, Origin)',
      {},
      { 'x-api-key': key, origin: 'https://eu.example.com' },
      200,
      { cors: { origins: ['https://app.example.com', 'https://*.example.com'] } },
    ],
    [
      'gatehouse jwt-hs256',
      { bearer: { jwt: { secret: hs256Secret, algorithms: ['HS256'] } } },
      { authorization: `Bearer ${hsToken}` },
      200,
    ],
    [
      'gatehouse jwt-rs256',
      { bearer: { jwt: { jwksUri, algorithms: ['RS256'] } } },
      { authorization: `Bearer ${rsToken}` },
      200,
    ],
    // The same without the verified-token cache: what a first sight of each token costs.
    [
      'gatehouse jwt-rs256 uncached',
      { bearer: { jwt: { jwksUri, algorithms: ['RS256'], cacheSeconds: 0 } } },
      { authorization: `Bearer ${rsToken}` },
      200,
    ],
    ['gatehouse rejected', {}, { 'x-api-key': generateApiKey() }, 401],
    // Issue 31: HTTPS, then mTLS with the client certificate as the only credential (mode required, a
    // CRL): against node-bare's plain HTTP, so the ratio includes TLS (connections are kept alive).
    ['gatehouse api-key (tls)', {}, { 'x-api-key': key }, 200, { tls: serverTls }],
    [
      'gatehouse client-certificate (mtls)',
      { clientCertificate: { identities: [{ uri: 'spiffe://bench/client', subject: 'bench' }] } },
      {},
      200,
      { tls: { ...serverTls, clientCertificates: { ca: benchCa.certFile, crl: benchCrl, mode: 'required' } } },
    ],
  ];
  for (const [name, auth, headers, status, gatewayExtra = {}, configExtra = {}] of gatewayCases) {
    if (!want(name)) continue;
    let storage: Record<string, unknown> = { path: path.join(work, 'gateway.db') };
    if (name.endsWith('(postgres)')) {
      const pg = await postgresCluster();
      if ('skip' in pg) {
        skipped.push(`${name}: ${pg.skip}`);
        continue;
      }
      storage = { driver: 'postgres', url: await pg.createDatabase('bench_api') };
    }
    const config = {
      storage,
      gateway: {
        listen: { host: '127.0.0.1', port: 0 },
        upstream: { target: upstreamUrl },
        auth: {
          apiKeys: [{ id: 'bench', hash: hashApiKey(key) }],
          allowedIPs: ['127.0.0.1', '::1', '10.0.0.0/8'],
          // The rejected case sends only wrong keys: a lockout would turn them into 429s.
          failures: { max: 1_000_000 },
          ...auth,
        },
        ...gatewayExtra,
      },
      ...configExtra,
    };
    const file = path.join(work, 'gateway.json5');
    writeFileSync(file, JSON.stringify(config));
    const exportsAtStart = name.includes('(tracing') ? await otlpExportCount() : 0;
    const ready = gatewayExtra.workers ? 'gateway workers listening' : 'gateway listening';
    const gatehouse = await startProcess(
      [...PROFILE, path.join(ROOT, 'bin/gatehouse.js'), 'start', '--config', file],
      logPort(ready),
    );
    const before = jwksFetches;
    // Rounds of (node-bare, case) in alternating order; the machine drifts less within a round.
    const perRound = Math.max(2, Math.round(DURATION / ROUNDS));
    const rounds: { run: CaseResult; reference: CaseResult }[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      const warmup = round === 0 ? WARMUP : 1;
      const bareFirst = round % 2 === 0;
      const pairedBare = bareFirst ? await measureBare(perRound, warmup) : undefined;
      const run = await load(
        name,
        {
          url: `${gatewayExtra.tls ? 'https' : 'http'}://127.0.0.1:${gatehouse.port}/api/items`,
          headers,
          tlsOptions: name.includes('(mtls)') ? { cert: benchClient.cert, key: benchClient.key } : undefined,
        },
        status,
        perRound,
        warmup,
        gatehouse.child.pid,
      );
      rounds.push({ run, reference: pairedBare ?? (await measureBare(perRound, warmup)) });
    }
    const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
    const sum = (pick: (r: CaseResult) => number) => rounds.reduce((n, r) => n + pick(r.run), 0);
    const result: CaseResult = {
      name,
      requestsPerSec: Math.round(sum((r) => r.requestsPerSec) / rounds.length),
      p50: median(rounds.map((r) => r.run.p50)),
      p99: median(rounds.map((r) => r.run.p99)),
      errors: sum((r) => r.errors),
      non2xx: sum((r) => r.non2xx),
      expectedStatus: status,
      ratio: Math.round(median(rounds.map((r) => r.run.requestsPerSec / r.reference.requestsPerSec)) * 100) / 100,
      ratioTo: 'node-bare',
      cpuMicrosPerRequest: median(rounds.map((r) => r.run.cpuMicrosPerRequest ?? NaN)),
    };
    const reference = rounds.map((r) => r.reference);
    result.extra = {
      roundRatios: rounds.map((r) => (r.run.requestsPerSec / r.reference.requestsPerSec).toFixed(2)).join('/'),
      pairedNodeBareP99: median(reference.map((r) => r.p99)),
      pairedNodeBareCpuMicros: median(reference.map((r) => r.cpuMicrosPerRequest ?? NaN)),
    };
    if (name.includes('rs256')) result.extra.jwksFetchesDuringLoad = jwksFetches - before;
    results.push(result);
    await stop(gatehouse.child);
    // The exports the sink got, the stop's final flush included: ratio 1.0 must have some, ratio 0 none.
    if (name.includes('(tracing')) result.extra.otlpExports = (await otlpExportCount()) - exportsAtStart;
  }
  await stop(otlpSink.child);
  if (bareRuns.length === 0 && want('node-bare')) await measureBare();
  await stop(bare.child);
  if (bareRuns.length > 0) {
    // The node-bare row: the median of its paired runs.
    const median = [...bareRuns].sort((x, y) => x.requestsPerSec - y.requestsPerSec)[Math.floor(bareRuns.length / 2)]!;
    results.splice(
      results.findIndex((r) => r.name.startsWith('gatehouse')) === -1
        ? results.length
        : results.findIndex((r) => r.name.startsWith('gatehouse')),
      0,
      { ...median, extra: { runs: bareRuns.map((r) => r.requestsPerSec).join('/') } },
    );
  }

  if (want('websocket') || want('gatehouse websocket')) {
    // Round trips on open connections through the edge, against a bare node:http upgrade proxy.
    const wsUpstream = await startProcess(tsx('ws-upstream.ts'));
    const wsBare = await startProcess(tsx('ws-bare.ts', String(wsUpstream.port), key));
    const file = path.join(work, 'websocket.json5');
    writeFileSync(
      file,
      JSON.stringify({
        storage: { path: path.join(work, 'websocket.db') },
        gateway: {
          listen: { host: '127.0.0.1', port: 0 },
          upstream: { target: `http://127.0.0.1:${wsUpstream.port}` },
          auth: { apiKeys: [{ id: 'bench', hash: hashApiKey(key) }] },
        },
      }),
    );
    const gatehouse = await startProcess(
      [...PROFILE, path.join(ROOT, 'bin/gatehouse.js'), 'start', '--config', file],
      logPort('gateway listening'),
    );
    const headers = { 'x-api-key': key };
    const perRound = Math.max(2, Math.round(DURATION / ROUNDS));
    const rounds: { run: CaseResult; reference: CaseResult }[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      const measureRef = () =>
        loadWebSocket('websocket ws-bare', `ws://127.0.0.1:${wsBare.port}/api/ws`, headers, perRound, wsBare.child.pid);
      const reference = round % 2 === 0 ? await measureRef() : undefined;
      const run = await loadWebSocket(
        'gatehouse websocket',
        `ws://127.0.0.1:${gatehouse.port}/api/ws`,
        headers,
        perRound,
        gatehouse.child.pid,
      );
      rounds.push({ run, reference: reference ?? (await measureRef()) });
    }
    const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
    const summarize = (
      pick: (r: { run: CaseResult; reference: CaseResult }) => CaseResult,
      ratio?: number,
    ): CaseResult => {
      const runs = rounds.map(pick);
      return {
        ...runs[0]!,
        requestsPerSec: Math.round(runs.reduce((n, r) => n + r.requestsPerSec, 0) / runs.length),
        p50: median(runs.map((r) => r.p50)),
        p99: median(runs.map((r) => r.p99)),
        errors: runs.reduce((n, r) => n + r.errors, 0),
        cpuMicrosPerRequest: median(runs.map((r) => r.cpuMicrosPerRequest ?? NaN)),
        ...(ratio !== undefined ? { ratio, ratioTo: 'websocket ws-bare' } : {}),
        extra: {
          connectsPerSec: median(runs.map((r) => Number(r.extra!.connectsPerSec))),
          roundRatios: rounds.map((r) => (r.run.requestsPerSec / r.reference.requestsPerSec).toFixed(2)).join('/'),
        },
      };
    };
    const tripRatio =
      Math.round(median(rounds.map((r) => r.run.requestsPerSec / r.reference.requestsPerSec)) * 100) / 100;
    const connectRatio =
      Math.round(
        median(rounds.map((r) => Number(r.run.extra!.connectsPerSec) / Number(r.reference.extra!.connectsPerSec))) *
          100,
      ) / 100;
    results.push(summarize((r) => r.reference));
    const gatehouseRow = summarize((r) => r.run, tripRatio);
    gatehouseRow.extra!.connectsRatio = connectRatio;
    results.push(gatehouseRow);
    await Promise.all([stop(gatehouse.child), stop(wsBare.child), stop(wsUpstream.child)]);
  }

  const body = JSON.stringify({ event: 'deploy', service: 'bench', padding: 'x'.repeat(1024 - 60) });
  const secret = 'bench-webhook-secret-0123456789';
  const hookHeaders = { 'content-type': 'application/json', 'x-webhook-secret': secret };

  if (want('ingest-bare')) {
    const bare = await startProcess(tsx('ingest-bare.ts', path.join(work, 'bare.db'), secret));
    results.push(
      await load(
        'ingest-bare',
        { url: `http://127.0.0.1:${bare.port}/webhook/bench`, method: 'POST', body, headers: hookHeaders },
        202,
        DURATION,
        WARMUP,
        bare.child.pid,
      ),
    );
    await stop(bare.child);
  }

  /**
   * A saturating burst of webhooks at a pipeline that receives and delivers (`receiver`, its process
   * `pid`, delivering to the target.ts on `targetPort`), then a wait until everything it accepted
   * (`countStored`, warm-up included) has reached the target. Adds to the result: `drainMs`, from
   * the load stopping to the last delivery; `cpuMicrosPerEvent`, the process's CPU from the warm-up
   * to that last delivery per accepted event (receiving, storing, delivering and settling it).
   */
  const burstAndDrain = async (
    name: string,
    receiver: string,
    pid: number | undefined,
    targetPort: number,
    countStored: () => Promise<number>,
  ): Promise<CaseResult> => {
    const cpuStart = processCpuMicros(pid);
    const startedAt = Date.now();
    const result = await load(
      name,
      { url: receiver, method: 'POST', body, headers: hookHeaders },
      202,
      DURATION,
      WARMUP,
      pid,
    );
    const stoppedAt = Date.now();
    await new Promise((r) => setTimeout(r, 500)); // requests still in flight when the load stopped get committed too
    const accepted = await countStored();
    const deadline = Date.now() + 120_000;
    let count = { delivered: 0, lastAt: 0 };
    while (Date.now() < deadline) {
      count = await getJson(`http://127.0.0.1:${targetPort}/count`);
      if (count.delivered >= accepted) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const cpuEnd = processCpuMicros(pid);
    // Delivered/s: everything accepted (warm-up included) reaching the target, timed from the first request.
    const seconds = (count.lastAt - startedAt) / 1000;
    result.extra = {
      accepted,
      delivered: count.delivered,
      deliveredPerSec: Math.round(count.delivered / seconds),
      acceptedPerSecOverall: Math.round(accepted / (WARMUP + DURATION)),
      drainMs: Math.max(0, count.lastAt - stoppedAt),
      ...(cpuStart !== undefined && cpuEnd !== undefined && accepted > 0
        ? { cpuMicrosPerEvent: Math.round((cpuEnd - cpuStart) / accepted) }
        : {}),
    };
    return result;
  };

  /**
   * "webhook ingest<suffix>": saturating load on a gatehouse whose storage is `storage`, then
   * "webhook sustained<suffix>" at half that rate. `countStored` counts the events it stored.
   */
  const ingestCases = async (suffix: string, storage: Record<string, unknown>, countStored: () => Promise<number>) => {
    const target = await startProcess(tsx('target.ts'));
    const config = {
      storage,
      gateway: {
        listen: { port: 0 },
        upstream: { target: upstreamUrl },
        auth: { apiKeys: [{ id: 'bench', hash: hashApiKey(key) }] },
      },
      webhooks: {
        enabled: true,
        listen: { host: '127.0.0.1', port: 0 },
        endpoints: [{ path: '/webhook/bench', secret, action: 'system-event' }],
        targets: { 'system-event': { url: `http://127.0.0.1:${target.port}/events` } },
        delivery: { concurrency: DELIVERY_CONCURRENCY },
      },
    };
    const file = path.join(work, `ingest${suffix ? '-pg' : ''}.json5`);
    writeFileSync(file, JSON.stringify(config));
    const gatehouse = await startProcess(
      [...PROFILE, path.join(ROOT, 'bin/gatehouse.js'), 'start', '--config', file],
      logPort('webhook receiver listening'),
    );
    const result = await burstAndDrain(
      `webhook ingest${suffix}`,
      `http://127.0.0.1:${gatehouse.port}/webhook/bench`,
      gatehouse.child.pid,
      target.port,
      countStored,
    );
    results.push(result);

    // Sustained: half the saturating rate, steady. Deliveries keep up when, once the load stops,
    // everything accepted has reached the target within a second.
    const rate = Math.round(result.requestsPerSec / 2);
    const beforeCount = (await getJson<{ delivered: number }>(`http://127.0.0.1:${target.port}/count`)).delivered;
    const steady = await autocannon({
      url: `http://127.0.0.1:${gatehouse.port}/webhook/bench`,
      method: 'POST',
      body,
      headers: hookHeaders,
      connections: CONNECTIONS,
      overallRate: rate,
      duration: DURATION,
    });
    const stoppedAt = Date.now();
    const acceptedSteady = steady['2xx'];
    let steadyCount = { delivered: 0, lastAt: 0 };
    while (Date.now() < stoppedAt + 60_000) {
      steadyCount = await getJson(`http://127.0.0.1:${target.port}/count`);
      if (steadyCount.delivered - beforeCount >= acceptedSteady) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    results.push({
      name: `webhook sustained${suffix}`,
      requestsPerSec: Math.round(steady.requests.average),
      p50: steady.latency.p50,
      p99: steady.latency.p99,
      errors: steady.errors + steady.timeouts,
      non2xx: steady.non2xx,
      expectedStatus: 202,
      extra: {
        offeredRate: rate,
        accepted: acceptedSteady,
        delivered: steadyCount.delivered - beforeCount,
        deliveryLagMs: Math.max(0, steadyCount.lastAt - stoppedAt),
      },
    });
    await stop(gatehouse.child);
    await stop(target.child);
  };

  if (want('webhook ingest')) {
    const dbFile = path.join(work, 'ingest.db');
    await ingestCases('', { path: dbFile }, () => countAccepted(dbFile));
  }

  if (wantPostgresIngest) {
    // The pipeline on PostgreSQL: the bare node:http + pg pipeline (receiving and delivering), then
    // gatehouse, each in a database of its own and delivering to a target of its own.
    const pg = await postgresCluster();
    if ('skip' in pg) {
      skipped.push(pg.skip);
    } else {
      const bareUrl = await pg.createDatabase('bench_pipeline');
      const target = await startProcess(tsx('target.ts'));
      const pipeline = await startProcess(
        tsx(
          'pipeline-bare-pg.ts',
          bareUrl,
          secret,
          `http://127.0.0.1:${target.port}/events`,
          String(DELIVERY_CONCURRENCY),
        ),
      );
      results.push(
        await burstAndDrain(
          'pipeline-bare-pg',
          `http://127.0.0.1:${pipeline.port}/webhook/bench`,
          pipeline.child.pid,
          target.port,
          () => countPostgresEvents(bareUrl),
        ),
      );
      await stop(pipeline.child);
      await stop(target.child);
      const url = await pg.createDatabase('bench_gatehouse');
      await ingestCases(' (postgres)', { driver: 'postgres', url }, () => countPostgresEvents(url));
    }
  }
  const pg = await cluster;
  if (pg && !('skip' in pg)) await pg.destroy();

  jwksServer.close();
  await stop(upstream.child);
  rmSync(work, { recursive: true, force: true });

  const ref = (name: string) => results.find((r) => r.name === name);
  const references: Record<string, string> = {
    'webhook ingest': 'ingest-bare',
    'webhook ingest (postgres)': 'pipeline-bare-pg',
  };
  for (const r of results) {
    const reference = references[r.name] !== undefined ? ref(references[r.name]!) : undefined;
    if (reference) {
      r.ratio = Math.round((r.requestsPerSec / reference.requestsPerSec) * 100) / 100;
      r.ratioTo = reference.name;
    }
  }
  // Scale: 100,000 keys and a 1,000,000-event queue (bench/scale.ts; ~2 minutes). BENCH_ONLY=scale for these alone.
  const scale: ScaleResult[] = want('scale') ? await runScaleCases() : [];
  // The admin API's first page on 1,000,000 events, both drivers (bench/console-scale.ts). BENCH_ONLY=console for it alone.
  let consolePages: ConsoleScaleResult[] = [];
  if (want('console')) {
    const run = await runConsoleScale(postgresCluster);
    consolePages = run.results;
    skipped.push(...run.skipped);
  }

  printTable(results);
  for (const reason of skipped) console.log(`\nSKIPPED: ${reason}`);
  if (scale.length > 0) printScaleTables(scale);
  if (consolePages.length > 0) printConsoleTables(consolePages);
  const report = {
    at: new Date().toISOString(),
    machine: {
      cpus: os.cpus().length,
      cpuModel: os.cpus()[0]?.model,
      node: process.version,
      platform: `${os.platform()} ${os.arch()}`,
      memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    },
    settings: { durationSeconds: DURATION, warmupSeconds: WARMUP, connections: CONNECTIONS },
    results,
    skipped,
    scale,
    console: consolePages,
    targets: [...checkTargets(results), ...checkScaleTargets(scale), ...checkConsoleTargets(consolePages)],
  };
  mkdirSync(path.join(ROOT, 'bench/results'), { recursive: true });
  writeFileSync(OUTPUT, JSON.stringify(report, null, 2) + '\n');
  console.log('\ntargets:');
  for (const t of report.targets) console.log(`  ${t.met ? 'met ' : 'MISS'}  ${t.target}: ${t.measured}`);
  const markdown = OUTPUT.replace(/\.json$/, '.md');
  writeFileSync(markdown, toMarkdown(report));
  console.log(
    `\nwritten: ${path.relative(ROOT, OUTPUT)}, ${path.relative(ROOT, markdown)} (the tables for docs/benchmarks.md)`,
  );
}

function checkTargets(results: CaseResult[]) {
  const r = (name: string) => results.find((x) => x.name === name);
  const out: { target: string; measured: string; met: boolean }[] = [];
  const bare = r('node-bare');
  const apiKey = r('gatehouse api-key');
  if (bare && apiKey) {
    out.push({ target: 'api-key >= 0.7 x node-bare req/s', measured: `${apiKey.ratio}`, met: apiKey.ratio! >= 0.7 });
    const bareP99 = Number(apiKey.extra?.pairedNodeBareP99 ?? bare.p99);
    out.push({
      target: 'api-key p99 <= 2 x node-bare p99',
      measured: `${apiKey.p99} ms vs ${bareP99} ms`,
      met: apiKey.p99 <= 2 * bareP99,
    });
    const bareCpu = Number(apiKey.extra?.pairedNodeBareCpuMicros);
    if (apiKey.cpuMicrosPerRequest !== undefined && Number.isFinite(bareCpu)) {
      out.push({
        target: 'api-key CPU per request <= 1.5 x node-bare',
        measured: `${apiKey.cpuMicrosPerRequest} µs vs ${bareCpu} µs`,
        met: apiKey.cpuMicrosPerRequest <= 1.5 * bareCpu,
      });
    }
  }
  const authorized = r('gatehouse api-key + 3 rules + rate limit');
  if (apiKey && authorized) {
    // Both ratios are to their paired node-bare runs: the comparison that survives a noisy machine.
    const relative = Math.round((authorized.ratio! / apiKey.ratio!) * 100) / 100;
    out.push({
      target: 'api-key + 3 rules + rate limit >= 0.9 x api-key',
      measured: `${relative} (${authorized.ratio} vs ${apiKey.ratio} of node-bare)`,
      met: relative >= 0.9,
    });
  }
  const metrics = r('gatehouse api-key (metrics)');
  if (apiKey && metrics) {
    // Each ratio is to the node-bare run paired with it, so machine drift between the two cases cancels out.
    const cost = 1 - metrics.ratio! / apiKey.ratio!;
    out.push({
      target: 'metrics cost < 5 % of api-key req/s (ratios to node-bare)',
      measured: `${(cost * 100).toFixed(1)} % (${metrics.ratio} vs ${apiKey.ratio}; cpu ${metrics.cpuMicrosPerRequest} vs ${apiKey.cpuMicrosPerRequest} µs/req)`,
      met: cost < 0.05,
    });
  }
  // Issue 31: tracing's cost, as gatehouse's own CPU per request against api-key's (the req/s ratio beside it).
  for (const [name, limit] of [
    ['gatehouse api-key (tracing 1.0)', 0.1],
    ['gatehouse api-key (tracing 0)', 0.02],
  ] as const) {
    const traced = r(name);
    if (!apiKey || !traced) continue;
    const cost = traced.cpuMicrosPerRequest! / apiKey.cpuMicrosPerRequest! - 1;
    out.push({
      target: `${name.slice('gatehouse api-key '.length)} costs < ${limit * 100} % of api-key's CPU per request`,
      measured: `${(cost * 100).toFixed(1)} % (cpu ${traced.cpuMicrosPerRequest} vs ${apiKey.cpuMicrosPerRequest} µs/req; req/s ratios ${traced.ratio} vs ${apiKey.ratio})`,
      met: cost < limit,
    });
  }
  const onPostgres = r('gatehouse api-key (postgres)');
  if (apiKey && onPostgres) {
    const relative = Math.round((onPostgres.ratio! / apiKey.ratio!) * 100) / 100;
    out.push({
      target: 'api-key (postgres) >= 0.9 x api-key (ratios to node-bare)',
      measured: `${relative} (${onPostgres.ratio} vs ${apiKey.ratio}; cpu ${onPostgres.cpuMicrosPerRequest} vs ${apiKey.cpuMicrosPerRequest} µs/req)`,
      met: relative >= 0.9,
    });
  }
  const rs = r('gatehouse jwt-rs256');
  if (bare && rs) out.push({ target: 'jwt-rs256 >= 0.6 x node-bare', measured: `${rs.ratio}`, met: rs.ratio! >= 0.6 });
  const ws = r('gatehouse websocket');
  if (ws)
    out.push({
      target: 'websocket round trips >= 0.7 x ws-bare',
      measured: `${ws.ratio} (connects ${ws.extra?.connectsRatio} x)`,
      met: ws.ratio! >= 0.7,
    });
  const rejected = r('gatehouse rejected');
  if (apiKey && rejected)
    out.push({
      target: 'rejected req/s >= api-key req/s',
      measured: `${rejected.requestsPerSec} vs ${apiKey.requestsPerSec}`,
      met: rejected.requestsPerSec >= apiKey.requestsPerSec,
    });
  // SQLite: p99 < 25 ms against ingest-bare; PostgreSQL (a network round trip and a server's commit per batch): p99 < 50 ms against pipeline-bare-pg.
  for (const [suffix, reference, p99Limit] of [
    ['', 'ingest-bare', 25],
    [' (postgres)', 'pipeline-bare-pg', 50],
  ] as const) {
    const ingest = r(`webhook ingest${suffix}`);
    if (ingest && r(reference)) {
      out.push({
        target: `webhook ingest${suffix} >= 0.6 x ${reference}`,
        measured: `${ingest.ratio}`,
        met: ingest.ratio! >= 0.6,
      });
      out.push({
        target: `webhook ingest${suffix} p99 < ${p99Limit} ms`,
        measured: `${ingest.p99} ms`,
        met: ingest.p99 < p99Limit,
      });
    }
    // Both pipelines deliver: the one accepting more must not do it by leaving more to deliver after the burst.
    const pipeline = r(reference);
    if (ingest?.extra?.drainMs !== undefined && pipeline?.extra?.drainMs !== undefined) {
      const { drainMs, cpuMicrosPerEvent } = ingest.extra;
      out.push({
        target: `webhook ingest${suffix} drain time <= ${reference}'s`,
        measured: `${drainMs} ms vs ${pipeline.extra.drainMs} ms; cpu ${cpuMicrosPerEvent} vs ${pipeline.extra.cpuMicrosPerEvent} µs per accepted event`,
        met: Number(drainMs) <= Number(pipeline.extra.drainMs),
      });
    }
    if (ingest?.extra) {
      const { accepted, delivered } = ingest.extra as { accepted: number; delivered: number };
      out.push({
        target: `every accepted event delivered${suffix}`,
        measured: `${delivered}/${accepted}`,
        met: delivered >= accepted,
      });
    }
    const sustained = r(`webhook sustained${suffix}`);
    if (sustained?.extra) {
      const { deliveryLagMs, offeredRate } = sustained.extra as { deliveryLagMs: number; offeredRate: number };
      out.push({
        target: `deliveries keep up at a steady ${offeredRate}/s${suffix} (all delivered within 1 s of the load stopping)`,
        measured: `${deliveryLagMs} ms after`,
        met: deliveryLagMs <= 1000,
      });
    }
  }
  for (const x of results)
    if (x.errors > 0 || x.non2xx > 0)
      out.push({
        target: `${x.name}: no errors, every answer ${x.expectedStatus}`,
        measured: `${x.errors} errors, ${x.non2xx} other statuses`,
        met: false,
      });
  return out;
}

/** The report as Markdown tables, ready for docs/benchmarks.md. */
function toMarkdown(report: {
  at: string;
  machine: Record<string, unknown>;
  settings: Record<string, unknown>;
  results: CaseResult[];
  skipped: string[];
  scale: ScaleResult[];
  targets: { target: string; measured: string; met: boolean }[];
}): string {
  const table = (header: string[], rows: string[][]) =>
    [
      `| ${header.join(' | ')} |`,
      `|${header.map(() => '---').join('|')}|`,
      ...rows.map((r) => `| ${r.join(' | ')} |`),
    ].join('\n');
  const { machine, settings } = report;
  const parts = [
    `Run ${report.at} on ${machine.cpus} × ${machine.cpuModel}, Node ${machine.node}, ${machine.platform}; ${settings.connections} connections, ${settings.warmupSeconds} s warm-up, ${settings.durationSeconds} s per case.`,
    table(
      ['case', 'req/s', 'p50 ms', 'p99 ms', 'cpu µs/req', 'errors', 'ratio', 'notes'],
      report.results.map((r) => [
        r.name,
        String(r.requestsPerSec),
        String(r.p50),
        String(r.p99),
        r.cpuMicrosPerRequest !== undefined ? String(r.cpuMicrosPerRequest) : '',
        String(r.errors + r.non2xx),
        r.ratio !== undefined ? `${r.ratio} × ${r.ratioTo}` : '',
        r.extra
          ? Object.entries(r.extra)
              .map(([k, v]) => `${k}=${v}`)
              .join(' ')
          : '',
      ]),
    ),
  ];
  for (const reason of report.skipped) parts.push(`**Skipped:** ${reason}`);
  for (const group of ['keys start', 'keys lookup', 'queue'] as const) {
    const rows = report.scale.filter((r) => r.group === group);
    if (rows.length === 0) continue;
    const columns = [...new Set(rows.flatMap((r) => Object.keys(r.measured)))];
    parts.push(
      table(
        [group, ...columns],
        rows.map((r) => [r.name, ...columns.map((c) => String(r.measured[c] ?? ''))]),
      ),
    );
  }
  parts.push(
    table(
      ['target', 'measured', ''],
      report.targets.map((t) => [t.target, t.measured, t.met ? 'met' : '**not met**']),
    ),
  );
  return parts.join('\n\n') + '\n';
}

function printTable(results: CaseResult[]) {
  const rows = results.map((r) => [
    r.name,
    String(r.requestsPerSec),
    `${r.p50}`,
    `${r.p99}`,
    r.cpuMicrosPerRequest !== undefined ? String(r.cpuMicrosPerRequest) : '',
    String(r.errors + r.non2xx),
    r.ratio !== undefined ? `${r.ratio} x ${r.ratioTo}` : '',
    r.extra
      ? Object.entries(r.extra)
          .map(([k, v]) => `${k}=${v}`)
          .join(' ')
      : '',
  ]);
  const header = ['case', 'req/s', 'p50 ms', 'p99 ms', 'cpu µs/req', 'errors', 'ratio', 'notes'];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i]!)).join('  ');
  console.log(`\n${line(header)}\n${widths.map((w) => '-'.repeat(w)).join('  ')}`);
  for (const row of rows) console.log(line(row));
}

async function countAccepted(file: string): Promise<number> {
  const { default: Database } = await import('better-sqlite3');
  const db = new Database(file, { readonly: true });
  const { n } = db.prepare('SELECT COUNT(*) AS n FROM events').get() as { n: number };
  db.close();
  return n;
}

async function countPostgresEvents(url: string): Promise<number> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return Number((await client.query('SELECT count(*) AS n FROM events')).rows[0].n);
  } finally {
    await client.end();
  }
}

function getJson<T>(url: string): Promise<T> {
  return new Promise((resolve, reject) => {
    http
      .get(url, (res) => {
        let text = '';
        res.on('data', (d) => (text += d));
        res.on('end', () => resolve(JSON.parse(text)));
      })
      .on('error', reject);
  });
}

await main();
