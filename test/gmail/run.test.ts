/**
 * The Gmail integration running: `gatehouse start` (push) and `gatehouse webhooks gmail run`
 * (pull) as real processes, set up by the real `setup` command against the local fake of Google,
 * delivering to a real local target through a real SQLite file.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { startFakeGoogle, type FakeGoogle, type StoredEmail } from '../helpers/fake-google.js';
import { request } from '../helpers/http.js';
import { runCli, startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';
import {
  ACCOUNT,
  accountRow,
  committedIds,
  contractRefusals,
  ENDPOINT,
  methodsUsed,
  newSecretKey,
  onCall,
  PROJECT,
  PUSH_SERVICE_ACCOUNT,
  PUSH_SUBSCRIPTION,
  pushesSettled,
  queuedEvents,
  runSetup,
  startHoldingProxy,
  startPushRelay,
  webhooksWith,
  workspace,
  writeConfig,
  type PushRelay,
  type Workspace,
} from './helpers.js';

const PULL_SUBSCRIPTION = `projects/${PROJECT}/subscriptions/gatehouse-gmail-pull`;
const GMAIL_MESSAGE = /^\/gmail\/v1\/users\/me\/messages\/[0-9a-f]{16}$/;

interface Envelope {
  id: string;
  action: string;
  endpoint: string;
  receivedAt: string;
  message?: string;
  payload: Record<string, any>;
}

const envelopes = (target: RecordingServer): Envelope[] => target.received.map((r) => JSON.parse(r.body) as Envelope);
/** How many times the target got each Gmail message id. */
const deliveryCounts = (target: RecordingServer): Record<string, number> => {
  const counts: Record<string, number> = {};
  for (const e of envelopes(target)) counts[e.payload.id] = (counts[e.payload.id] ?? 0) + 1;
  return counts;
};
/** Waits for the target to have received this email; returns its envelope. */
const delivery = (target: RecordingServer, mail: StoredEmail) =>
  waitFor(() => envelopes(target).find((e) => e.payload.id === mail.id), { what: `delivery of ${mail.subject}` });

/** The Date header the fake's Gmail gives a message. */
const dateHeader = (mail: StoredEmail) => new Date(Number(mail.internalDate)).toUTCString().replace('GMT', '+0000');

/** The documented methods setup calls (test/fixtures/google/), whatever the mode. */
const SETUP_METHODS = [
  'gmail.users.getProfile',
  'pubsub.projects.topics.get',
  'pubsub.projects.topics.create',
  'pubsub.projects.topics.getIamPolicy',
  'pubsub.projects.topics.setIamPolicy',
  'pubsub.projects.subscriptions.get',
  'pubsub.projects.subscriptions.create',
  'gmail.users.watch',
];

/** Runs `setup --json` and returns the webhooks.gmail section it printed. */
async function setUp(fake: FakeGoogle, ws: Workspace, args: string[]): Promise<Record<string, any>> {
  const run = await runSetup(fake, ws, ['--credentials', ws.credentials, '--json', ...args]);
  assert.equal(run.code, 0, run.stderr);
  return JSON.parse(run.stdout).section;
}

async function status(ws: Workspace): Promise<Record<string, any>> {
  const run = await runCli(['webhooks', 'gmail', 'status', '--json', '--config', ws.config]);
  assert.equal(run.code, 0, run.stderr);
  return JSON.parse(run.stdout);
}

