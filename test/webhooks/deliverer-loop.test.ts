import assert from 'node:assert/strict';
import http from 'node:http';
import { mkdtempSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import pino from 'pino';
import { parseConfig } from '../../src/config/load.js';
import { Deliverer } from '../../src/webhooks/delivery/deliverer.js';
import { SqliteEventStore, type EventStore } from '../../src/webhooks/store.js';
import { waitFor } from '../helpers/wait.js';

describe('deliverer: no busy loop while due work waits for a slot', () => {
  it('with one action saturated and another idle, the store is polled, not spun on', async () => {
    // A target that holds every request for a while: the 'agent' action's single slot stays busy.
    const held: http.ServerResponse[] = [];
    const target = http.createServer((req, res) => {
      req.resume();
      held.push(res);
    });
    await new Promise<void>((r) => target.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(target.address() as AddressInfo).port}`;
    const config = parseConfig({
      gateway: { upstream: { target: 'http://127.0.0.1:1' }, auth: { apiKey: 'k'.repeat(40) } },
      webhooks: {
        enabled: true,
        endpoints: [
          { path: '/webhook/a', secret: 's'.repeat(16), action: 'agent' },
          { path: '/webhook/m', secret: 's'.repeat(16), action: 'message' },
        ],
        targets: { agent: { url: `${url}/agent` }, message: { url: `${url}/message` } },
        delivery: { concurrency: 1, timeoutMs: 5000 },
      },
    });
    const store = new SqliteEventStore(path.join(mkdtempSync(path.join(tmpdir(), 'gatehouse-loop-')), 'db.sqlite'));
    let calls = 0;
    const counting = new Proxy(store, {
      get(t, prop, receiver) {
        const value = Reflect.get(t, prop, receiver);
        if (prop === 'claimDue' || prop === 'nextDueAt')
          return (...args: unknown[]) => (calls++, (value as (...a: unknown[]) => unknown).apply(t, args));
        return typeof value === 'function' ? value.bind(t) : value;
      },
    }) as EventStore;
    for (let i = 0; i < 3; i++) {
      await store.accept({
        endpoint: '/webhook/a',
        action: 'agent',
        receivedAt: Date.now(),
        envelope: (id) => JSON.stringify({ id }),
      });
    }
    const deliverer = new Deliverer(counting, config.webhooks, pino({ level: 'silent' }));
    await deliverer.start();
    try {
      await waitFor(() => held.length === 1, { what: 'the first event in flight' }); // two are due and waiting
      const before = calls;
      await new Promise((r) => setTimeout(r, 1000)); // the window the call rate is measured over: time is the property
      assert.ok(calls - before < 20, `${calls - before} store calls in 1 s`);
    } finally {
      for (const res of held) res.end();
      await deliverer.stop(1000);
      await store.close();
      target.closeAllConnections();
      target.close();
    }
  });
});
