import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  clientGroup,
  clientGroupOf,
  FailureLockout,
  latestLocks,
  lockoutKey,
  MemoryLockoutStore,
  parseLockoutKey,
  type LockoutAdmission,
  type LockoutSettings,
  type LockoutSlot,
} from '../../src/http/lockout.js';

const settings: LockoutSettings = { max: 3, windowSeconds: 60, lockoutSeconds: 300 };

/** A FailureLockout on a fresh memory store with a clock the test moves by hand. */
function lockoutWithClock(
  options: { settings?: LockoutSettings; store?: MemoryLockoutStore; namespace?: string } = {},
) {
  const clock = { now: 1_700_000_000_000 };
  const store = options.store ?? new MemoryLockoutStore();
  const lockout = new FailureLockout(
    store,
    options.settings ?? settings,
    options.namespace ?? 'gateway',
    () => clock.now,
  );
  return { clock, store, lockout };
}

/** A slot that must be granted at once (synchronously). */
function slotNow(lockout: FailureLockout, ip: string): LockoutSlot {
  const admission = lockout.acquire(ip);
  assert.ok(!(admission instanceof Promise), `${ip}: expected a slot at once, the request had to wait`);
  assert.notEqual(typeof admission, 'number', `${ip}: expected a slot, got refused for ${String(admission)}s`);
  return admission as LockoutSlot;
}

/** One bad credential from `ip`, checked alone: the lockout it set off (seconds, 0 when none). */
function fail(lockout: FailureLockout, ip: string): number {
  return slotNow(lockout, ip).failed();
}

/** Whether a promise has settled, after the microtasks queued so far have run. */
async function settled<T>(promise: Promise<T>): Promise<{ done: true; value: T } | { done: false }> {
  const pending = Symbol('pending');
  const value = await Promise.race([
    promise,
    new Promise<typeof pending>((resolve) => setImmediate(() => resolve(pending))),
  ]);
  return value === pending ? { done: false } : { done: true, value: value as T };
}

