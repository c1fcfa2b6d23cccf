import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { StoredEvent } from '../../src/storage/contracts/events.js';
import { HandOverQueue } from '../../src/storage/hand-over-queue.js';

// The local hand-over queue both drivers keep (src/storage/hand-over-queue.ts): its bounds, claim
// order, and the two ways an event leaves it besides a take (forgotten; its lane dropped).

const event = (
  id: string,
  nextAttemptAt: number,
  bytes = 10,
  action: StoredEvent['action'] = 'message',
): StoredEvent => ({
  id,
  endpoint: 'e',
  action,
  idempotencyKey: null,
  receivedAt: nextAttemptAt,
  envelope: 'x'.repeat(bytes),
  status: 'queued',
  attempts: 0,
  roundAttempts: 0,
  nextAttemptAt,
  lastError: null,
  deliveredAt: null,
});
const ids = (events: readonly StoredEvent[]) => events.map((e) => e.id);

describe('hand-over queue', () => {
  it('fits events within both bounds, counting what it holds', () => {
    const queue = new HandOverQueue<StoredEvent>({ maxEvents: 2, maxBytes: 25 });
    assert.ok(queue.fits(25));
    assert.ok(!queue.fits(26));
    queue.push(event('a', 1));
    assert.ok(queue.fits(15));
    assert.ok(!queue.fits(16));
    queue.push(event('b', 1));
    assert.equal(queue.size, 2);
    assert.equal(queue.bytes, 20);
    assert.ok(!queue.fits(1), 'full in events');
  });

  it('takes due events oldest first, up to the limit; one not due yet keeps its place', () => {
    const queue = new HandOverQueue<StoredEvent>({ maxEvents: 10, maxBytes: 1_000 });
    for (const [id, at] of [
      ['a', 1],
      ['later', 50],
      ['b', 2],
      ['c', 3],
    ] as const)
      queue.push(event(id, at));
    assert.deepEqual(ids(queue.take('message', 10, 2)), ['a', 'b']);
    assert.deepEqual(ids(queue.lane('message')!), ['later', 'c']);
    assert.deepEqual(ids(queue.take('message', 10, 5)), ['c']);
    assert.deepEqual(ids(queue.take('message', 60, 5)), ['later']);
    assert.equal(queue.size, 0);
    assert.equal(queue.bytes, 0);
    assert.deepEqual(queue.take('agent', 60, 5), []);
  });

  it('a forgotten event is no longer held, is skipped by the next take, and its bytes go when the take passes it', () => {
    const queue = new HandOverQueue<StoredEvent>({ maxEvents: 10, maxBytes: 1_000 });
    queue.push(event('a', 1));
    queue.push(event('b', 2));
    queue.forget('a');
    assert.ok(!queue.has('a'));
    assert.equal(queue.size, 1);
    assert.equal(queue.bytes, 20);
    assert.deepEqual(ids(queue.take('message', 10, 1)), ['b']);
    assert.equal(queue.bytes, 0);
  });

  it('inserts in claim order (due time, then id), and says how far ahead a claim elsewhere may look', () => {
    const queue = new HandOverQueue<StoredEvent>({ maxEvents: 10, maxBytes: 1_000 });
    queue.push(event('b', 5));
    queue.push(event('d', 9));
    queue.insertInDueOrder(event('a', 5));
    queue.insertInDueOrder(event('c', 5));
    queue.insertInDueOrder(event('z', 1));
    assert.deepEqual(ids(queue.lane('message')!), ['z', 'a', 'b', 'c', 'd']);
    assert.equal(queue.dueBefore('message', 10, 2), 4, 'just before the second due event');
    assert.equal(queue.dueBefore('message', 10, 9), 10, 'fewer due than the limit: now');
  });

  it('drop and clear return what was still to hand out; putBack into a dropped lane is ignored', () => {
    const queue = new HandOverQueue<StoredEvent>({ maxEvents: 10, maxBytes: 1_000 });
    queue.push(event('a', 1));
    queue.push(event('b', 2));
    queue.push(event('x', 1, 10, 'agent'));
    const lane = queue.lane('message')!;
    const taken = queue.take('message', 10, 1);
    queue.putBack(lane, taken);
    assert.deepEqual(ids(queue.lane('message')!), ['a', 'b']);
    assert.equal(queue.size, 3);
    const again = queue.take('message', 10, 1);
    queue.forget('b');
    assert.deepEqual(ids(queue.drop('message')), []);
    queue.putBack(lane, again);
    assert.equal(queue.lane('message'), undefined);
    assert.deepEqual(ids(queue.clear()), ['x']);
    assert.equal(queue.size, 0);
    assert.equal(queue.bytes, 0);
  });
});
