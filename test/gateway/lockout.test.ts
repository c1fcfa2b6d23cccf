import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { FailureLockout, MemoryLockoutStore, type LockoutSettings } from '../../src/gateway/lockout.js';

const settings: LockoutSettings = { max: 3, windowSeconds: 60, lockoutSeconds: 300 };

/** A FailureLockout on a fresh memory store with a clock the test moves by hand. */
function lockoutWithClock(options: { settings?: LockoutSettings; store?: MemoryLockoutStore; namespace?: string } = {}) {
  const clock = { now: 1_700_000_000_000 };
  const store = options.store ?? new MemoryLockoutStore();
  const lockout = new FailureLockout(store, options.settings ?? settings, options.namespace ?? 'gateway', () => clock.now);
  return { clock, store, lockout };
}

describe('failure lockout', () => {
  it('locks a client after max failures inside the window, not before', async () => {
    const { clock, lockout } = lockoutWithClock();
    assert.equal(await lockout.recordFailure('198.51.100.7'), 0);
    clock.now += 10_000;
    assert.equal(await lockout.recordFailure('198.51.100.7'), 0);
    assert.equal(await lockout.lockedFor('198.51.100.7'), 0);
    clock.now += 10_000;
    assert.equal(await lockout.recordFailure('198.51.100.7'), 300);
    assert.equal(await lockout.lockedFor('198.51.100.7'), 300);
  });

  it('does not lock when the failures are spread beyond the window', async () => {
    const { clock, lockout } = lockoutWithClock();
    for (let i = 0; i < 10; i++) {
      assert.equal(await lockout.recordFailure('198.51.100.7'), 0, `failure ${i + 1}`);
      clock.now += 30_000; // two failures per 60 s window, max is 3
    }
    assert.equal(await lockout.lockedFor('198.51.100.7'), 0);
  });

  it('a failure exactly windowSeconds old has left the window; one just inside still counts', async () => {
    const { clock, lockout } = lockoutWithClock();
    await lockout.recordFailure('a');
    await lockout.recordFailure('a');
    clock.now += 60_000;
    assert.equal(await lockout.recordFailure('a'), 0);

    const other = lockoutWithClock();
    await other.lockout.recordFailure('a');
    await other.lockout.recordFailure('a');
    other.clock.now += 59_999;
    assert.equal(await other.lockout.recordFailure('a'), 300);
  });

  it('reports the remaining lockout in whole seconds, rounded up (Retry-After)', async () => {
    const { clock, lockout } = lockoutWithClock();
    for (let i = 0; i < 3; i++) await lockout.recordFailure('a');
    assert.equal(await lockout.lockedFor('a'), 300);
    clock.now += 1_500;
    assert.equal(await lockout.lockedFor('a'), 299);
    clock.now += 297_501; // 1 ms left
    assert.equal(await lockout.lockedFor('a'), 1);
  });

  it('unlocks after lockoutSeconds, with a fresh count', async () => {
    const { clock, lockout } = lockoutWithClock();
    for (let i = 0; i < 3; i++) await lockout.recordFailure('a');
    clock.now += 300_000;
    assert.equal(await lockout.lockedFor('a'), 0);
    assert.equal(await lockout.recordFailure('a'), 0, 'the failures that caused the lockout no longer count');
  });

  it('locks clients independently', async () => {
    const { lockout } = lockoutWithClock();
    for (let i = 0; i < 3; i++) await lockout.recordFailure('198.51.100.7');
    assert.equal(await lockout.lockedFor('198.51.100.7'), 300);
    assert.equal(await lockout.lockedFor('198.51.100.8'), 0);
  });

  it('namespaces sharing one store are independent', async () => {
    const store = new MemoryLockoutStore();
    const a = lockoutWithClock({ store, namespace: 'gateway' });
    const b = lockoutWithClock({ store, namespace: 'webhooks' });
    for (let i = 0; i < 3; i++) await a.lockout.recordFailure('198.51.100.7');
    assert.equal(await a.lockout.lockedFor('198.51.100.7'), 300);
    assert.equal(await b.lockout.lockedFor('198.51.100.7'), 0);
    assert.equal(await b.lockout.recordFailure('198.51.100.7'), 0, 'failures in one namespace do not count in the other');
  });

  it('configure(): new limits apply to the counters already kept', async () => {
    const { lockout } = lockoutWithClock();
    await lockout.recordFailure('a');
    lockout.configure({ max: 2, windowSeconds: 60, lockoutSeconds: 5 });
    assert.equal(await lockout.recordFailure('a'), 5);
    assert.equal(await lockout.lockedFor('a'), 5);
  });

  it('the memory store stays within maxEntries under an address-spraying attack', async () => {
    const maxEntries = 4;
    const { lockout } = lockoutWithClock({ store: new MemoryLockoutStore(maxEntries), settings: { max: 1, windowSeconds: 60, lockoutSeconds: 300 } });
    const clients = Array.from({ length: 50 }, (_, i) => `198.51.100.${i}`);
    // With max 1 every failure locks, so "locked" means "still has an entry".
    for (const ip of clients) assert.equal(await lockout.recordFailure(ip), 300);
    let kept = 0;
    for (const ip of clients) if ((await lockout.lockedFor(ip)) > 0) kept++;
    assert.ok(kept <= maxEntries, `${kept} entries kept, bound is ${maxEntries}`);
    assert.ok(kept > 0);
    assert.ok((await lockout.lockedFor(clients.at(-1)!)) > 0, 'the newest client is kept');
  });

  it('when full, stale entries are swept before any live one is dropped', async () => {
    const { clock, lockout } = lockoutWithClock({ store: new MemoryLockoutStore(2) });
    for (let i = 0; i < 3; i++) await lockout.recordFailure('locked'); // oldest entry, still locked
    await lockout.recordFailure('stale'); // newer entry, but its one failure will leave the window
    clock.now += 61_000;
    await lockout.recordFailure('newcomer');
    // Dropping the oldest entry would have freed the locked client; sweeping removes "stale" instead.
    assert.equal(await lockout.lockedFor('locked'), 239);
    assert.equal(await lockout.lockedFor('newcomer'), 0);
  });
});

describe('lockout: IPv6 clients are counted per /64', () => {
  it('failures from addresses of one /64 add up; another /64 is unaffected; IPv4 stays per address', async () => {
    const store = new MemoryLockoutStore();
    const lockout = new FailureLockout(store, { max: 2, windowSeconds: 60, lockoutSeconds: 60 }, 'test', () => 1_000_000);
    await lockout.recordFailure('2001:db8:1:2::1');
    await lockout.recordFailure('2001:db8:1:2:ffff::9');
    assert.ok((await lockout.lockedFor('2001:db8:1:2::abcd')) > 0);
    assert.equal(await lockout.lockedFor('2001:db8:1:3::1'), 0);
    await lockout.recordFailure('10.0.0.1');
    await lockout.recordFailure('10.0.0.2');
    assert.equal(await lockout.lockedFor('10.0.0.1'), 0);
  });
});