describe('failure lockout', () => {
  it('locks a client after max failures inside the window, not before', () => {
    const { clock, lockout } = lockoutWithClock();
    assert.equal(fail(lockout, '198.51.100.7'), 0);
    clock.now += 10_000;
    assert.equal(fail(lockout, '198.51.100.7'), 0);
    assert.equal(lockout.lockedFor('198.51.100.7'), 0);
    clock.now += 10_000;
    assert.equal(fail(lockout, '198.51.100.7'), 300);
    assert.equal(lockout.lockedFor('198.51.100.7'), 300);
    assert.equal(lockout.acquire('198.51.100.7'), 300, 'a locked-out client gets the seconds, not a slot');
  });

  it('does not lock when the failures are spread beyond the window', () => {
    const { clock, lockout } = lockoutWithClock();
    for (let i = 0; i < 10; i++) {
      assert.equal(fail(lockout, '198.51.100.7'), 0, `failure ${i + 1}`);
      clock.now += 30_000; // two failures per 60 s window, max is 3
    }
    assert.equal(lockout.lockedFor('198.51.100.7'), 0);
  });

  it('a failure exactly windowSeconds old has left the window; one just inside still counts', () => {
    const { clock, lockout } = lockoutWithClock();
    fail(lockout, 'a');
    fail(lockout, 'a');
    clock.now += 60_000;
    assert.equal(fail(lockout, 'a'), 0);

    const other = lockoutWithClock();
    fail(other.lockout, 'a');
    fail(other.lockout, 'a');
    other.clock.now += 59_999;
    assert.equal(fail(other.lockout, 'a'), 300);
  });

  it('reports the remaining lockout in whole seconds, rounded up (Retry-After)', () => {
    const { clock, lockout } = lockoutWithClock();
    for (let i = 0; i < 3; i++) fail(lockout, 'a');
    assert.equal(lockout.lockedFor('a'), 300);
    clock.now += 1_500;
    assert.equal(lockout.lockedFor('a'), 299);
    clock.now += 297_501; // 1 ms left
    assert.equal(lockout.lockedFor('a'), 1);
  });

  it('unlocks after lockoutSeconds, with a fresh count', () => {
    const { clock, lockout } = lockoutWithClock();
    for (let i = 0; i < 3; i++) fail(lockout, 'a');
    clock.now += 300_000;
    assert.equal(lockout.lockedFor('a'), 0);
    assert.equal(fail(lockout, 'a'), 0, 'the failures that caused the lockout no longer count');
  });

  it('a slot given back as succeeded counts nothing', () => {
    const { lockout } = lockoutWithClock();
    for (let i = 0; i < 10; i++) slotNow(lockout, 'a').succeeded();
    assert.equal(fail(lockout, 'a'), 0);
    assert.equal(fail(lockout, 'a'), 0);
    assert.equal(fail(lockout, 'a'), 300, 'the third failure locks: the successes did not reset or add to the count');
  });

  it('a slot is given back once: a second succeeded()/failed() is a no-op', () => {
    const { lockout } = lockoutWithClock();
    const slot = slotNow(lockout, 'a');
    assert.equal(slot.failed(), 0);
    assert.equal(slot.failed(), 0);
    slot.succeeded();
    assert.equal(fail(lockout, 'a'), 0, 'only one failure was counted so far');
    assert.equal(fail(lockout, 'a'), 300);
  });

  it('locks clients independently', () => {
    const { lockout } = lockoutWithClock();
    for (let i = 0; i < 3; i++) fail(lockout, '198.51.100.7');
    assert.equal(lockout.lockedFor('198.51.100.7'), 300);
    assert.equal(lockout.lockedFor('198.51.100.8'), 0);
  });

  it('namespaces sharing one store are independent', () => {
    const store = new MemoryLockoutStore();
    const a = lockoutWithClock({ store, namespace: 'gateway' });
    const b = lockoutWithClock({ store, namespace: 'webhooks' });
    for (let i = 0; i < 3; i++) fail(a.lockout, '198.51.100.7');
    assert.equal(a.lockout.lockedFor('198.51.100.7'), 300);
    assert.equal(b.lockout.lockedFor('198.51.100.7'), 0);
    assert.equal(fail(b.lockout, '198.51.100.7'), 0, 'failures in one namespace do not count in the other');
  });

  it('configure(): new limits apply to the counters already kept', () => {
    const { lockout } = lockoutWithClock();
    fail(lockout, 'a');
    lockout.configure({ max: 2, windowSeconds: 60, lockoutSeconds: 5 });
    assert.equal(fail(lockout, 'a'), 5);
    assert.equal(lockout.lockedFor('a'), 5);
  });

  it('configure(): a lowered max refuses a client already past it until its window frees up, without waiting forever', () => {
    const { clock, lockout } = lockoutWithClock({ settings: { max: 10, windowSeconds: 60, lockoutSeconds: 300 } });
    for (let i = 0; i < 5; i++) fail(lockout, 'a');
    lockout.configure({ max: 3, windowSeconds: 60, lockoutSeconds: 300 });
    assert.equal(lockout.acquire('a'), 60, 'refused (not made to wait) while 3 of its failures are in the window');
    clock.now += 60_000;
    assert.equal(fail(lockout, 'a'), 0, 'a fresh window');
  });
});

