import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, it } from 'node:test';
import type { ChannelGrant, ChannelStore } from '../../src/storage/contracts/channels.js';
import type { EventStore, NewEvent } from '../../src/storage/contracts/events.js';
import { SEEN_RETENTION_MS, type GmailStore } from '../../src/storage/contracts/gmail.js';
import { waitFor } from '../helpers/wait.js';

/**
 * The GmailStore and ChannelStore contracts: the same cases run against every driver
 * (state-stores.test.ts: a real SQLite file, a real PostgreSQL database). `other()` is another
 * instance on the same storage (its own connection or pool), as another process has. The cases
 * marked "instances" hold only where several servers may share the storage (Postgres): SQLite
 * is one server per file.
 */
export interface StateHarness {
  driver: 'sqlite' | 'postgres';
  /** Whether several servers may share this storage (then the cross-instance cases run). */
  sharedByInstances: boolean;
  /** A new, empty storage for one test: its event store, Gmail store and channel store. */
  open(): Promise<StateInstance>;
  /** Another instance on the same storage. */
  other(): Promise<StateInstance>;
  /** Moves every remembered Gmail id's `seen_at` back by `ms` (what time would do). */
  ageSeenIds(ms: number): Promise<void>;
  /** Shared storage only: ends the database sessions holding advisory locks (an instance killed while holding one). */
  endLockHolders(): Promise<void>;
  /** After each test: close what it opened, drop its data. */
  reset(): Promise<void>;
}

export interface StateInstance {
  events: EventStore;
  gmail: GmailStore;
  channels: ChannelStore;
  close(): Promise<void>;
}

const T0 = Date.UTC(2024, 0, 15, 12, 0, 0);
const ACCOUNT = 'alice@example.com';
const ENDPOINT = `gmail:${ACCOUNT}`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function email(
  messageId: string,
  envelope: (id: string) => string = (id) => JSON.stringify({ id, messageId }),
): { messageId: string; event: NewEvent } {
  return {
    messageId,
    event: { endpoint: ENDPOINT, action: 'message', idempotencyKey: messageId, receivedAt: T0, envelope },
  };
}

