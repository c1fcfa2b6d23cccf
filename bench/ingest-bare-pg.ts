import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';

/*
 * The reference for durable webhook ingest on PostgreSQL: node:http + pg. It checks the secret,
 * parses the JSON, and inserts the requests that arrived together in one multi-row INSERT
 * (its own transaction), answering 202 after the COMMIT. One batch in flight at a time; what
 * arrives meanwhile is the next batch (the group commit of ingest-bare.ts, over a network
 * round trip). The Node limit for "verify, store in Postgres, 202".
 */
const [url, secret] = process.argv.slice(2);
const expected = createHash('sha256').update(secret!).digest();
const pool = new pg.Pool({ connectionString: url, max: 2 });
await pool.query(
  'CREATE TABLE IF NOT EXISTS events (id text PRIMARY KEY, received_at bigint NOT NULL, body text NOT NULL)',
);

const batch: { id: string; body: string; res: http.ServerResponse }[] = [];
let flushing = false;
async function flush() {
  flushing = true;
  while (batch.length > 0) {
    const rows = batch.splice(0, 500);
    const now = Date.now();
    let status = 202;
    try {
      await pool.query(
        'INSERT INTO events (id, received_at, body) SELECT id, $2, body FROM unnest($1::text[], $3::text[]) AS t(id, body)',
        [rows.map((r) => r.id), now, rows.map((r) => r.body)],
      );
    } catch {
      status = 503;
    }
    for (const row of rows) {
      row.res.writeHead(status, { 'content-type': 'application/json' });
      row.res.end(status === 202 ? `{"id":"${row.id}","status":"queued"}` : '{"error":"store_unavailable"}');
    }
  }
  flushing = false;
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
    if (batch.length === 0 && !flushing) setImmediate(() => void flush());
    batch.push({ id: randomUUID(), body: text, res });
  });
});
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => console.log(`ready ${(server.address() as AddressInfo).port}`));
// A normal exit on SIGTERM, so --cpu-prof can write its profile.
process.on('SIGTERM', () => process.exit(0));