describe('failure lockout: concurrent checks of one client (slots)', () => {
  it('at most max credentials are checked at once; when they fail, every waiting request gets the lockout', async () => {
    const { lockout } = lockoutWithClock();
    const admissions = Array.from({ length: 600 }, () => lockout.acquire('203.0.113.5'));
    const slots = admissions.filter((a): a is LockoutSlot => typeof a === 'object' && !(a instanceof Promise));
    const waiting = admissions.filter((a): a is Promise<LockoutAdmission> => a instanceof Promise);
    assert.equal(slots.length, 3, 'max slots at once');
    assert.equal(waiting.length, 597, 'the rest wait; none is refused for concurrency alone');
    assert.equal((await settled(waiting[0]!)).done, false);
    assert.equal(slots[0]!.failed(), 0);
    assert.equal(slots[1]!.failed(), 0);
    assert.equal((await settled(waiting[0]!)).done, false, 'failures in the window plus slots out still reach max');
    assert.equal(slots[2]!.failed(), 300);
    assert.deepEqual(new Set(await Promise.all(waiting)), new Set([300]), 'every waiter gets the lockout, none a slot');
    assert.equal(lockout.lockedFor('203.0.113.5'), 300);
  });

  it('failures already in the window leave room for fewer concurrent checks', () => {
    const { lockout } = lockoutWithClock();
    fail(lockout, 'a');
    fail(lockout, 'a');
    const first = lockout.acquire('a');
    assert.ok(!(first instanceof Promise) && typeof first === 'object');
    assert.ok(lockout.acquire('a') instanceof Promise, 'one failure left in the window: one check at a time');
  });

  it('a slot given back as succeeded lets the next waiter in, first come first served', async () => {
    const { lockout } = lockoutWithClock({ settings: { max: 2, windowSeconds: 60, lockoutSeconds: 300 } });
    const a = slotNow(lockout, 'c');
    const b = slotNow(lockout, 'c');
    const order: string[] = [];
    const w1 = (lockout.acquire('c') as Promise<LockoutAdmission>).then((s) => (order.push('w1'), s));
    const w2 = (lockout.acquire('c') as Promise<LockoutAdmission>).then((s) => (order.push('w2'), s));
    a.succeeded();
    const s1 = await w1;
    assert.equal(typeof s1, 'object', 'the first waiter gets a slot');
    assert.equal((await settled(w2)).done, false, 'still two slots out');
    b.succeeded();
    const s2 = await w2;
    assert.deepEqual(order, ['w1', 'w2']);
    (s1 as LockoutSlot).succeeded();
    (s2 as LockoutSlot).succeeded();
    // Nothing in flight, nothing waiting: the next request is granted at once.
    slotNow(lockout, 'c').succeeded();
  });

  it('a new request does not overtake those already waiting', async () => {
    const { lockout } = lockoutWithClock({ settings: { max: 1, windowSeconds: 60, lockoutSeconds: 300 } });
    const a = slotNow(lockout, 'd');
    const waiter = lockout.acquire('d') as Promise<LockoutAdmission>;
    a.succeeded(); // the waiter is granted the slot synchronously here
    assert.ok(lockout.acquire('d') instanceof Promise, 'the slot went to the waiter, the newcomer queues');
    ((await waiter) as LockoutSlot).succeeded();
  });

  it("a waiter re-checks when woken: a lock that arrived meanwhile (another process's verdict) refuses it", async () => {
    const store = new MemoryLockoutStore();
    const { clock, lockout } = lockoutWithClock({
      store,
      settings: { max: 1, windowSeconds: 60, lockoutSeconds: 300 },
    });
    const a = slotNow(lockout, '192.0.2.1');
    const waiter = lockout.acquire('192.0.2.1') as Promise<LockoutAdmission>;
    store.lockUntil('gateway:192.0.2.1', clock.now + 42_000, clock.now);
    a.succeeded();
    assert.equal(await waiter, 42);
  });

  it("other clients are not held up by a client's waiting requests", () => {
    const { lockout } = lockoutWithClock({ settings: { max: 1, windowSeconds: 60, lockoutSeconds: 300 } });
    slotNow(lockout, 'e');
    assert.ok(lockout.acquire('e') instanceof Promise);
    slotNow(lockout, 'f').succeeded();
  });
});