describe('push mode: gatehouse start serves the push route and delivers emails', () => {
  let fake: FakeGoogle;
  let ws: Workspace;
  let target: RecordingServer;
  let relay: PushRelay;
  let server: ServerProcess;
  let hooks: string;
  let audience: string;
  let section: Record<string, any>;
  const mails: StoredEmail[] = [];

  const start = async () => {
    server = startServerProcess(ws.config, { env: ws.env });
    hooks = (await server.waitFor((l) => l.msg === 'webhook receiver listening')).url;
    await server.waitFor((l) => l.msg === 'gmail integration running');
    relay.forwardTo = hooks;
  };
  /** A Gmail notification as Pub/Sub pushes it. */
  const notification = (emailAddress: string, historyId: string, messageId = 'forged-1') =>
    JSON.stringify({
      message: {
        data: Buffer.from(JSON.stringify({ emailAddress, historyId: Number(historyId) })).toString('base64'),
        messageId,
      },
      subscription: PUSH_SUBSCRIPTION,
    });
  const push = (body: string, token?: string) =>
    request(hooks, '/webhook/gmail', {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
      body,
    });
  /** Every answer gatehouse gave a push of this email's notification: 2xx only once its event was committed. */
  const assertAckedAfterCommit = (mail: StoredEmail) => {
    const answers = relay.observed.filter((o) => o.historyId === mail.historyId);
    assert.ok(
      answers.some((o) => o.status >= 200 && o.status < 300),
      `a 2xx for ${mail.subject}: ${JSON.stringify(answers)}`,
    );
    for (const o of answers) {
      if (o.status >= 200 && o.status < 300)
        assert.ok(o.committed.includes(mail.id), `2xx before ${mail.subject} was committed`);
    }
  };

  before(async () => {
    fake = await startFakeGoogle({ timing: { pushMinBackoffMs: 50, pushMaxBackoffMs: 300, pushMaxAttempts: 60 } });
    target = await startRecordingUpstream();
    ws = workspace();
    relay = await startPushRelay(ws);
    audience = `${relay.url}/webhook/gmail`;
    section = await setUp(fake, ws, [
      '--push-endpoint',
      audience,
      '--push-service-account',
      PUSH_SERVICE_ACCOUNT,
      '--include-body',
      '--template',
      'Mail from {{from}}: {{subject}}',
    ]);
    writeConfig(ws, webhooksWith(section, target.url));
    await start();
  });
  after(async () => {
    await server?.stop();
    await relay.close();
    await target.close();
    await fake.close();
  });

  it('a new email reaches the message target; the push is answered 2xx only after the event is committed', async () => {
    const mail = fake.addEmail({
      from: 'Bob <bob@example.com>',
      subject: 'Invoice #7',
      text: 'Please pay <by> Friday.',
    });
    mails.push(mail);
    const envelope = await delivery(target, mail);
    assert.equal(envelope.action, 'message');
    assert.equal(envelope.endpoint, ENDPOINT);
    assert.equal(envelope.message, 'Mail from Bob <bob@example.com>: Invoice #7');
    assert.deepEqual(envelope.payload, {
      account: ACCOUNT,
      id: mail.id,
      threadId: mail.threadId,
      from: 'Bob <bob@example.com>',
      to: ACCOUNT,
      subject: 'Invoice #7',
      date: dateHeader(mail),
      snippet: 'Please pay <by> Friday.', // Gmail sends it HTML-escaped; the target gets text
      labels: ['INBOX'],
      body: 'Please pay <by> Friday.',
    });
    const received = target.received.find((r) => JSON.parse(r.body).id === envelope.id)!;
    assert.equal(received.url, '/messages');
    assert.equal(received.headers['x-gatehouse-action'], 'message');
    assert.equal(received.headers['idempotency-key'], envelope.id);

    await pushesSettled(fake);
    const attempts = fake.pushAttempts.filter((a) =>
      relay.observed.some((o) => o.messageId === a.messageId && o.historyId === mail.historyId),
    );
    assert.deepEqual(
      attempts.map((a) => a.status),
      [200],
      'one push, acknowledged',
    );
    assertAckedAfterCommit(mail);
    assert.deepEqual(deliveryCounts(target), { [mail.id]: 1 });
  });

  it("push tokens that are not Pub/Sub's for this audience and account get 401: nothing enqueued, nothing delivered", async () => {
    relay.forwardTo = undefined; // Pub/Sub's own push cannot get through meanwhile
    const mail = fake.addEmail({ from: 'carol@example.com', subject: 'forged?', text: 'x' });
    mails.push(mail);
    await waitFor(() => relay.observed.some((o) => o.historyId === mail.historyId), {
      what: 'the real push, held back',
    });
    const body = notification(ACCOUNT, mail.historyId);
    const past = Math.floor(Date.now() / 1000) - 7200;
    const forged: [string, string | undefined][] = [
      [
        'wrong audience',
        await fake.signOidcToken({ aud: 'https://elsewhere.example/webhook/gmail', email: PUSH_SERVICE_ACCOUNT }),
      ],
      [
        'wrong service account',
        await fake.signOidcToken({ aud: audience, email: 'intruder@evil.iam.gserviceaccount.com' }),
      ],
      [
        'email not verified',
        await fake.signOidcToken({ aud: audience, email: PUSH_SERVICE_ACCOUNT, email_verified: false }),
      ],
      [
        'expired',
        await fake.signOidcToken({ aud: audience, email: PUSH_SERVICE_ACCOUNT, iat: past, exp: past + 3600 }),
      ],
      [
        'signed by another key',
        await fake.signOidcToken({ aud: audience, email: PUSH_SERVICE_ACCOUNT }, { signer: 'stranger' }),
      ],
      ['no token', undefined],
    ];
    const messagesBefore = fake.calls.filter((c) => c.path.startsWith('/gmail/')).length;
    for (const [what, token] of forged) {
      const reply = await push(body, token);
      assert.equal(reply.status, 401, what);
      assert.equal(reply.json().error.code, 'invalid_webhook_signature', what);
    }
    // A genuine token for a mailbox that is not this one: acknowledged (204) and ignored.
    const genuine = await fake.signOidcToken({ aud: audience, email: PUSH_SERVICE_ACCOUNT });
    const other = await push(notification('mallory@example.com', mail.historyId), genuine);
    assert.equal(other.status, 204);
    // Nor does a message that is not a Gmail notification (acknowledged, so Pub/Sub stops sending it).
    const unusable = await push(
      JSON.stringify({
        message: { data: Buffer.from('{"hello":1}').toString('base64'), messageId: 'x' },
        subscription: PUSH_SUBSCRIPTION,
      }),
      genuine,
    );
    assert.equal(unusable.status, 204);

    assert.equal(
      fake.calls.filter((c) => c.path.startsWith('/gmail/')).length,
      messagesBefore,
      'gatehouse read nothing from Gmail',
    );
    assert.equal(committedIds(ws).includes(mail.id), false, 'nothing enqueued');
    assert.ok(BigInt(accountRow(ws)!.cursor) < BigInt(mail.historyId), 'cursor not moved');
    await waitFor(() => queuedEvents(ws) === 0, { what: 'every stored event settled' }); // a delivery comes from a stored event
    assert.equal(deliveryCounts(target)[mail.id], undefined, 'nothing delivered');

    // Pub/Sub's own push, once it gets through, is processed.
    relay.forwardTo = hooks;
    await delivery(target, mail);
    assertAckedAfterCommit(mail);
  });

  it('a redelivered notification (same message, valid token) changes nothing', async () => {
    let mail = mails.at(-1);
    if (!mail) {
      mails.push((mail = fake.addEmail({ from: 'ivy@example.com', subject: 'once', text: 'o' })));
      await delivery(target, mail);
    }
    const token = await fake.signOidcToken({ aud: audience, email: PUSH_SERVICE_ACCOUNT });
    const before = accountRow(ws)!;
    const again = await push(notification(ACCOUNT, mail!.historyId), token);
    assert.equal(again.status, 200);
    // The answer comes after the commit: had it enqueued anything, storage would show it now.
    assert.deepEqual(
      committedIds(ws),
      mails.map((m) => m.id),
    );
    assert.equal(accountRow(ws)!.emails_enqueued, before.emails_enqueued);
    assert.equal(accountRow(ws)!.cursor, before.cursor);
  });

  it("Gmail failing mid-notification: answered 5xx with nothing committed, then delivered exactly once on Pub/Sub's retry", async () => {
    // googleapis retries a GET on 5xx itself; enough failures that the first push gives up.
    fake.failNext({ method: 'GET', path: GMAIL_MESSAGE }, { status: 500, message: 'Backend Error', times: 5 });
    const mail = fake.addEmail({ from: 'dave@example.com', subject: 'flaky', text: 'y' });
    mails.push(mail);
    await delivery(target, mail);
    await pushesSettled(fake);
    const answers = relay.observed.filter((o) => o.historyId === mail.historyId);
    assert.ok(answers.length >= 2, JSON.stringify(answers));
    assert.ok(answers[0]!.status >= 500, `first push answered ${answers[0]!.status}`);
    assert.equal(answers[0]!.committed.includes(mail.id), false, 'nothing committed by the failed attempt');
    assertAckedAfterCommit(mail);
    await server.waitFor((l) => l.msg === 'notification not processed: the sender will retry');
    await waitFor(() => queuedEvents(ws) === 0, { what: 'every stored event settled' }); // a second delivery would come from a stored event
    assert.deepEqual(deliveryCounts(target), Object.fromEntries(mails.map((m) => [m.id, 1])));
  });

  it('kill -9 while a notification is being processed: after a restart the email is delivered exactly once', async () => {
    // The moment gatehouse asks Gmail for this message (before the fake answers), it dies.
    const victim = server;
    const undo = onCall(
      fake,
      (c) => GMAIL_MESSAGE.test(c.path),
      () => victim.child.kill('SIGKILL'),
    );
    const mail = fake.addEmail({ from: 'erin@example.com', subject: 'crash', text: 'z' });
    mails.push(mail);
    assert.equal(await victim.stop('SIGCONT'), null, 'killed');
    undo();
    assert.equal(victim.child.signalCode, 'SIGKILL');
    assert.equal(committedIds(ws).includes(mail.id), false, 'died before the commit');

    await start();
    await delivery(target, mail);
    await pushesSettled(fake);
    assertAckedAfterCommit(mail);
    await waitFor(() => queuedEvents(ws) === 0, { what: 'every stored event settled' }); // a second delivery would come from a stored event
    assert.deepEqual(deliveryCounts(target), Object.fromEntries(mails.map((m) => [m.id, 1])));
  });

  it('history too old (404): resyncs from recent messages and delivers the new email once, not the old ones again', async () => {
    const box = fake.state.mailboxes.get(ACCOUNT)!;
    fake.expireHistoryBefore(box.historyId + 1); // the stored cursor is now older than Gmail keeps
    const mail = fake.addEmail({ from: 'frank@example.com', subject: 'after the gap', text: 'w' });
    mails.push(mail);
    await delivery(target, mail);
    const resync = await server.waitFor((l) => l.msg === 'gmail history id too old: resynced from the recent messages');
    assert.equal(resync.level, 'warn');
    assert.ok(resync.candidates >= mails.length, 'the earlier emails were candidates too');
    assert.ok(
      fake.calls.some((c) => c.method === 'GET' && c.path === '/gmail/v1/users/me/history' && c.status === 404),
    );
    await pushesSettled(fake);
    assertAckedAfterCommit(mail);
    await waitFor(() => queuedEvents(ws) === 0, { what: 'every stored event settled' }); // a second delivery would come from a stored event
    assert.deepEqual(deliveryCounts(target), Object.fromEntries(mails.map((m) => [m.id, 1])));
    assert.equal(accountRow(ws)!.cursor, String(box.historyId));
  });

  it('status: human and --json, beside the running server', async () => {
    const [json, human] = await Promise.all([
      status(ws),
      runCli(['webhooks', 'gmail', 'status', '--config', ws.config]),
    ]);
    const watch = fake.state.watches.get(ACCOUNT)!;
    const box = fake.state.mailboxes.get(ACCOUNT)!;
    assert.equal(json.account, ACCOUNT);
    assert.equal(json.mode, 'push');
    assert.equal(json.cursor, String(box.historyId));
    assert.equal(json.watchActive, true);
    assert.equal(
      json.watchExpiration,
      new Date(Number(watch.expiration)).toISOString(),
      'dates are ISO 8601 in --json',
    );
    assert.ok(Date.now() - Date.parse(json.lastNotificationAt) < 30_000, 'a recent notification');
    assert.equal(json.emailsEnqueued, mails.length);
    assert.equal(json.lastError, null);
    assert.equal('sealedGrant' in json, false, 'the sealed grant is not shown');

    assert.equal(human.code, 0, human.stderr);
    assert.match(
      human.stdout,
      new RegExp(`^gmail ${ACCOUNT} \\(push, project ${PROJECT}, topic gatehouse-gmail\\)$`, 'm'),
    );
    assert.match(human.stdout, new RegExp(`watch +active: expires ${json.watchExpiration}`));
    assert.match(human.stdout, new RegExp(`cursor +${json.cursor} \\(moved `));
    assert.match(human.stdout, /last notification +\d{4}-\d\d-\d\dT.* ago\)/);
    assert.match(human.stdout, /last error +none/);
    assert.match(human.stdout, new RegExp(`emails enqueued +${mails.length}$`, 'm'));

    // Neither the refresh token (seen by the fake when gatehouse refreshed) nor any access token is logged.
    const refresh = fake.calls.map((c) => (c.body as Record<string, string> | undefined)?.refresh_token).find(Boolean);
    assert.ok(refresh);
    const log = JSON.stringify(server.lines);
    assert.equal(log.includes(refresh!), false);
    assert.doesNotMatch(log, /ya29\./);
  });

  it('every call setup and the push route made to Google is a documented method with documented parameters', () => {
    assert.deepEqual(contractRefusals(fake.calls), []);
    assert.deepEqual(
      methodsUsed(fake.calls).sort(),
      [...SETUP_METHODS, 'gmail.users.history.list', 'gmail.users.messages.get', 'gmail.users.messages.list'].sort(),
    );
  });

  it('an explicit push.jwksUri is the key set push tokens are checked against, even with googleApiUrl set', async () => {
    const elsewhere = await startFakeGoogle(); // only its key set (and tokens signed with it)
    try {
      await pushesSettled(fake);
      await server.stop();
      assert.ok(section.googleApiUrl, 'the section names googleApiUrl');
      writeConfig(ws, webhooksWith({ ...section, push: { ...section.push, jwksUri: elsewhere.jwksUrl } }, target.url));
      await start();
      // A notification for another mailbox: answered 204 once its token is verified, and nothing is read.
      const body = notification('mallory@example.com', '1');
      const signedThere = await push(
        body,
        await elsewhere.signOidcToken({ aud: audience, email: PUSH_SERVICE_ACCOUNT }),
      );
      assert.equal(signedThere.status, 204, 'a token from the configured key set is accepted');
      const signedUnderApiUrl = await push(
        body,
        await fake.signOidcToken({ aud: audience, email: PUSH_SERVICE_ACCOUNT }),
      );
      assert.equal(signedUnderApiUrl.status, 401, 'the key set under googleApiUrl is not used');
    } finally {
      await elsewhere.close();
    }
  });
});

