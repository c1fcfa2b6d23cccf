import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import Database from 'better-sqlite3';

/*
 * The reference for durable webhook ingest: node:http + better-sqlite3 (WAL, synchronous=FULL).
 * It checks the secret, parses the JSON, inserts the requests that arrived in the same tick in
 * one transaction, and answers 202 after the commit. The Node limit for "verify, store, 202".
 */
const [file, secret] = process.argv.slice(2);
const expected = createHash('sha256').update(secret!).digest();
const db = new Database(file!);
db.pragma('journal_mode = WAL');
db.pragma('synchronous = FULL');
db.exec('CREATE TABLE IF NOT EXISTS events (id TEXT PRIMARY KEY, received_at INTEGER NOT NULL, body TEXT NOT NULL)');
const insert = db.prepare('INSERT INTO events (id, received_at, body) VALUES (?, ?, ?)');

let batch: { id: string; body: string; res: http.ServerResponse }[] = [];
const commit = db.transaction((rows: typeof batch) => {
  const now = Date.now();
  for (const row of rows) insert.run(row.id, now, row.body);
});
function flush() {
  const rows = batch;
  batch = [];
  commit(rows);
  for (const row of rows) {
    row.res.writeHead(202, { 'content-type': 'application/json' });
    row.res.end(`{"id":"${row.id}","status":"queued"}`);
  }
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
    if (batch.length === 0) setImmediate(flush);
    batch.push({ id: randomUUID(), body: text, res });
  });
});
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => console.log(`ready ${(server.address() as AddressInfo).port}`));
// A normal exit on SIGTERM, so --cpu-prof can write its profile.
process.on('SIGTERM', () => process.exit(0));