describe('failure lockout: the memory store at capacity', () => {
  const sprayed = (i: number) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;

  it('a failure from a new address is cheap when the counter table is full (no scan of the table)', () => {
    const maxCounters = 100_000;
    const store = new MemoryLockoutStore({ maxCounters });
    const spread: LockoutSettings = { max: 10, windowSeconds: 3600, lockoutSeconds: 300 };
    const now = 1_700_000_000_000;
    for (let i = 0; i < maxCounters; i++) store.recordFailure(`fill:${sprayed(i)}`, now, spread);
    assert.equal(store.size.counters, maxCounters);
    // Each of these evicts one counter. A scan of the table per failure (the old eviction) took
    // ~3.5 ms each here, i.e. ~7 s for 2,000; O(1) bookkeeping takes a few ms in all.
    const started = performance.now();
    for (let i = 0; i < 2_000; i++) store.recordFailure(`new:${sprayed(i)}`, now + 1, spread);
    const ms = performance.now() - started;
    assert.ok(ms < 1_000, `2,000 failures from new addresses at capacity took ${Math.round(ms)} ms`);
    assert.equal(store.size.counters, maxCounters, 'the table stays at its bound');
  });

  it('a lock survives a spray of new addresses twice the size of the counter table', () => {
    // Twice maxCounters: every counter, the locked client's included, is evicted in turn. The
    // table's size does not matter to the property (the cost of eviction at size is the test above).
    const store = new MemoryLockoutStore({ maxCounters: 1_000 });
    const { clock, lockout } = lockoutWithClock({ store });
    for (let i = 0; i < 3; i++) fail(lockout, '198.51.100.66');
    assert.equal(lockout.lockedFor('198.51.100.66'), 300);
    for (let i = 0; i < 2_000; i++) {
      fail(lockout, sprayed(i));
      if (i % 10 === 0) clock.now += 100; // 20 s of spraying
    }
    assert.equal(store.size.counters, 1_000);
    assert.equal(lockout.lockedFor('198.51.100.66'), 280, 'still locked, for what is left of its 300 s');
  });

  it('the counter table stays within maxCounters under an address-spraying attack; the newest are kept', () => {
    const { lockout, store } = lockoutWithClock({ store: new MemoryLockoutStore({ maxCounters: 4 }) });
    const clients = Array.from({ length: 50 }, (_, i) => `198.51.100.${i}`);
    for (const ip of clients) assert.equal(fail(lockout, ip), 0);
    assert.equal(store.size.counters, 4);
    // The newest client's failure still counts: two more lock it.
    fail(lockout, clients.at(-1)!);
    assert.equal(fail(lockout, clients.at(-1)!), 300);
  });

  it('past maxCounters the least recently failing counter goes; a counter that fails again moves to the end', () => {
    const { clock, lockout, store } = lockoutWithClock({ store: new MemoryLockoutStore({ maxCounters: 3 }) });
    fail(lockout, 'busy');
    fail(lockout, 'other');
    clock.now += 1;
    fail(lockout, 'busy'); // now the most recent: 'other' is at the head
    fail(lockout, 'x');
    fail(lockout, 'y'); // the table is full: 'other' is dropped
    assert.equal(store.size.counters, 3);
    assert.equal(fail(lockout, 'busy'), 300, 'busy kept its two failures: the third locks');
    assert.equal(fail(lockout, 'other'), 0);
    assert.equal(fail(lockout, 'other'), 0, 'other starts afresh (with its old two it would be locked now)');
  });

  it('counters whose failures have left the window are swept as new ones come', () => {
    const { clock, lockout, store } = lockoutWithClock();
    fail(lockout, 'old');
    fail(lockout, 'old-too');
    clock.now += 61_000;
    fail(lockout, 'new');
    assert.equal(store.size.counters, 1);
  });

  it('locks are never dropped before they expire; past maxLocks, a client at max is refused for its window instead', () => {
    const store = new MemoryLockoutStore({ maxLocks: 2 });
    const { clock, lockout } = lockoutWithClock({
      store,
      settings: { max: 1, windowSeconds: 60, lockoutSeconds: 300 },
    });
    assert.equal(fail(lockout, 'a'), 300);
    assert.equal(fail(lockout, 'b'), 300);
    assert.equal(fail(lockout, 'c'), 0, 'the lock table is full of locks in force: no lock for c');
    assert.equal(lockout.lockedFor('a'), 300, 'a keeps its lock');
    assert.equal(lockout.lockedFor('b'), 300);
    assert.equal(lockout.lockedFor('c'), 60, 'c is refused until its failure leaves the window');
    assert.equal(lockout.acquire('c'), 60);
    clock.now += 60_000;
    assert.equal(lockout.lockedFor('c'), 0);
    clock.now += 240_000; // a and b expire
    assert.equal(fail(lockout, 'c'), 300, 'expired locks are swept to make room');
    assert.equal(lockout.lockedFor('a'), 0);
  });

  it("activeLocks and lockUntil: the locks in force, and another process's verdict", () => {
    const store = new MemoryLockoutStore();
    const { clock, lockout } = lockoutWithClock({
      store,
      settings: { max: 1, windowSeconds: 60, lockoutSeconds: 300 },
    });
    fail(lockout, 'a');
    store.lockUntil('gateway:b', clock.now + 10_000, clock.now);
    store.lockUntil('gateway:a', clock.now + 1_000, clock.now); // an earlier end never shortens a lock
    assert.deepEqual(store.activeLocks(clock.now), [
      ['gateway:a', clock.now + 300_000],
      ['gateway:b', clock.now + 10_000],
    ]);
    assert.equal(lockout.lockedFor('b'), 10);
    clock.now += 10_000;
    assert.deepEqual(
      store.activeLocks(clock.now).map(([key]) => key),
      ['gateway:a'],
    );
  });
});

