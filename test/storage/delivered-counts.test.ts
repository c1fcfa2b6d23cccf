import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { WebhookAction } from '../../src/config/schema.js';
import { DELIVERED_RECOUNT_MS, DeliveredCounts } from '../../src/storage/events.js';

/** A recount whose answers the test gives one by one (a Map, or an Error to fail with). */
function scriptedRecount() {
  const calls: ((answer: Map<WebhookAction, number> | Error) => void)[] = [];
  const recount = () => new Promise<Map<WebhookAction, number>>((resolve, reject) => {
    calls.push((answer) => (answer instanceof Error ? reject(answer) : resolve(answer)));
  });
  return { recount, calls };
}
const settle = () => new Promise((r) => setImmediate(r));
const counted = (n: number) => new Map<WebhookAction, number>([['message', n]]);

describe('DeliveredCounts (the delivered counts of /metrics)', () => {
  it('the first call waits; later ones get the last count and start a recount only once it is DELIVERED_RECOUNT_MS old', async () => {
    const { recount, calls } = scriptedRecount();
    const counts = new DeliveredCounts(recount);
    const first = counts.get(0);
    const alsoFirst = counts.get(1);
    assert.equal(calls.length, 1, 'calls meanwhile share the count under way');
    calls[0]!(counted(1));
    assert.deepEqual([await first, await alsoFirst], [counted(1), counted(1)]);
    assert.deepEqual(await counts.get(DELIVERED_RECOUNT_MS - 1), counted(1));
    assert.equal(calls.length, 1);
    assert.deepEqual(await counts.get(DELIVERED_RECOUNT_MS), counted(1), 'the last count, while the recount runs');
    assert.equal(calls.length, 2);
    calls[1]!(counted(2));
    await settle();
    assert.deepEqual(await counts.get(DELIVERED_RECOUNT_MS + 1), counted(2));
  });

  it('a failed recount is reported, the last count kept, and tried again a full interval later, not at every call', async () => {
    const { recount, calls } = scriptedRecount();
    const errors: unknown[] = [];
    const counts = new DeliveredCounts(recount, (err) => errors.push(err));
    const first = counts.get(0);
    calls[0]!(new Error('statement timeout'));
    await assert.rejects(first, /statement timeout/);
    const second = counts.get(1); // nothing counted yet: waits for a new count
    calls[1]!(counted(5));
    assert.deepEqual(await second, counted(5));
    assert.deepEqual(await counts.get(1 + DELIVERED_RECOUNT_MS), counted(5));
    calls[2]!(new Error('connection lost'));
    await settle();
    assert.deepEqual(errors.map((e) => (e as Error).message), ['statement timeout', 'connection lost']);
    assert.deepEqual(await counts.get(2 + DELIVERED_RECOUNT_MS), counted(5), 'the last count stands');
    assert.equal(calls.length, 3, 'no retry at once after a failure');
    await counts.get(1 + 2 * DELIVERED_RECOUNT_MS);
    assert.equal(calls.length, 4, 'retried an interval later');
  });

  it('a clock that went back starts a recount (the age of the last count is unknown)', async () => {
    const { recount, calls } = scriptedRecount();
    const counts = new DeliveredCounts(recount);
    const first = counts.get(1_000_000);
    calls[0]!(counted(1));
    await first;
    await counts.get(1_000_000 - 3_600_000);
    assert.equal(calls.length, 2);
  });
});
