import assert from 'node:assert/strict';
import http from 'node:http';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import pino from 'pino';
import { parseConfig } from '../../src/config/load.js';
import { Deliverer } from '../../src/webhooks/delivery/deliverer.js';
import { SqliteEventStore } from '../../src/webhooks/store.js';
import { startRecordingUpstream } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

const TIMEOUT_MS = 4_000;
/** Each answer comes well inside TIMEOUT_MS; the second request waits one answer for the one socket: both together pass it. */
const ANSWER_MS = 2_500;

describe('deliverer: an attempt is timed from the request sent, not from the wait for a connection', () => {
  it('a request that waits for a connection, then is answered within timeoutMs, is delivered once at its first attempt, however long the two took together', async () => {
    const target = await startRecordingUpstream((_req, res) => setTimeout(() => res.end('ok'), ANSWER_MS));
    const config = parseConfig({
      gateway: { upstream: { target: 'http://127.0.0.1:1' }, auth: { apiKey: 'k'.repeat(40) } },
      webhooks: {
        enabled: true,
        endpoints: [{ path: '/webhook/m', secret: 's'.repeat(16), action: 'message' }],
        targets: { message: { url: `${target.url}/hook` } },
        delivery: { concurrency: 2, timeoutMs: TIMEOUT_MS, initialBackoffMs: 20, maxBackoffMs: 100 },
      },
    });
    const store = new SqliteEventStore(path.join(mkdtempSync(path.join(tmpdir(), 'gatehouse-timing-')), 'db.sqlite'));
    const ids: string[] = [];
    for (let i = 0; i < 2; i++) {
      const accepted = await store.accept({
        endpoint: '/webhook/m',
        action: 'message',
        receivedAt: Date.now(),
        envelope: (id) => JSON.stringify({ id }),
      });
      ids.push(accepted.id);
    }
    // One socket for two attempts at once: the second waits for the first's answer (a connection pool at its limit).
    const httpAgent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const deliverer = new Deliverer(store, config.webhooks, pino({ level: 'silent' }), Date.now, { httpAgent });
    await deliverer.start();
    try {
      const settled = await waitFor(
        async () => {
          const details = await Promise.all(ids.map((id) => store.get(id)));
          return details.every((d) => d?.event.status === 'delivered') && details;
        },
        { timeoutMs: 30_000, what: 'every event delivered' },
      );
      for (const detail of settled) {
        assert.deepEqual(
          detail!.attempts.map((a) => [a.status, a.error]),
          [[200, null]],
          `${detail!.event.id}: one attempt, answered`,
        );
        assert.ok(detail!.attempts[0]!.durationMs < TIMEOUT_MS, 'the recorded duration is the target’s time');
      }
      const received = target.received.map((r) => (JSON.parse(r.body) as { id: string }).id);
      assert.deepEqual(received.sort(), [...ids].sort(), 'each event reached the target once');
    } finally {
      await deliverer.stop(1_000);
      httpAgent.destroy();
      await store.close();
      await target.close();
    }
  });
});