export function stateContract(harness: StateHarness): void {
  let one: StateInstance;
  const opened: StateInstance[] = [];
  const other = async () => {
    const instance = await harness.other();
    opened.push(instance);
    return instance;
  };

  beforeEach(async () => {
    one = await harness.open();
  });
  afterEach(async () => {
    for (const instance of opened.splice(0)) await instance.close().catch(() => {});
    await one.close().catch(() => {});
    await harness.reset();
  });

  describe('GmailStore', () => {
    it('keeps the grant and project; a new grant keeps the cursor and counters', async () => {
      const { gmail } = one;
      assert.equal(await gmail.get(ACCOUNT), undefined);
      await gmail.saveGrant(ACCOUNT, 'client-1', 'sealed-1', 'project-1');
      assert.deepEqual(await gmail.get(ACCOUNT), {
        account: ACCOUNT,
        clientId: 'client-1',
        project: 'project-1',
        sealedGrant: 'sealed-1',
        cursor: null,
        cursorAt: null,
        watchExpiration: null,
        watchRenewedAt: null,
        lastNotificationAt: null,
        lastError: null,
        lastErrorAt: null,
        emailsEnqueued: 0,
      });
      await gmail.recordWatch(ACCOUNT, '100', T0 + 7 * 86_400_000, T0);
      await gmail.commitEmails(ACCOUNT, [email('m-1')], '110', T0 + 1);
      await gmail.saveGrant(ACCOUNT, 'client-2', 'sealed-2', 'project-2');
      await gmail.saveProject(ACCOUNT, 'project-3');
      const after = (await (await other()).gmail.get(ACCOUNT))!;
      assert.deepEqual(
        [after.clientId, after.sealedGrant, after.project, after.cursor, after.emailsEnqueued],
        ['client-2', 'sealed-2', 'project-3', '110', 1],
      );
    });

    it('sealed grants (storage reseal): listed per account; replaced in one go, each only while it still holds what was read', async () => {
      const { gmail } = one;
      await gmail.saveGrant(ACCOUNT, 'client-1', 'sealed-old-a', 'p');
      await gmail.saveGrant('bob@example.com', 'client-1', 'sealed-old-b', 'p');
      assert.deepEqual(await gmail.sealedGrants(), [
        { account: ACCOUNT, sealed: 'sealed-old-a' },
        { account: 'bob@example.com', sealed: 'sealed-old-b' },
      ]);
      // Bob's grant is stored anew (a setup) after it was read: that one is left as it now is.
      await (await other()).gmail.saveGrant('bob@example.com', 'client-1', 'sealed-by-setup', 'p');
      const replaced = await gmail.replaceSealedGrants([
        { key: ACCOUNT, from: 'sealed-old-a', to: 'sealed-new-a' },
        { key: 'bob@example.com', from: 'sealed-old-b', to: 'sealed-new-b' },
        { key: 'nobody@example.com', from: 'x', to: 'y' },
      ]);
      assert.equal(replaced, 1);
      assert.deepEqual(await (await other()).gmail.sealedGrants(), [
        { account: ACCOUNT, sealed: 'sealed-new-a' },
        { account: 'bob@example.com', sealed: 'sealed-by-setup' },
      ]);
      assert.equal((await gmail.get(ACCOUNT))!.clientId, 'client-1', 'nothing else of the row changes');
      assert.equal(await gmail.replaceSealedGrants([]), 0);
    });

    it('a watch sets the cursor only when there is none, and clears the last error', async () => {
      const { gmail } = one;
      await gmail.saveGrant(ACCOUNT, 'c', 's', 'p');
      await gmail.recordError(ACCOUNT, 'watch renewal failed', T0);
      assert.deepEqual(
        [(await gmail.get(ACCOUNT))!.lastError, (await gmail.get(ACCOUNT))!.lastErrorAt],
        ['watch renewal failed', T0],
      );
      await gmail.recordWatch(ACCOUNT, '500', T0 + 1000, T0 + 1);
      await gmail.recordWatch(ACCOUNT, '900', T0 + 2000, T0 + 2);
      const state = (await gmail.get(ACCOUNT))!;
      assert.deepEqual(
        [state.cursor, state.cursorAt, state.watchExpiration, state.watchRenewedAt, state.lastError, state.lastErrorAt],
        ['500', T0 + 1, T0 + 2000, T0 + 2, null, null],
      );
    });

    it('commitEmails enqueues each new email once, remembers it, and moves the cursor forward only (as uint64, not text)', async () => {
      const { gmail, events } = one;
      await gmail.saveGrant(ACCOUNT, 'c', 's', 'p');
      await gmail.recordWatch(ACCOUNT, '9', T0, T0);
      assert.equal(
        await gmail.commitEmails(ACCOUNT, [email('m-1'), email('m-2'), email('m-1')], '10', T0 + 5),
        2,
        'a repeat in the batch is one email',
      );
      assert.deepEqual([...(await gmail.seen(ACCOUNT, ['m-1', 'm-2', 'm-3']))].sort(), ['m-1', 'm-2']);
      assert.equal(
        await gmail.commitEmails(ACCOUNT, [email('m-2'), email('m-3')], '9', T0 + 6),
        1,
        'a remembered id is not enqueued again',
      );
      const state = (await gmail.get(ACCOUNT))!;
      assert.equal(state.cursor, '10', 'never moved back (9 < 10 as numbers, though "9" > "10" as text)');
      assert.deepEqual([state.emailsEnqueued, state.lastNotificationAt], [3, T0 + 6]);
      const stored = await (await other()).events.list({ endpoint: ENDPOINT });
      assert.equal(stored.length, 3, 'the events are committed with the cursor');
      assert.deepEqual(stored.map((e) => JSON.parse(e.envelope).messageId).sort(), ['m-1', 'm-2', 'm-3']);
      assert.ok(stored.every((e) => e.status === 'queued' && JSON.parse(e.envelope).id === e.id));
      assert.equal((await events.list({})).length, 3);
    });

    it('commitEmails is one transaction: an email that cannot be enqueued leaves the cursor, the ids and the events as they were', async () => {
      const { gmail } = one;
      await gmail.saveGrant(ACCOUNT, 'c', 's', 'p');
      await gmail.recordWatch(ACCOUNT, '100', T0, T0);
      const broken = email('m-2', () => {
        throw new Error('template failed');
      });
      await assert.rejects(gmail.commitEmails(ACCOUNT, [email('m-1'), broken], '200', T0 + 1), /template failed/);
      const state = (await gmail.get(ACCOUNT))!;
      assert.deepEqual([state.cursor, state.emailsEnqueued], ['100', 0]);
      assert.equal((await gmail.seen(ACCOUNT, ['m-1'])).size, 0);
      assert.equal((await one.events.list({})).length, 0);
    });

    it('forgets remembered ids after the retention period', async () => {
      const { gmail } = one;
      await gmail.saveGrant(ACCOUNT, 'c', 's', 'p');
      await gmail.commitEmails(ACCOUNT, [email('m-old')], '10', T0);
      await harness.ageSeenIds(SEEN_RETENTION_MS + 1);
      await gmail.commitEmails(ACCOUNT, [email('m-new')], '11', T0);
      assert.deepEqual([...(await gmail.seen(ACCOUNT, ['m-old', 'm-new']))], ['m-new']);
    });

    it('exclusively: one notification of a mailbox at a time in one process; other mailboxes are not held up', async () => {
      const { gmail } = one;
      const log: string[] = [];
      const work = (name: string, ms: number) => async () => {
        log.push(`${name}+`);
        await sleep(ms);
        log.push(`${name}-`);
        return name;
      };
      // a1 holds alice's mailbox until bob's work has run (or 5 s): bob must not wait for alice.
      let bobDone!: () => void;
      const bobFinished = new Promise<void>((resolve) => (bobDone = resolve));
      const results = await Promise.all([
        gmail.exclusively(ACCOUNT, async () => {
          log.push('a1+');
          await Promise.race([bobFinished, sleep(5_000)]);
          log.push('a1-');
          return 'a1';
        }),
        gmail.exclusively(ACCOUNT, work('a2', 10)),
        gmail.exclusively('bob@example.com', async () => {
          await work('b', 10)();
          bobDone();
          return 'b';
        }),
      ]);
      assert.deepEqual(results, ['a1', 'a2', 'b']);
      assert.ok(log.indexOf('a1-') < log.indexOf('a2+'), `a2 started before a1 ended: ${log}`);
      assert.ok(log.indexOf('b-') < log.indexOf('a1-'), `bob's mailbox waited for alice's: ${log}`);
      await assert.rejects(
        gmail.exclusively(ACCOUNT, async () => {
          throw new Error('gmail said no');
        }),
        /gmail said no/,
      );
      assert.equal(await gmail.exclusively(ACCOUNT, async () => 'after a failure'), 'after a failure');
    });

    it(
      'instances: one notification of a mailbox at a time across instances, and a dead instance does not hold the mailbox',
      { skip: !harness.sharedByInstances },
      async () => {
        const two = await other();
        let inside = 0;
        let most = 0;
        const work = async () => {
          inside++;
          most = Math.max(most, inside);
          await sleep(40);
          inside--;
        };
        await Promise.all(
          [1, 2, 3].flatMap(() => [one.gmail.exclusively(ACCOUNT, work), two.gmail.exclusively(ACCOUNT, work)]),
        );
        assert.equal(most, 1, 'two instances processed the same mailbox at once');

        // An instance that dies holding the mailbox: its session ends, the lock goes with it.
        const three = await harness.other();
        let release: (() => void) | undefined;
        const held = three.gmail.exclusively(ACCOUNT, () => new Promise<void>((r) => (release = r)));
        await waitFor(() => release, { what: 'the third instance to hold the mailbox' }); // it holds the lock from here
        let waited = false;
        const waiting = one.gmail.exclusively(ACCOUNT, async () => void (waited = true));
        await sleep(100);
        assert.equal(waited, false, 'waits while the other instance holds the mailbox');
        await harness.endLockHolders(); // the holder's connection dies, as it does when its instance is killed
        await waiting;
        assert.equal(waited, true);
        release!();
        await held.catch(() => {});
        await three.close().catch(() => {});
      },
    );

    it(
      'instances: the same notification committed by two instances at once enqueues each email once',
      { skip: !harness.sharedByInstances },
      async () => {
        const two = await other();
        await one.gmail.saveGrant(ACCOUNT, 'c', 's', 'p');
        const batch = ['m-1', 'm-2', 'm-3'].map((id) => email(id));
        const counts = await Promise.all([
          one.gmail.commitEmails(ACCOUNT, batch, '50', T0),
          two.gmail.commitEmails(ACCOUNT, batch, '50', T0),
        ]);
        assert.equal(counts[0]! + counts[1]!, 3);
        assert.equal((await one.events.list({})).length, 3);
        assert.equal((await one.gmail.get(ACCOUNT))!.emailsEnqueued, 3);
      },
    );
  });

  describe('ChannelStore', () => {
    const grant = (name: string, sealed: string, expiresAt: number | null = null) => ({
      name,
      kind: 'oauth-bot',
      sealed,
      details: { guild: 'g1' },
      expiresAt,
    });

    it('grants: saved, read by another instance, replaced (clearing the last error), forgotten with the devices revoked', async () => {
      const { channels } = one;
      await channels.saveGrant(grant('discord', 'sealed-1', T0 + 1000), T0);
      await channels.noteError('discord', 'refresh failed', T0 + 1);
      const seen = (await (await other()).channels.grant('discord'))!;
      assert.deepEqual(seen, {
        name: 'discord',
        kind: 'oauth-bot',
        sealed: 'sealed-1',
        details: { guild: 'g1' },
        connectedAt: T0,
        expiresAt: T0 + 1000,
        lastEventAt: null,
        lastError: 'refresh failed',
        lastErrorAt: T0 + 1,
      });
      await channels.saveGrant(grant('discord', 'sealed-2'), T0 + 2);
      await channels.saveGrant(grant('another', 'sealed-3'), T0 + 3);
      const again = (await channels.grant('discord'))!;
      assert.deepEqual(
        [again.sealed, again.connectedAt, again.expiresAt, again.lastError],
        ['sealed-2', T0 + 2, null, null],
      );
      assert.deepEqual(
        (await channels.grants()).map((g) => g.name),
        ['another', 'discord'],
      );

      const code = (await channels.createPairing('discord', 60_000, T0))!;
      const paired = await channels.pair('discord', code, 'Phone', T0);
      assert.ok(paired.ok);
      await channels.forget('discord', T0 + 10);
      assert.equal(await channels.grant('discord'), undefined);
      assert.equal((await channels.device(paired.device.id))!.revokedAt, T0 + 10);
      assert.equal(await channels.deviceByToken('discord', paired.token, T0 + 11), undefined);
    });

    it('sealed grants (storage reseal): replaced in one go, each only while it still holds what was read', async () => {
      const { channels } = one;
      await channels.saveGrant(grant('discord', 'sealed-old-d', T0 + 1000), T0);
      await channels.saveGrant(grant('tg', 'sealed-old-t'), T0);
      await channels.noteError('discord', 'refresh failed', T0 + 1);
      // The Telegram grant is stored anew (a login) after it was read: that one is left as it now is.
      await (await other()).channels.saveGrant(grant('tg', 'sealed-by-login'), T0 + 2);
      assert.equal(
        await channels.replaceSealedGrants([
          { key: 'discord', from: 'sealed-old-d', to: 'sealed-new-d' },
          { key: 'tg', from: 'sealed-old-t', to: 'sealed-new-t' },
        ]),
        1,
      );
      const [discord, tg] = await (await other()).channels.grants();
      assert.deepEqual(
        [discord!.sealed, discord!.expiresAt, discord!.lastError, tg!.sealed],
        ['sealed-new-d', T0 + 1000, 'refresh failed', 'sealed-by-login'],
        'only the sealed value changes',
      );
    });

    it('the last event is written at most once a minute per channel', async () => {
      const { channels } = one;
      await channels.saveGrant(grant('tg', 's'), T0);
      await channels.noteEvent('tg', T0 + 1);
      await channels.noteEvent('tg', T0 + 30_000);
      assert.equal((await channels.grant('tg'))!.lastEventAt, T0 + 1);
      await channels.noteEvent('tg', T0 + 61_000);
      assert.equal((await channels.grant('tg'))!.lastEventAt, T0 + 61_000);
    });

    it('pairing: at most 3 codes pending; a code pairs once, in any case; unknown, used, expired and other-channel codes are refused', async () => {
      const { channels } = one;
      const codes = [];
      for (let i = 0; i < 3; i++) codes.push((await channels.createPairing('phone', 60_000, T0))!);
      assert.ok(codes.every((c) => /^[23456789ABCDEFGHJKMNPQRSTVWXYZ]{8}$/.test(c)));
      assert.equal(await channels.createPairing('phone', 60_000, T0), undefined, 'a fourth pending code');
      assert.ok(await channels.createPairing('kiosk', 60_000, T0), 'another channel has its own three');
      assert.deepEqual(await channels.pair('kiosk', codes[0]!, 'Wrong channel', T0), { ok: false, reason: 'unknown' });
      assert.deepEqual(await channels.pair('phone', 'ZZZZZZZZ', 'Guess', T0), { ok: false, reason: 'unknown' });
      const paired = await channels.pair('phone', codes[0]!.toLowerCase(), 'Ana phone', T0 + 5);
      assert.ok(paired.ok);
      assert.match(paired.token, /^ghd_[A-Za-z0-9_-]{43}$/);
      assert.deepEqual(paired.device, {
        id: paired.device.id,
        channel: 'phone',
        name: 'Ana phone',
        createdAt: T0 + 5,
        revokedAt: null,
        lastSeenAt: null,
      });
      assert.deepEqual(await channels.pair('phone', codes[0]!, 'Again', T0 + 6), { ok: false, reason: 'used' });
      assert.deepEqual(await channels.pair('phone', codes[1]!, 'Late', T0 + 60_000), { ok: false, reason: 'expired' });
      const status = (await (await other()).channels.pairingStatus(codes[0]!))!;
      assert.deepEqual([status.expiresAt, status.device?.id], [T0 + 60_000, paired.device.id]);
      assert.deepEqual(await channels.pairingStatus(codes[2]!), { expiresAt: T0 + 60_000, device: undefined });
      assert.equal(await channels.pairingStatus('NOTACODE'), undefined);
      assert.ok(await channels.createPairing('phone', 60_000, T0 + 6), 'a used code is no longer pending');
    });

    it('devices: a token opens its own live device on its own channel only; revoked by id or name', async () => {
      const { channels } = one;
      const pairDevice = async (name: string, at: number) => {
        const result = await channels.pair('phone', (await channels.createPairing('phone', 60_000, at))!, name, at);
        assert.ok(result.ok);
        return result;
      };
      const a = await pairDevice('A', T0 - 2);
      const b = await pairDevice('B', T0 - 1);
      assert.equal((await channels.deviceByToken('phone', a.token, T0 + 1))?.id, a.device.id);
      assert.equal((await channels.device(a.device.id))!.lastSeenAt, T0 + 1, 'seen noted');
      assert.equal(await channels.deviceByToken('other', a.token, T0), undefined);
      assert.equal(await channels.deviceByToken('phone', a.token.slice(4), T0), undefined);
      assert.equal(await channels.deviceByToken('phone', 'ghd_' + 'x'.repeat(43), T0), undefined);
      assert.deepEqual(
        (await channels.devices('phone')).map((d) => d.name),
        ['A', 'B'],
      );
      assert.equal(await channels.revoke('phone', 'B', T0 + 2), 1);
      assert.equal(await channels.revoke('phone', b.device.id, T0 + 3), 0, 'already revoked');
      assert.equal(await channels.revoke('phone', a.device.id, T0 + 4), 1);
      assert.equal(await channels.deviceByToken('phone', a.token, T0 + 5), undefined);
      assert.deepEqual(
        (await channels.devices('phone')).map((d) => d.revokedAt),
        [T0 + 4, T0 + 2],
      );
    });

    it('outbox: messages in order, up to the limit, each handed over once', async () => {
      const { channels } = one;
      const ids = [];
      for (const text of ['one', 'two', 'three']) ids.push(await channels.enqueueForDevice('phone', 'dev_a', text, T0));
      await channels.enqueueForDevice('phone', 'dev_b', 'for b', T0);
      assert.ok(ids[0]! < ids[1]! && ids[1]! < ids[2]!);
      assert.deepEqual(await channels.takeOutbox('dev_a', 2, T0 + 1), [
        { id: ids[0], text: 'one', createdAt: T0 },
        { id: ids[1], text: 'two', createdAt: T0 },
      ]);
      assert.deepEqual(
        (await (await other()).channels.takeOutbox('dev_a', 10, T0 + 2)).map((m) => m.text),
        ['three'],
      );
      assert.deepEqual(await channels.takeOutbox('dev_a', 10, T0 + 3), []);
      assert.deepEqual(
        (await channels.takeOutbox('dev_b', 10, T0 + 3)).map((m) => m.text),
        ['for b'],
      );
    });

    it('OAuth requests: answered once, for their own channel, before they expire; the answer is taken once', async () => {
      const { channels } = one;
      await channels.createOAuthRequest('slack', 'state-1', 60_000, T0);
      await channels.createOAuthRequest('slack', 'state-2', 60_000, T0);
      assert.equal(await channels.takeOAuthAnswer('state-1', T0), undefined, 'no answer yet');
      assert.equal(await channels.answerOAuthRequest('discord', 'state-1', 'x', T0), false, 'another channel');
      assert.equal(await channels.answerOAuthRequest('slack', 'forged', 'x', T0), false);
      assert.equal(await channels.answerOAuthRequest('slack', 'state-2', 'x', T0 + 60_000), false, 'expired');
      assert.equal(
        await (await other()).channels.answerOAuthRequest('slack', 'state-1', 'sealed-answer', T0 + 1),
        true,
      );
      assert.equal(
        await channels.answerOAuthRequest('slack', 'state-1', 'replayed', T0 + 2),
        false,
        'answered already',
      );
      assert.equal(await channels.takeOAuthAnswer('state-1', T0 + 3), 'sealed-answer');
      assert.equal(await channels.takeOAuthAnswer('state-1', T0 + 4), undefined, 'taken once');
    });

    it('refreshGrant: only when due; the refresh stored; a failed refresh stores nothing; a login meanwhile wins', async () => {
      const { channels } = one;
      const due = (g: ChannelGrant) => g.expiresAt !== null && g.expiresAt < T0 + 1000;
      let calls = 0;
      assert.deepEqual(await channels.refreshGrant('missing', due, async () => ({ sealed: 'x', expiresAt: null })), {
        refreshed: false,
        grant: undefined,
      });
      await channels.saveGrant(grant('discord', 'old', T0 + 5000), T0);
      const notDue = await channels.refreshGrant(
        'discord',
        due,
        async () => (calls++, { sealed: 'x', expiresAt: null }),
      );
      assert.deepEqual([notDue.refreshed, notDue.grant?.sealed, calls], [false, 'old', 0]);

      await channels.saveGrant(grant('discord', 'old', T0 + 500), T0);
      await channels.noteError('discord', 'earlier failure', T0);
      await assert.rejects(
        channels.refreshGrant('discord', due, async () => {
          throw new Error('invalid_grant');
        }),
        /invalid_grant/,
      );
      assert.equal((await channels.grant('discord'))!.sealed, 'old');
      const done = await channels.refreshGrant('discord', due, async (current) => ({
        sealed: `${current.sealed}+new`,
        expiresAt: T0 + 9000,
      }));
      assert.deepEqual(
        [done.refreshed, done.grant?.sealed, done.grant?.expiresAt, done.grant?.lastError],
        [true, 'old+new', T0 + 9000, null],
      );

      await channels.saveGrant(grant('discord', 'old', T0 + 500), T0);
      const two = await other();
      let login: Promise<void> | undefined;
      await channels.refreshGrant('discord', due, async () => {
        login = two.channels.saveGrant(grant('discord', 'from-login', null), T0 + 1); // a login while the platform is asked
        await sleep(50);
        return { sealed: 'refreshed', expiresAt: T0 + 9000 };
      });
      await login;
      assert.equal((await channels.grant('discord'))!.sealed, 'from-login');
    });

    it('refreshGrant: a storage reseal while the platform is asked never throws the refreshed tokens away (found by review: Discord rotates its refresh token)', async () => {
      const { channels } = one;
      const due = (g: ChannelGrant) => g.expiresAt !== null && g.expiresAt < T0 + 1000;
      await channels.saveGrant(grant('discord', 'under-old-key', T0 + 500), T0);
      const two = await other();
      let reseal: Promise<number> | undefined;
      const done = await channels.refreshGrant('discord', due, async () => {
        // Not awaited here: on Postgres it waits for the refresh's row lock.
        reseal = two.channels.replaceSealedGrants([{ key: 'discord', from: 'under-old-key', to: 'under-new-key' }]);
        await sleep(50);
        return { sealed: 'refreshed', expiresAt: T0 + 9000 };
      });
      await reseal;
      assert.equal(done.refreshed, true);
      const stored = (await channels.grant('discord'))!;
      assert.deepEqual([stored.sealed, stored.expiresAt], ['refreshed', T0 + 9000]);
    });

    it("instances: two instances taking one device's outbox at once hand each message over exactly once", async () => {
      const two = await other();
      const sent = [];
      for (let i = 0; i < 60; i++) sent.push(await one.channels.enqueueForDevice('phone', 'dev_a', `m${i}`, T0));
      const takers = [one, two, one, two].map(async ({ channels }) => {
        const got: number[] = [];
        for (;;) {
          const batch = await channels.takeOutbox('dev_a', 7, T0 + 1);
          if (batch.length === 0) return got;
          got.push(...batch.map((m) => m.id));
        }
      });
      const all = (await Promise.all(takers)).flat();
      assert.equal(all.length, sent.length, 'a message handed over twice, or lost');
      assert.deepEqual(
        [...all].sort((a, b) => a - b),
        sent,
      );
    });

    it('instances: a pairing code given to two instances at once pairs one device', async () => {
      const two = await other();
      const code = (await one.channels.createPairing('phone', 60_000, T0))!;
      const outcomes = await Promise.all([
        one.channels.pair('phone', code, 'A', T0),
        two.channels.pair('phone', code, 'B', T0),
        one.channels.pair('phone', code, 'C', T0),
      ]);
      assert.equal(outcomes.filter((o) => o.ok).length, 1);
      assert.deepEqual(
        outcomes.filter((o) => !o.ok),
        [
          { ok: false, reason: 'used' },
          { ok: false, reason: 'used' },
        ],
      );
      assert.equal((await one.channels.devices('phone')).length, 1);
    });

    it(
      'instances: a due grant is refreshed by one instance; the others wait and read its result',
      { skip: !harness.sharedByInstances },
      async () => {
        const two = await other();
        const three = await other();
        await one.channels.saveGrant(grant('discord', 'rotating-1', T0 + 500), T0);
        const due = (g: ChannelGrant) => g.expiresAt !== null && g.expiresAt < T0 + 1000;
        let calls = 0;
        const refresh = async (current: ChannelGrant) => {
          calls++;
          await sleep(100); // the platform's answer takes a while: the others arrive meanwhile
          return { sealed: `${current.sealed}>rotating-2`, expiresAt: T0 + 9000 };
        };
        const results = await Promise.all(
          [one, two, three].map(({ channels }) => channels.refreshGrant('discord', due, refresh)),
        );
        assert.equal(calls, 1, 'the platform was asked more than once');
        assert.equal(results.filter((r) => r.refreshed).length, 1);
        assert.ok(
          results.every((r) => r.grant?.sealed === 'rotating-1>rotating-2'),
          'every instance reads the one refresh',
        );
      },
    );
  });
}