describe("lockout: an operator's lift (the admin API)", () => {
  it('unlock ends the lock and forgets the count; lift reports only the locks that were in force', async () => {
    const store = new MemoryLockoutStore();
    const { clock, lockout } = lockoutWithClock({ store });
    for (let i = 0; i < settings.max; i++) fail(lockout, '192.0.2.1');
    fail(lockout, '192.0.2.2'); // one failure, no lock
    assert.ok(lockout.lockedFor('192.0.2.1') > 0);
    assert.deepEqual(await store.lift(['gateway:192.0.2.1', 'gateway:192.0.2.2', 'webhooks:192.0.2.1'], clock.now), [
      ['gateway:192.0.2.1', clock.now + 300_000],
    ]);
    assert.equal(lockout.lockedFor('192.0.2.1'), 0);
    // Counted afresh: max - 1 more failures lock neither client (192.0.2.2's earlier one is forgotten too).
    for (let i = 0; i < settings.max - 1; i++) fail(lockout, '192.0.2.1');
    for (let i = 0; i < settings.max - 1; i++) fail(lockout, '192.0.2.2');
    assert.equal(lockout.lockedFor('192.0.2.1'), 0);
    assert.equal(lockout.lockedFor('192.0.2.2'), 0);
    assert.deepEqual(await store.lift(['gateway:192.0.2.1'], clock.now), [], 'nothing in force: nothing lifted');
  });

  it('clientGroupOf: an address or an IPv6 /64, as the store keys it; anything else is refused', () => {
    assert.equal(clientGroupOf('192.0.2.1'), '192.0.2.1');
    assert.equal(clientGroupOf('::ffff:192.0.2.1'), '192.0.2.1');
    assert.equal(clientGroupOf('2001:DB8::1'), '2001:db8:0:0::/64');
    assert.equal(clientGroupOf('2001:db8:0:0::/64'), '2001:db8:0:0::/64');
    assert.equal(clientGroupOf('2001:db8::/64'), '2001:db8:0:0::/64');
    assert.equal(clientGroupOf(clientGroup('2001:db8:1:2:3:4:5:6')), clientGroup('2001:db8:1:2::9'));
    for (const text of ['', 'localhost', '192.0.2.1/64', '192.0.2.0/24', '2001:db8::/48', 'fe80::1%eth0', '1.2.3'])
      assert.equal(clientGroupOf(text), undefined, text);
  });

  it('lockoutKey and parseLockoutKey: the area, then the client (which may hold colons)', () => {
    assert.equal(lockoutKey('gateway', '2001:db8:0:0::/64'), 'gateway:2001:db8:0:0::/64');
    assert.deepEqual(parseLockoutKey('webhooks:2001:db8:0:0::/64'), { area: 'webhooks', client: '2001:db8:0:0::/64' });
    assert.deepEqual(
      latestLocks([
        ['a', 1],
        ['b', 5],
        ['a', 3],
      ]),
      [
        ['a', 3],
        ['b', 5],
      ],
    );
  });
});

describe('lockout: IPv6 clients are counted per /64', () => {
  it('failures from addresses of one /64 add up; another /64 is unaffected; IPv4 stays per address', () => {
    const store = new MemoryLockoutStore();
    const lockout = new FailureLockout(
      store,
      { max: 2, windowSeconds: 60, lockoutSeconds: 60 },
      'test',
      () => 1_000_000,
    );
    fail(lockout, '2001:db8:1:2::1');
    fail(lockout, '2001:db8:1:2:ffff::9');
    assert.ok(lockout.lockedFor('2001:db8:1:2::abcd') > 0);
    assert.equal(lockout.lockedFor('2001:db8:1:3::1'), 0);
    fail(lockout, '10.0.0.1');
    fail(lockout, '10.0.0.2');
    assert.equal(lockout.lockedFor('10.0.0.1'), 0);
  });

  it('concurrent checks from addresses of one /64 share its slots', () => {
    const lockout = new FailureLockout(
      new MemoryLockoutStore(),
      { max: 1, windowSeconds: 60, lockoutSeconds: 60 },
      'test',
      () => 1_000_000,
    );
    slotNow(lockout, '2001:db8:1:2::1');
    assert.ok(lockout.acquire('2001:db8:1:2::2') instanceof Promise);
  });
});
