import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { request } from '../helpers/http.js';
import { postWebhook, startInstances, stopInstances, type Instance } from '../helpers/instances.js';
import { waitFor } from '../helpers/wait.js';
import { postgresDatabases, type PostgresDatabases } from '../helpers/postgres.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// Issue 13: three real `gatehouse start` processes on one real PostgreSQL, a real upstream and a
// real delivery target. Clients spread over the instances as a round-robin load balancer would.

const API_KEY = 'instances-test-key-0123456789abcdefghijklmnop';
const SECRET = 'instances-hook-secret-0123456789';
const ENDPOINT = '/webhook/shared';
const FAILURES_MAX = 5;
/** The target sits on each delivery this long, so an instance holds leases at any moment of the burst. */
const TARGET_DELAY_MS = 40;
/** Lease = timeoutMs + the deliverer's 5 s margin: a dead instance's deliveries are free again after ~7 s. */
const DELIVERY_TIMEOUT_MS = 2_000;
const TOTAL = 3_000;
const CONCURRENCY = 48;

const cluster = await postgresDatabases();
const skip = 'skip' in cluster ? cluster.skip : false;

/** One delivery as the target saw it. */
interface Receipt {
  id: string;
  seq: number;
  /** The instance that delivered it (each instance's target URL ends in its name). */
  by: string;
  answered: boolean;
  at: number;
}

