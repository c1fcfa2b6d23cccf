import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';

/*
 * The reference for gatehouse's durable webhook pipeline on PostgreSQL: node:http + pg, receiving
 * and delivering, with the durability gatehouse gives.
 *
 * - Receive: the secret compared in constant time, the JSON parsed, the envelope built (the bytes
 *   the target gets: id, action, endpoint, receivedAt, the payload as sent).
 * - Store: the events that arrived together go in one multi-row INSERT (its own transaction), 202
 *   after its COMMIT. One batch in flight; what arrives meanwhile is the next (group commit).
 * - Claim: up to the free delivery slots, whenever at least half are free, with FOR UPDATE SKIP
 *   LOCKED and a lease (a process that dies holding events leaves them claimable when it runs out).
 * - Deliver: POST the envelope to the target over a keep-alive agent, `concurrency` at a time.
 * - Settle: the events delivered meanwhile marked delivered in one UPDATE, one batch in flight. A
 *   failed POST is not settled: it is claimed again when its lease runs out (at least once).
 *
 *   node --import tsx bench/pipeline-bare-pg.ts <postgres url> <secret> <target url> [concurrency = 32]
 */
const [url, secret, targetUrl, concurrencyArg] = process.argv.slice(2);
const CONCURRENCY = Number(concurrencyArg ?? 32);
const LEASE_MS = 30_000;
/** How often the delivery loop looks for due events when nothing told it of any (leases that ran out). */
const IDLE_LOOK_MS = 200;
const MAX_BATCH = 500;

const expected = createHash('sha256').update(secret!).digest();
const target = new URL(targetUrl!);
const agent = new http.Agent({ keepAlive: true });
const pool = new pg.Pool({ connectionString: url, max: 4 });
await pool.query(`CREATE TABLE IF NOT EXISTS events (
  id text PRIMARY KEY,
  seq bigint GENERATED ALWAYS AS IDENTITY,
  status text NOT NULL DEFAULT 'queued',
  received_at bigint NOT NULL,
  lease_until bigint,
  delivered_at bigint,
  envelope text NOT NULL)`);
await pool.query(`CREATE INDEX IF NOT EXISTS events_queued ON events (seq) WHERE status = 'queued'`);

const INSERT_SQL = `INSERT INTO events (id, received_at, envelope)
  SELECT id, $2, envelope FROM unnest($1::text[], $3::text[]) AS t(id, envelope)`;
const CLAIM_SQL = `UPDATE events SET lease_until = $1::bigint + $3::bigint
  WHERE id IN (SELECT id FROM events
                WHERE status = 'queued' AND (lease_until IS NULL OR lease_until <= $1::bigint)
                ORDER BY seq LIMIT $2
                FOR UPDATE SKIP LOCKED)
  RETURNING id, envelope`;
const SETTLE_SQL = `UPDATE events SET status = 'delivered', delivered_at = $2, lease_until = NULL WHERE id = ANY($1::text[])`;

// Store: group commit.
const accepted: { id: string; envelope: string; res: http.ServerResponse }[] = [];
let storing = false;
async function store() {
  storing = true;
  while (accepted.length > 0) {
    const rows = accepted.splice(0, MAX_BATCH);
    let status = 202;
    try {
      await pool.query(INSERT_SQL, [rows.map((r) => r.id), Date.now(), rows.map((r) => r.envelope)]);
    } catch {
      status = 503;
    }
    for (const row of rows) {
      row.res.writeHead(status, { 'content-type': 'application/json' });
      row.res.end(status === 202 ? `{"id":"${row.id}","status":"queued"}` : '{"error":"store_unavailable"}');
    }
    if (status === 202) nudge();
  }
  storing = false;
}

// Claim and deliver.
let inFlight = 0;
let nudged = false;
let wake: (() => void) | undefined;
/** Something may be due (a commit, free slots): the delivery loop looks now instead of at its next idle look. */
function nudge() {
  nudged = true;
  wake?.();
}
function idle(): Promise<void> {
  if (nudged) {
    nudged = false;
    return Promise.resolve();
  }
  return new Promise((resolve) => {
    const timer = setTimeout(done, IDLE_LOOK_MS);
    function done() {
      clearTimeout(timer);
      wake = undefined;
      nudged = false;
      resolve();
    }
    wake = done;
  });
}
async function deliveryLoop(): Promise<never> {
  for (;;) {
    const room = CONCURRENCY - inFlight;
    if (room >= Math.ceil(CONCURRENCY / 2)) {
      try {
        const { rows } = await pool.query<{ id: string; envelope: string }>(CLAIM_SQL, [Date.now(), room, LEASE_MS]);
        for (const row of rows) deliver(row.id, row.envelope);
      } catch {
        // The database is away: look again at the next idle look.
      }
    }
    await idle();
  }
}
function deliver(id: string, envelope: string) {
  inFlight++;
  let finished = false;
  const finish = (ok: boolean) => {
    if (finished) return;
    finished = true;
    inFlight--;
    if (ok) settle(id);
    if (CONCURRENCY - inFlight >= Math.ceil(CONCURRENCY / 2)) nudge();
  };
  const req = http.request(
    target,
    {
      method: 'POST',
      agent,
      timeout: 10_000,
      headers: {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(envelope),
        'idempotency-key': id,
      },
    },
    (res) => {
      res.resume();
      res.on('end', () => finish(res.statusCode! >= 200 && res.statusCode! < 300));
      res.on('error', () => finish(false));
    },
  );
  req.on('timeout', () => req.destroy(new Error('timeout')));
  req.on('error', () => finish(false));
  req.end(envelope);
}

// Settle: group commit of the outcomes.
const delivered: string[] = [];
let settling = false;
function settle(id: string) {
  delivered.push(id);
  if (!settling) void settleAll();
}
async function settleAll() {
  settling = true;
  while (delivered.length > 0) {
    const ids = delivered.splice(0, MAX_BATCH);
    try {
      await pool.query(SETTLE_SQL, [ids, Date.now()]);
    } catch {
      // Not settled: delivered again when their leases run out.
    }
  }
  settling = false;
}

const server = http.createServer((req, res) => {
  const presented = req.headers['x-webhook-secret'];
  if (typeof presented !== 'string' || !timingSafeEqual(createHash('sha256').update(presented).digest(), expected)) {
    res.writeHead(401);
    res.end();
    return;
  }
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const text = Buffer.concat(chunks).toString('utf8');
    try {
      JSON.parse(text);
    } catch {
      res.writeHead(400);
      res.end();
      return;
    }
    const id = randomUUID();
    const envelope = `{"id":"${id}","action":"system-event","endpoint":${JSON.stringify(req.url)},"receivedAt":"${new Date().toISOString()}","payload":${text}}`;
    if (accepted.length === 0 && !storing) setImmediate(() => void store());
    accepted.push({ id, envelope, res });
  });
});
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => console.log(`ready ${(server.address() as AddressInfo).port}`));
void deliveryLoop();
// A normal exit on SIGTERM, so --cpu-prof can write its profile.
process.on('SIGTERM', () => process.exit(0));