describe('pull mode: gatehouse webhooks gmail run, the key, and watch renewal', () => {
  let fake: FakeGoogle;
  let ws: Workspace;
  let target: RecordingServer;
  let runner: ServerProcess | undefined;
  let section: Record<string, any>;
  const mails: StoredEmail[] = [];
  /** What storage held each time gatehouse acknowledged pulled messages (taken before the fake answered). */
  const atAcks: string[][] = [];
  const run = () => startServerProcess(ws.config, { env: ws.env, command: ['webhooks', 'gmail', 'run'] });

  before(async () => {
    // Watches last 60 s here and are renewed every minute: each start finds the renewal due.
    fake = await startFakeGoogle({ timing: { ackDeadlineMs: 600, watchTtlMs: 60_000 } });
    target = await startRecordingUpstream();
    ws = workspace();
    section = await setUp(fake, ws, [
      '--mode',
      'pull',
      '--subscription',
      'gatehouse-gmail-pull',
      '--renew-minutes',
      '1',
    ]);
    writeConfig(ws, webhooksWith({ ...section, pull: { intervalMs: 100 } }, target.url));
    onCall(
      fake,
      (c) => c.path === `/v1/${PULL_SUBSCRIPTION}:acknowledge`,
      () => atAcks.push(committedIds(ws)),
    );
  });
  after(async () => {
    await runner?.stop();
    await target.close();
    await fake.close();
  });

  it('refuses to start without the key, or with another key, before calling Google', async () => {
    const from = fake.calls.length;
    const command = ['webhooks', 'gmail', 'run', '--config', ws.config];
    const [none, wrong] = await Promise.all([
      runCli(command, { env: { GATEHOUSE_SECRET_KEY: undefined }, timeoutMs: 15_000 }),
      runCli(command, { env: { GATEHOUSE_SECRET_KEY: newSecretKey() }, timeoutMs: 15_000 }),
    ]);
    assert.equal(none.code, 1, none.stderr);
    assert.match(none.stderr, /GATEHOUSE_SECRET_KEY is not set.*openssl rand -base64 32/);
    assert.equal(wrong.code, 1, wrong.stderr);
    assert.match(
      wrong.stderr,
      /cannot decrypt the stored secret for gmail:alice@example\.com: GATEHOUSE_SECRET_KEY is not the key it was stored with/,
    );
    assert.deepEqual(fake.calls.slice(from), []);
  });

  it('renews a watch that is due at start, pulls, delivers, and acknowledges', async () => {
    const setupWatch = accountRow(ws)!.watch_expiration as number;
    const watchesBefore = fake.calls.filter((c) => c.path === '/gmail/v1/users/me/watch').length;
    runner = run();
    const renewed = await runner.waitFor((l) => l.msg === 'gmail watch renewed');
    assert.equal(fake.calls.filter((c) => c.path === '/gmail/v1/users/me/watch').length, watchesBefore + 1);
    assert.equal(renewed.expiration, new Date(Number(fake.state.watches.get(ACCOUNT)!.expiration)).toISOString());
    assert.equal(fake.state.watches.get(ACCOUNT)!.labelFilterBehavior, 'include');
    assert.deepEqual(contractRefusals(fake.calls), [], 'the renewal is what Gmail documents');
    assert.ok(accountRow(ws)!.watch_expiration > setupWatch, 'the new expiration is stored');

    const mail = fake.addEmail({ from: 'gina@example.com', subject: 'pulled', text: 'p' });
    mails.push(mail);
    const envelope = await delivery(target, mail);
    assert.equal(envelope.message, 'New email from gina@example.com: pulled');
    assert.equal(envelope.payload.body, undefined, 'no body unless includeBody');
    await waitFor(() => fake.calls.find((c) => c.path === `/v1/${PULL_SUBSCRIPTION}:acknowledge`), {
      what: 'the acknowledgement',
    });
    const acks = fake.calls.filter((c) => c.path === `/v1/${PULL_SUBSCRIPTION}:acknowledge`);
    assert.deepEqual(
      acks.map((c) => [c.status, (c.body as { ackIds: string[] }).ackIds.length]),
      [[200, 1]],
    );
    assert.deepEqual(atAcks, [[mail.id]], 'acknowledged only once committed');
    // Past the ack deadline, nothing comes again: time is the property (Pub/Sub redelivers what is not acknowledged by then).
    await sleep(800); // the fake's ack deadline is 600 ms
    assert.equal(fake.calls.filter((c) => c.path === `/v1/${PULL_SUBSCRIPTION}:acknowledge`).length, 1);
    assert.deepEqual(deliveryCounts(target), { [mail.id]: 1 });
  });

  it("another mailbox's notification is acknowledged and dropped; a failed one is left for redelivery and delivered once", async () => {
    fake.publishRaw(PULL_SUBSCRIPTION, { emailAddress: 'mallory@example.com', historyId: 999_999 });
    await waitFor(() => fake.calls.filter((c) => c.path === `/v1/${PULL_SUBSCRIPTION}:acknowledge`).length === 2, {
      what: 'the other mailbox acknowledged',
    });

    fake.failNext({ method: 'GET', path: GMAIL_MESSAGE }, { status: 500, message: 'Backend Error', times: 5 });
    const mail = fake.addEmail({ from: 'hank@example.com', subject: 'retried', text: 'r' });
    mails.push(mail);
    await runner!.waitFor((l) => l.msg === 'gmail notification not processed: left for redelivery');
    // Not "nothing committed yet" here: the redelivery comes 600 ms later (the fake's ack deadline),
    // and a loaded CI machine read this log line after it had already committed. What proves the
    // failed pass committed nothing is below: delivered once, and acknowledged only once committed.
    await delivery(target, mail);
    // Past the fake's 600 ms ack deadline (a time-based property: a notification left unacknowledged is
    // redelivered then), and every stored event settled: a second delivery would have come by now.
    await sleep(800);
    await waitFor(() => queuedEvents(ws) === 0, { what: 'every stored event settled' });
    assert.deepEqual(deliveryCounts(target), Object.fromEntries(mails.map((m) => [m.id, 1])));
    assert.deepEqual(
      committedIds(ws),
      mails.map((m) => m.id),
    );
    assert.deepEqual(
      atAcks.at(-1),
      mails.map((m) => m.id),
      'the retried notification was acknowledged only once committed',
    );
  });

  it('an HTML 404 while reading a message is an error, not a deleted message: left for redelivery, then delivered once', async () => {
    // What Google's front end (or a misrouting proxy) answers for a URL it does not serve.
    fake.failNext({ method: 'GET', path: GMAIL_MESSAGE }, { status: 404, message: '', html: true });
    const mail = fake.addEmail({ from: 'iris@example.com', subject: 'misrouted', text: 'm' });
    mails.push(mail);
    const failed = await runner!.waitFor(
      (l) =>
        l.msg === 'gmail notification not processed: left for redelivery' &&
        /Google answered 404 Not Found to GET http:\/\/127\.0\.0\.1:\d+\/gmail\/v1\/users\/me\/messages\/[0-9a-f]{16}\./.test(
          l.problem,
        ),
    );
    assert.doesNotMatch(failed.problem, /<!DOCTYPE|<html/i);
    assert.equal(committedIds(ws).includes(mail.id), false);
    await delivery(target, mail);
    // Past the fake's 600 ms ack deadline (a time-based property: a notification left unacknowledged is
    // redelivered then), and every stored event settled: a second delivery would have come by now.
    await sleep(800);
    await waitFor(() => queuedEvents(ws) === 0, { what: 'every stored event settled' });
    assert.deepEqual(deliveryCounts(target), Object.fromEntries(mails.map((m) => [m.id, 1])));
    assert.equal(
      runner!.lines.some((l) => l.msg === 'gmail message gone before it was read: skipped'),
      false,
      'not skipped as deleted',
    );
  });

  it('a failing renewal is logged at error level and shown by status as lastError', async () => {
    await runner!.stop();
    fake.failNext(
      { method: 'POST', path: '/gmail/v1/users/me/watch' },
      {
        status: 403,
        message: 'Error sending test message to Cloud PubSub: User not authorized to perform this action.',
      },
    );
    runner = run();
    const failed = await runner.waitFor((l) => /^GMAIL WATCH RENEWAL FAILED/.test(l.msg));
    assert.equal(failed.level, 'error');
    assert.equal(failed.retryInMs, 30_000);
    assert.match(failed.problem, /watch renewal failed: .*User not authorized/);
    const shown = await status(ws);
    assert.match(shown.lastError, /^watch renewal failed: /);
    assert.ok(Date.now() - Date.parse(shown.lastErrorAt) < 30_000);
    assert.equal(shown.emailsEnqueued, mails.length);
  });

  it('SIGTERM while a watch renewal is in flight: the process exits as soon as Gmail answers', async () => {
    await runner?.stop();
    // Google is reached through a proxy that holds the watch call (due at start) until the
    // process has shut down: its answer then lands in a closed integration.
    const proxy = await startHoldingProxy(fake.url, (p) => p === '/gmail/v1/users/me/watch');
    try {
      writeConfig(ws, webhooksWith({ ...section, googleApiUrl: proxy.url, pull: { intervalMs: 100 } }, target.url));
      runner = run();
      await proxy.held;
      await runner.waitFor((l) => l.msg === 'webhook receiver listening');
      runner.child.kill('SIGTERM');
      await runner.waitFor((l) => l.msg === 'stopped');
      const exited = once(runner.child, 'exit');
      const releasedAt = Date.now();
      proxy.release();
      const [code] = await Promise.race([
        exited,
        sleep(10_000, ['still running 10 s after Gmail answered'], { ref: false }),
      ]);
      assert.equal(code, 0);
      assert.ok(Date.now() - releasedAt < 5_000, `exited ${Date.now() - releasedAt} ms after Gmail answered`);
    } finally {
      await proxy.close();
      writeConfig(ws, webhooksWith({ ...section, pull: { intervalMs: 100 } }, target.url));
    }
  });

  it('every call setup, the renewals and the pull loop made to Google is a documented method with documented parameters', () => {
    assert.deepEqual(contractRefusals(fake.calls), []);
    assert.deepEqual(
      methodsUsed(fake.calls).sort(),
      [
        ...SETUP_METHODS,
        'pubsub.projects.subscriptions.pull',
        'pubsub.projects.subscriptions.acknowledge',
        'gmail.users.history.list',
        'gmail.users.messages.get',
      ].sort(),
    );
  });
});