describe('three gatehouse instances on one PostgreSQL', { skip, timeout: 120_000 }, () => {
  let upstream: RecordingServer;
  let target: RecordingServer;
  let instances: Instance[] = [];
  let db: pg.Client;
  const receipts: Receipt[] = [];
  /** Called by the target on each delivery before it answers (the kill test's trigger). */
  let onDelivery: (receipt: Receipt) => void = () => {};
  let killed = false;

  before(async () => {
    const url = await (cluster as PostgresDatabases).createDatabase();
    upstream = await startRecordingUpstream();
    target = await startRecordingUpstream((req, res) => {
      const envelope = JSON.parse(req.body);
      const receipt: Receipt = {
        id: envelope.id,
        seq: envelope.payload.seq,
        by: req.url.split('/').pop()!,
        answered: false,
        at: Date.now(),
      };
      receipts.push(receipt);
      onDelivery(receipt);
      if (receipt.by === 'i0' && killed) return; // the dead instance's socket: nobody would read an answer
      setTimeout(() => {
        receipt.answered = true;
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"ok":true}');
      }, TARGET_DELAY_MS);
    });
    instances = await startInstances(3, url, (i) => ({
      log: { level: 'info' },
      gateway: {
        listen: { host: '127.0.0.1', port: 0 },
        upstream: { target: upstream.url },
        auth: { apiKey: API_KEY, failures: { max: FAILURES_MAX, windowSeconds: 60, lockoutSeconds: 300 } },
      },
      webhooks: {
        enabled: true,
        listen: { host: '127.0.0.1', port: 0 },
        endpoints: [{ path: ENDPOINT, secret: SECRET, action: 'system-event' }],
        targets: { 'system-event': { url: `${target.url}/deliver/i${i}` } },
        delivery: { timeoutMs: DELIVERY_TIMEOUT_MS, initialBackoffMs: 50, maxBackoffMs: 200, concurrency: 16 },
      },
    }));
    db = new pg.Client({ connectionString: url });
    await db.connect();
  });

  after(async () => {
    await db?.end().catch(() => {});
    await stopInstances(instances);
    await upstream?.close();
    await target?.close();
    if (!('skip' in cluster)) await cluster.destroy();
  });

  it('bad credentials spread round-robin lock the client at exactly failures.max, on all three', async (t) => {
    const client = '127.0.0.5'; // a source address of its own: the other tests' clients stay unlocked
    const bad = { 'x-api-key': 'wrong-key-0123456789abcdefghijklmnopqrstuv' };
    const statuses: number[] = [];
    for (let i = 0; i < FAILURES_MAX + 3; i++) {
      const reply = await request(instances[i % 3]!.gatewayUrl, '/api/thing', { headers: bad, localAddress: client });
      statuses.push(reply.status);
    }
    assert.deepEqual(
      statuses,
      [...Array(FAILURES_MAX).fill(401), 429, 429, 429],
      'the max-th failure, on whichever instance, locks',
    );
    // Locked everywhere: even the right key is refused on each instance, and nothing reaches the upstream.
    const before = upstream.received.length;
    for (const instance of instances) {
      const reply = await request(instance.gatewayUrl, '/api/thing', {
        headers: { 'x-api-key': API_KEY },
        localAddress: client,
      });
      assert.equal(reply.status, 429, `${instance.name} refuses the locked client`);
      assert.equal(reply.json().error.code, 'too_many_failures');
    }
    assert.equal(upstream.received.length, before, 'no upstream request after the lock, on any instance');
    // Another client is not affected, on any instance.
    for (const instance of instances) {
      assert.equal(
        (
          await request(instance.gatewayUrl, '/api/thing', {
            headers: { 'x-api-key': API_KEY },
            localAddress: '127.0.0.6',
          })
        ).status,
        200,
      );
    }
    assert.equal(upstream.received.length, before + 3);

    // All at once: 6·max bad guesses in flight together over the three instances. The documented
    // bound (README): an instance's first checks of a client, before it has seen it fail there, take
    // no reservation (no database call for a client that has not failed), so between max and, at
    // worst, 3·max are checked; what the run saw is reported.
    const burst = await Promise.all(
      Array.from({ length: FAILURES_MAX * 6 }, (_, i) =>
        request(instances[i % 3]!.gatewayUrl, '/api/thing', { headers: bad, localAddress: '127.0.0.7' }).then(
          (r) => r.status,
        ),
      ),
    );
    const checked = burst.filter((s) => s === 401).length;
    assert.ok(
      checked >= FAILURES_MAX && checked <= FAILURES_MAX * 3,
      `between max and 3·max guesses were checked: ${burst.join(',')}`,
    );
    assert.equal(burst.filter((s) => s === 429).length, FAILURES_MAX * 6 - checked);
    t.diagnostic(
      `burst of ${FAILURES_MAX * 6} bad keys at once over three instances: ${checked} checked (max ${FAILURES_MAX})`,
    );
    for (const instance of instances) {
      assert.equal(
        (
          await request(instance.gatewayUrl, '/api/thing', {
            headers: { 'x-api-key': API_KEY },
            localAddress: '127.0.0.7',
          })
        ).status,
        429,
      );
    }
    assert.equal(upstream.received.length, before + 3);
  });

  it('one delivery id sent to two instances at once is stored once and delivered once', async () => {
    const KEYS = 20;
    const replies = await Promise.all(
      Array.from({ length: KEYS }, (_, k) =>
        Promise.all([
          postWebhook(instances[1]!.hooksUrl, ENDPOINT, SECRET, { seq: -1 - k }, `dedupe-${k}`),
          postWebhook(instances[2]!.hooksUrl, ENDPOINT, SECRET, { seq: -1 - k }, `dedupe-${k}`),
        ]),
      ),
    );
    const ids = new Set<string>();
    for (const [k, pair] of replies.entries()) {
      const statuses = pair.map((r) => r.status).sort();
      assert.deepEqual(statuses, [200, 202], `dedupe-${k}: one accepted, one duplicate (${statuses})`);
      assert.equal(pair[0]!.json().id, pair[1]!.json().id, `dedupe-${k}: both answers name the same event`);
      ids.add(pair[0]!.json().id);
    }
    const { rows } = await db.query<{ n: string }>(
      "SELECT count(*) AS n FROM events WHERE idempotency_key LIKE 'dedupe-%'",
    );
    assert.equal(Number(rows[0]!.n), KEYS, 'stored once per delivery id');
    await waitFor(() => [...ids].every((id) => receipts.some((r) => r.id === id && r.answered)), {
      what: 'every deduplicated event delivered',
    });
    // A second event would be counted above; a second claim can only be made while the event is
    // queued. So once the store holds each as delivered and the target has answered every request
    // it got, no second delivery can still come.
    await waitFor(
      async () => {
        const { rows: left } = await db.query<{ n: string }>(
          "SELECT count(*) AS n FROM events WHERE idempotency_key LIKE 'dedupe-%' AND status <> 'delivered'",
        );
        return Number(left[0]!.n) === 0 && receipts.every((r) => r.answered);
      },
      { what: 'every deduplicated event stored as delivered and every request answered' },
    );
    // One event per delivery id, delivered once: a second request for it only after an attempt the
    // instance itself logged as failed (on an overloaded machine, a 40 ms answer not read in time).
    for (const [k, id] of [...ids].entries()) {
      const got = receipts.filter((r) => r.seq === -1 - k);
      assert.ok(
        got.every((r) => r.id === id),
        `dedupe-${k} reached the target as one event`,
      );
      const failed = instances
        .flatMap((i) => i.process.lines)
        .filter((l) => l.id === id && l.msg === 'delivery attempt failed; will retry').length;
      assert.equal(got.length, 1 + failed, `${id} delivered once (${failed} logged failed attempts)`);
    }
  });

  it(`${TOTAL} webhooks at ${CONCURRENCY} concurrency, one instance SIGKILLed a third of the way in: every 202 delivered, its leases taken over`, async (t) => {
    const startedAt = Date.now();
    receipts.length = 0;
    const dead = instances[0]!;
    const live = instances.slice(1);
    let accepted = 0;
    let unansweredAtKill: Receipt[] = [];
    let killedAt = 0;
    let postsLeftAtKill = -1;
    let next = 0;
    // Keep-alive, as a load balancer's upstream pool: the burst measures gatehouse, not TCP handshakes.
    const agents = instances.map(() => new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY }));
    t.after(() => agents.forEach((a) => a.destroy()));
    onDelivery = (receipt) => {
      // Inside one of i0's deliveries, a third of the way in: i0 holds at least this lease when it dies.
      if (killed || receipt.by !== 'i0' || accepted < TOTAL / 3) return;
      killed = true;
      killedAt = Date.now();
      dead.process.child.kill('SIGKILL');
      unansweredAtKill = receipts.filter((r) => r.by === 'i0' && !r.answered);
      postsLeftAtKill = TOTAL - next;
    };

    // A sender with a load balancer in front: round-robin; a refused connection (the dead instance)
    // goes to the next instance; a post cut mid-flight is retried elsewhere with the same delivery id.
    const outcome = new Map<number, { id: string; retried: boolean }>();
    let refused = 0;
    let cut = 0;
    const postOne = async (seq: number) => {
      let retried = false;
      for (let tryNo = 0; tryNo < 6; tryNo++) {
        const instance = instances[(seq + tryNo) % 3]!;
        try {
          const reply = await postWebhook(
            instance.hooksUrl,
            ENDPOINT,
            SECRET,
            { seq },
            `seq-${seq}`,
            agents[(seq + tryNo) % 3],
          );
          assert.ok(
            reply.status === 202 || (reply.status === 200 && retried),
            `seq ${seq} on ${instance.name}: ${reply.status} ${reply.body}`,
          );
          accepted++;
          outcome.set(seq, { id: reply.json().id, retried });
          return;
        } catch (err) {
          const code = (err as NodeJS.ErrnoException).code;
          if (code === 'ECONNREFUSED') refused++;
          else if (code === 'ECONNRESET' || code === 'EPIPE' || /socket hang up/.test(String(err))) {
            cut++;
            retried = true;
          } else throw err;
        }
      }
      assert.fail(`seq ${seq} was never accepted`);
    };
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < TOTAL) await postOne(next++);
      }),
    );
    const postedMs = Date.now() - startedAt;
    assert.ok(killed, 'the kill landed while posts were still being sent');
    assert.ok(postsLeftAtKill > 0, `posts were left to send at the kill (${postsLeftAtKill})`);
    assert.equal(await dead.process.stop(), null);
    assert.equal(dead.process.child.signalCode, 'SIGKILL');
    assert.ok(unansweredAtKill.length >= 1, 'the dead instance held leases (deliveries in flight) when it died');

    // Every 202'd event reaches the target, answered; the dead instance's unanswered deliveries
    // are made again by the live ones once their lease has run out.
    const acceptedIds = new Set([...outcome.values()].map((o) => o.id));
    // Those in flight at the kill, and those whose request the dead instance had written just before it.
    const mustTakeOver = new Set(
      [...unansweredAtKill, ...receipts.filter((r) => r.by === 'i0' && !r.answered)].map((r) => r.id),
    );
    const answered = () => new Set(receipts.filter((r) => r.answered).map((r) => r.id));
    const drainStarted = Date.now();
    await waitFor(
      () => {
        const got = answered();
        return [...acceptedIds].every((id) => got.has(id));
      },
      {
        timeoutMs: 30_000,
        what: () => {
          const got = answered();
          const missing = [...acceptedIds].filter((id) => !got.has(id));
          return `every accepted event delivered; ${missing.length} never were (${missing.slice(0, 5).join(', ')}…)`;
        },
      },
    );
    const drainMs = Date.now() - drainStarted;
    for (const id of mustTakeOver) {
      const again = receipts.filter((r) => r.id === id && r.by !== 'i0' && r.answered);
      assert.ok(again.length >= 1, `${id}, in flight on the dead instance, was delivered by a live one`);
    }
    // When the last of them was picked up again: bounded by the lease (timeout + 5 s margin) and a poll.
    const takeoverMs = Math.max(
      ...[...mustTakeOver].map((id) => receipts.find((r) => r.id === id && r.by !== 'i0')!.at - killedAt),
    );
    // The target may have answered the dead instance for an event it then died before recording:
    // that event stays leased until the lease runs out, then a live instance delivers it again and
    // records it. So the store is waited for, not read once (CI on Node 22 saw 2 still queued).
    const statuses = async () =>
      (
        await db.query<{ status: string; n: string }>(
          "SELECT status, count(*) AS n FROM events WHERE idempotency_key LIKE 'seq-%' GROUP BY status",
        )
      ).rows.map((r) => [r.status, Number(r.n)]);
    await waitFor(async () => JSON.stringify(await statuses()) === JSON.stringify([['delivered', TOTAL]]), {
      timeoutMs: 30_000,
      what: async () => `each post stored once, all delivered: ${JSON.stringify(await statuses())}`,
    }).catch(() => undefined);
    assert.deepEqual(await statuses(), [['delivered', TOTAL]], 'each post stored once, all delivered');

    // Each delivery carries the body posted under its id; nothing arrived that was not posted.
    const seqOf = new Map([...outcome].map(([seq, o]) => [o.id, seq]));
    for (const r of receipts) assert.equal(r.seq, seqOf.get(r.id), `${r.id} carries the body posted for it`);
    const perId = new Map<string, number>();
    for (const r of receipts) perId.set(r.id, (perId.get(r.id) ?? 0) + 1);
    const duplicates = [...perId].filter(([, n]) => n > 1).map(([id]) => id);
    // At least once, and no more than explained: an event is delivered twice only when the dead
    // instance had posted it before dying (bytes it wrote just before the signal may reach the
    // target after it: any of its receipts counts), or when a live instance logged that attempt as
    // failed (its answer not read within timeoutMs on a loaded machine: a retry, as designed).
    const retriedAttempt = (id: string) =>
      live.flatMap((i) => i.process.lines).find((l) => l.id === id && l.msg === 'delivery attempt failed; will retry');
    let retriedDuplicates = 0;
    const retryErrors = new Map<string, number>();
    for (const id of duplicates) {
      if (receipts.some((r) => r.id === id && r.by === 'i0')) continue;
      const retry = retriedAttempt(id);
      assert.ok(
        retry,
        `${id} was delivered twice, explained neither by the kill nor by a failed attempt: ${JSON.stringify(receipts.filter((r) => r.id === id).map((r) => ({ ...r, at: r.at - killedAt })))}`,
      );
      retriedDuplicates++;
      const reason = String(retry.error ?? retry.status).replace(/\d+/g, 'N');
      retryErrors.set(reason, (retryErrors.get(reason) ?? 0) + 1);
    }
    const byInstance = Object.fromEntries(
      instances.map((i) => [i.name, receipts.filter((r) => r.by === i.name).length]),
    );
    t.diagnostic(
      `posts: ${TOTAL} accepted in ${postedMs} ms; ${refused} refused by the dead instance and sent elsewhere, ${cut} cut mid-flight and retried with their delivery id`,
    );
    t.diagnostic(
      `kill: ${postsLeftAtKill} posts left to send, ${mustTakeOver.size} deliveries in flight on the dead instance, all taken over by ${live.map((i) => i.name).join('/')} within ${takeoverMs} ms`,
    );
    t.diagnostic(
      `target: ${receipts.length} requests for ${perId.size} events, ${duplicates.length} delivered more than once (${duplicates.length - retriedDuplicates} posted by the dead instance, ${retriedDuplicates} after an attempt a live instance saw fail: ${JSON.stringify(Object.fromEntries(retryErrors))}); by instance ${JSON.stringify(byInstance)}`,
    );
    t.diagnostic(
      `timings: drained ${drainMs} ms after the last post, ${Date.now() - killedAt} ms after the kill; total ${Date.now() - startedAt} ms`,
    );
  });
});
