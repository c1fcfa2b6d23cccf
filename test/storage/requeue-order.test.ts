import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  requeueInChunks,
  type DeliveryStatus,
  type EventPageKey,
  type RequeueSteps,
} from '../../src/storage/contracts/events.js';

/**
 * requeueInChunks against an in-memory queue whose deliverer is instant: what a step requeues is
 * delivered before the next step runs (the race an outside attack hit with 2,500 events).
 */
function instantQueue(initial: Record<string, DeliveryStatus>) {
  const status = new Map(Object.entries(initial));
  const sent = new Map<string, number>();
  const keyOf = (id: string): EventPageKey => ({ receivedAt: Number(id.slice(1)), id });
  const steps: RequeueSteps = {
    async matchingKeys(_filter, statuses, after, limit) {
      return [...status.entries()]
        .filter(([, s]) => statuses.includes(s))
        .map(([id]) => keyOf(id))
        .sort((a, b) => b.receivedAt - a.receivedAt)
        .filter((k) => after === undefined || k.receivedAt < after.receivedAt)
        .slice(0, limit);
    },
    async requeueIds(ids, _now, includeDelivered) {
      let changed = 0;
      for (const id of ids) {
        const s = status.get(id);
        if (s === 'dead' || (s === 'delivered' && includeDelivered)) {
          changed++;
          sent.set(id, (sent.get(id) ?? 0) + 1);
          status.set(id, 'delivered'); // delivered before the walk's next step
        }
      }
      return changed;
    },
  };
  return { steps, sent };
}

describe('requeueInChunks: a filter retry sends each event once, however fast the deliverer', () => {
  it('includeDelivered: the dead ones requeued and delivered meanwhile are not found again among the delivered', async () => {
    const initial: Record<string, DeliveryStatus> = {};
    for (let i = 1; i <= 50; i++) initial[`e${i}`] = i % 2 === 0 ? 'dead' : 'delivered';
    const { steps, sent } = instantQueue(initial);
    const requeued = await requeueInChunks({ filter: {} }, Date.now(), { includeDelivered: true, chunk: 7 }, steps);
    assert.equal(requeued, 50);
    assert.deepEqual(
      [...sent.values()].filter((n) => n !== 1),
      [],
      'an event was sent more than once',
    );
    assert.equal(sent.size, 50);
  });
});
