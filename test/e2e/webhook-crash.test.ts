import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { it } from 'node:test';
import Database from 'better-sqlite3';
import { request } from '../helpers/http.js';
import { startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

const SECRET = 'crash-hook-secret-0123456789';
const API_KEY = 'crash-test-key-0123456789abcdefghijklmnop';
const ENDPOINT = '/webhook/crash';
const TOTAL = 300;
const CONCURRENCY = 16;
/** The kill lands on the first delivery the target gets once this many posts were answered 202. */
const KILL_AFTER_ACCEPTED = 100;
/** The target sits on each delivery this long, so deliveries are in flight when the kill lands. */
const TARGET_DELAY_MS = 20;
const DRAIN_DEADLINE_MS = 30_000;

/** What the sender learned about one post. */
type Outcome =
  | { kind: 'accepted'; id: string } // 202: committed
  | { kind: 'rejected'; status: number } // a definite answer other than 202: must never reach the target
  | { kind: 'refused' } // ECONNREFUSED: never reached gatehouse
  | { kind: 'unknown'; code: string }; // connection cut mid-request: may or may not have been committed

interface Receipt {
  id: string;
  seq: number;
  nonce: string;
  idempotencyKey: string | undefined;
  /** 1: from the killed process; 2: from the restarted one. */
  run: 1 | 2;
  /** Read after the kill from a socket the dead process had written to: it can never have seen an answer. */
  afterKill: boolean;
  answered: boolean;
}

it(
  'SIGKILL mid-stream: every 202 is delivered after a restart, nothing refused is, and unacknowledged deliveries are redelivered',
  { timeout: 60_000 },
  async (t) => {
    const startedAt = Date.now();
    const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-crash-'));
    const dbFile = path.join(dir, 'gatehouse.db');

    const receipts: Receipt[] = [];
    let run: 1 | 2 = 1;
    let killed = false;
    let server: ServerProcess | undefined;
    const outcomes = new Map<number, Outcome>();
    const bodies = new Map<number, { seq: number; nonce: string }>();
    let acceptedCount = 0;
    let postsInFlight = 0;
    let postsInFlightAtKill = -1;
    let unansweredAtKill: Receipt[] = [];

    const kill = () => {
      if (killed) return;
      killed = true;
      server!.child.kill('SIGKILL');
      // Taken in the same tick as the kill: the dead process can never see answers written after this.
      unansweredAtKill = receipts.filter((r) => r.run === 1 && !r.answered);
      postsInFlightAtKill = postsInFlight;
    };

    const target = await startRecordingUpstream((req, res) => {
      const envelope = JSON.parse(req.body);
      const receipt: Receipt = {
        id: envelope.id,
        seq: envelope.payload.seq,
        nonce: envelope.payload.nonce,
        idempotencyKey: req.headers['idempotency-key'] as string | undefined,
        run,
        afterKill: run === 1 && killed,
        answered: false,
      };
      receipts.push(receipt);
      // This delivery is unanswered right now: killing here guarantees a lease is held at the kill.
      if (run === 1 && acceptedCount >= KILL_AFTER_ACCEPTED) kill();
      setTimeout(() => {
        receipt.answered = true;
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"ok":true}');
      }, TARGET_DELAY_MS);
    });

    const configFile = path.join(dir, 'gatehouse.json5');
    writeFileSync(
      configFile,
      JSON.stringify(
        {
          storage: { path: dbFile },
          log: { level: 'info' },
          gateway: {
            listen: { host: '127.0.0.1', port: 0 },
            upstream: { target: target.url },
            auth: { apiKey: API_KEY },
          },
          webhooks: {
            enabled: true,
            listen: { host: '127.0.0.1', port: 0 },
            endpoints: [{ path: ENDPOINT, secret: SECRET, action: 'system-event' }],
            targets: { 'system-event': { url: `${target.url}/events` } },
            delivery: { timeoutMs: 2000, initialBackoffMs: 50, maxBackoffMs: 200, concurrency: 16 },
          },
        },
        null,
        2,
      ),
    );

    let db: Database.Database | undefined;
    try {
      server = startServerProcess(configFile);
      const { url: hooks } = await server.waitFor((l) => l.msg === 'webhook receiver listening');

      // 1. Post TOTAL unique webhooks, CONCURRENCY at a time, no idempotency key; the kill lands mid-stream.
      let next = 0;
      const postOne = async (seq: number): Promise<Outcome> => {
        const body = { seq, nonce: randomUUID() };
        bodies.set(seq, body);
        postsInFlight++;
        try {
          const reply = await request(hooks, ENDPOINT, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'x-webhook-secret': SECRET },
            body: JSON.stringify(body),
          });
          if (reply.status !== 202) return { kind: 'rejected', status: reply.status };
          acceptedCount++;
          return { kind: 'accepted', id: reply.json().id };
        } catch (err) {
          const code = (err as NodeJS.ErrnoException).code ?? String(err);
          return code === 'ECONNREFUSED' ? { kind: 'refused' } : { kind: 'unknown', code };
        } finally {
          postsInFlight--;
        }
      };
      await Promise.all(
        Array.from({ length: CONCURRENCY }, async () => {
          while (next < TOTAL) {
            const seq = next++;
            outcomes.set(seq, await postOne(seq));
          }
        }),
      );
      // Deliveries always keep up with 16 posts at a time; if they somehow did not, this test would not test a mid-stream kill.
      assert.ok(killed, 'the kill was triggered by a delivery while posts were still being sent');
      assert.equal(await server.stop(), null, 'the first process died of SIGKILL');
      assert.equal(server.child.signalCode, 'SIGKILL');

      const byKind = (kind: Outcome['kind']) => [...outcomes].filter(([, o]) => o.kind === kind);
      const accepted = byKind('accepted') as [number, Extract<Outcome, { kind: 'accepted' }>][];
      const unknown = byKind('unknown') as [number, Extract<Outcome, { kind: 'unknown' }>][];
      const definiteFailures = [...byKind('refused'), ...byKind('rejected')];
      assert.equal(outcomes.size, TOTAL);
      assert.ok(postsInFlightAtKill > 0, 'posts were in flight when the process was killed');
      assert.ok(accepted.length >= KILL_AFTER_ACCEPTED && accepted.length < TOTAL, `${accepted.length} accepted`);
      assert.ok(unansweredAtKill.length >= 1, 'at least one delivery was in flight at the kill');
      assert.deepEqual(byKind('rejected'), [], 'no post got a non-202 answer before the kill');

      // 2. Restart on the same config and SQLite file.
      run = 2;
      const resumedAt = Date.now();
      server = startServerProcess(configFile);
      await server.waitFor((l) => l.msg === 'webhook receiver listening');
      // Leases live in the killed process's memory: what is asserted below is the outcome,
      // that the deliveries it never saw answered are made again.

      // 3. Wait until every 202 and every delivery the dead process never saw answered has reached the
      //    target (again), and nothing is left queued in the store.
      db = new Database(dbFile, { fileMustExist: true });
      const queuedCount = db.prepare<[], { n: number }>("SELECT COUNT(*) AS n FROM events WHERE status != 'delivered'");
      const mustRedeliver = new Set([...unansweredAtKill, ...receipts.filter((r) => r.afterKill)].map((r) => r.id));
      const receivedIds = () => new Set(receipts.map((r) => r.id));
      const redeliveredIds = () => new Set(receipts.filter((r) => r.run === 2).map((r) => r.id));
      await waitFor(
        () => {
          const got = receivedIds();
          const again = redeliveredIds();
          return (
            accepted.every(([, o]) => got.has(o.id)) &&
            [...mustRedeliver].every((id) => again.has(id)) &&
            queuedCount.get()!.n === 0
          );
        },
        {
          timeoutMs: DRAIN_DEADLINE_MS,
          intervalMs: 50,
          what: () => {
            const got = receivedIds();
            const again = redeliveredIds();
            const missing = accepted.filter(([, o]) => !got.has(o.id)).map(([, o]) => o.id);
            return `the drain: ${missing.length} accepted ids never reached the target (${missing.slice(0, 5).join(', ')}…); ${[...mustRedeliver].filter((id) => !again.has(id)).length} unacknowledged not redelivered; ${queuedCount.get()!.n} not delivered in the store`;
          },
        },
      );
      const drainMs = Date.now() - resumedAt;
      assert.equal(await server.stop('SIGTERM'), 0);
      server = undefined;

      // Every 202'd id reached the target, with the body that was posted for it.
      const receiptsById = new Map<string, Receipt[]>();
      for (const r of receipts) receiptsById.set(r.id, [...(receiptsById.get(r.id) ?? []), r]);
      for (const [seq, { id }] of accepted) {
        const got = receiptsById.get(id);
        assert.ok(got, `202'd ${id} (seq ${seq}) reached the target`);
        for (const r of got) {
          assert.equal(r.seq, seq, `${id} carries the body posted as seq ${seq}`);
          assert.equal(r.nonce, bodies.get(seq)!.nonce);
          assert.equal(r.idempotencyKey, id);
        }
      }

      // Nothing the sender was definitely refused reached the target; everything else that did was a
      // 202 or a post whose outcome the sender could not know (committed just before the kill).
      const acceptedIdOf = new Map(accepted.map(([seq, o]) => [seq, o.id]));
      const definitelyFailedSeqs = new Set(definiteFailures.map(([seq]) => seq));
      const unknownSeqs = new Set(unknown.map(([seq]) => seq));
      let deliveredUnknown = 0;
      for (const [id, got] of receiptsById) {
        const seq = got[0]!.seq;
        assert.ok(!definitelyFailedSeqs.has(seq), `seq ${seq} was refused or rejected, yet ${id} reached the target`);
        if (acceptedIdOf.has(seq))
          assert.equal(acceptedIdOf.get(seq), id, `seq ${seq} reached the target under the id its 202 named`);
        else {
          assert.ok(unknownSeqs.has(seq), `seq ${seq} reached the target without a 202 and without an unknown outcome`);
          deliveredUnknown++;
        }
      }
      // One post is one event: no body was stored twice.
      const seqsDelivered = [...receiptsById.values()].map((got) => got[0]!.seq);
      assert.equal(new Set(seqsDelivered).size, seqsDelivered.length, 'each posted body became at most one event');

      // Deliveries the dead process never saw answered were made again; the restarted run itself never
      // delivered anything twice.
      for (const id of mustRedeliver)
        assert.ok(
          receiptsById.get(id)!.some((r) => r.run === 2),
          `${id} was unacknowledged at the kill and delivered again`,
        );
      for (const [id, got] of receiptsById)
        assert.ok(got.filter((r) => r.run === 2).length <= 1, `${id} delivered more than once by the restarted run`);

      // The store agrees: exactly the events the target got, all delivered.
      const rows = db.prepare<[], { id: string; status: string }>('SELECT id, status FROM events').all();
      assert.deepEqual(
        rows.filter((r) => r.status !== 'delivered'),
        [],
      );
      assert.deepEqual(new Set(rows.map((r) => r.id)), new Set(receiptsById.keys()));

      const duplicates = [...receiptsById.values()].filter((got) => got.length > 1).length;
      t.diagnostic(
        `posts: ${accepted.length} accepted (202), ${unknown.length} unknown (${[...new Set(unknown.map(([, o]) => o.code))].join(',') || '-'}), ${definiteFailures.length} refused; ${postsInFlightAtKill} posts in flight at the kill`,
      );
      t.diagnostic(
        `target: ${receiptsById.size} distinct events (${deliveredUnknown} from unknown-outcome posts), ${receipts.length} requests, ${duplicates} delivered more than once; ${unansweredAtKill.length} unanswered at the kill`,
      );
      t.diagnostic(`timings: restart-to-drained ${drainMs} ms, total ${Date.now() - startedAt} ms`);
    } finally {
      db?.close();
      if (server) await server.stop('SIGKILL');
      await target.close();
    }
  },
);
