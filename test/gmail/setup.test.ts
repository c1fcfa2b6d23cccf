/**
 * `gatehouse webhooks gmail setup` end to end: the CLI as a child process against the local fake
 * of Google (OAuth, Pub/Sub, Gmail), the test playing the browser, a real SQLite file.
 */
import assert from 'node:assert/strict';
import { existsSync, writeFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { FAKE_CLIENT, startFakeGoogle, type FakeGoogle } from '../helpers/fake-google.js';
import { runCli } from '../helpers/process.js';
import {
  ACCOUNT,
  accountRow,
  contractRefusals,
  GMAIL_PUBLISHER,
  methodsUsed,
  printedSection,
  PROJECT,
  PUSH_SERVICE_ACCOUNT,
  PUSH_SUBSCRIPTION,
  runSetup,
  stepLines,
  storageBytes,
  TOPIC,
  webhooksWith,
  workspace,
  writeConfig,
  type Workspace,
} from './helpers.js';

const PUSH_URL = 'http://127.0.0.1:8999/webhook/gmail';
const pushArgs = (ws: Workspace) => [
  '--credentials',
  ws.credentials,
  '--mode',
  'push',
  '--push-endpoint',
  PUSH_URL,
  '--push-service-account',
  PUSH_SERVICE_ACCOUNT,
];

/** Calls that create, change or grant something, or start an authorisation. */
const mutating = (calls: FakeGoogle['calls']) =>
  calls.filter(
    (c) =>
      c.method === 'PUT' ||
      c.method === 'PATCH' ||
      c.path.endsWith(':setIamPolicy') ||
      c.path === '/o/oauth2/v2/auth' ||
      (c.path === '/token' && (c.body as Record<string, string>)?.grant_type === 'authorization_code'),
  );

describe('gmail setup, push mode: end to end and idempotent', () => {
  let fake: FakeGoogle;
  let ws: Workspace;
  let first: Awaited<ReturnType<typeof runSetup>>;
  before(async () => {
    fake = await startFakeGoogle();
    ws = workspace();
    first = await runSetup(fake, ws, pushArgs(ws));
  });
  after(() => fake.close());

  it('authorises through the loopback listener, creates topic, grant, subscription and watch, and prints the section', () => {
    assert.equal(first.code, 0, first.stderr);
    // The browser's part: Google's consent answered a 302 to the CLI's own loopback listener.
    const url = first.authUrl!;
    assert.equal(url.searchParams.get('login_hint'), ACCOUNT);
    assert.equal(url.searchParams.get('code_challenge_method'), 'S256');
    assert.equal(url.searchParams.get('access_type'), 'offline');
    assert.deepEqual(url.searchParams.get('scope')!.split(' ').sort(), [
      'https://www.googleapis.com/auth/gmail.readonly',
      'https://www.googleapis.com/auth/pubsub',
    ]);
    assert.equal(first.browser!.consentStatus, 302);
    assert.match(first.browser!.location.origin, /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(first.browser!.loopbackStatus, 200);
    assert.match(first.browser!.loopbackPage, /authorised/);
    const exchange = fake.calls.find((c) => c.path === '/token')!.body as Record<string, string>;
    assert.equal(exchange.grant_type, 'authorization_code');
    assert.ok(exchange.code_verifier, 'PKCE verifier sent');

    assert.deepEqual(
      stepLines(first.stdout).map(([mark, step]) => `${mark} ${step}`),
      ['✓ authorise', '✓ topic', '✓ subscription', '✓ watch', '✓ config'],
    );
    assert.doesNotMatch(first.stdout, /\(unchanged\)/);

    assert.ok(fake.state.topics.has(TOPIC));
    const publisher = fake.state.iamPolicies.get(TOPIC)!.bindings!.find((b) => b.role === 'roles/pubsub.publisher');
    assert.deepEqual(publisher?.members, [GMAIL_PUBLISHER]);
    const sub = fake.state.subscriptions.get(PUSH_SUBSCRIPTION)!;
    assert.equal(sub.topic, TOPIC);
    assert.equal(sub.ackDeadlineSeconds, 60);
    assert.deepEqual(sub.pushConfig, {
      pushEndpoint: PUSH_URL,
      oidcToken: { serviceAccountEmail: PUSH_SERVICE_ACCOUNT, audience: PUSH_URL },
    });
    const watch = fake.state.watches.get(ACCOUNT)!;
    assert.equal(watch.topicName, TOPIC);
    assert.deepEqual(watch.labelIds, ['INBOX']);
    assert.equal(watch.labelFilterBehavior, 'include');

    assert.deepEqual(printedSection(first.stdout), {
      account: ACCOUNT,
      project: PROJECT,
      mode: 'push',
      push: { path: '/webhook/gmail', audience: PUSH_URL, serviceAccountEmail: PUSH_SERVICE_ACCOUNT },
      googleApiUrl: fake.url,
    });
    const row = accountRow(ws)!;
    assert.equal(row.cursor, watch.historyId, 'the watch historyId is the cursor');
    assert.equal(row.watch_expiration, Number(watch.expiration));
    assert.equal(row.project, PROJECT, 'the project is kept with the grant');
  });

  it('every call setup made is a documented Google method with documented parameters (IAM read with GET, the label filter in its enum)', () => {
    assert.deepEqual(contractRefusals(fake.calls), []);
    assert.deepEqual(methodsUsed(fake.calls), [
      'gmail.users.getProfile',
      'pubsub.projects.topics.get',
      'pubsub.projects.topics.create',
      'pubsub.projects.topics.getIamPolicy',
      'pubsub.projects.topics.setIamPolicy',
      'pubsub.projects.subscriptions.get',
      'pubsub.projects.subscriptions.create',
      'gmail.users.watch',
    ]);
    const read = fake.calls.find((c) => c.discoveryId === 'pubsub.projects.topics.getIamPolicy')!;
    assert.equal(read.method, 'GET');
    assert.deepEqual(read.query, { 'options.requestedPolicyVersion': '3' });
    assert.equal(read.body, undefined);
    assert.equal(
      (fake.calls.find((c) => c.discoveryId === 'gmail.users.watch')!.body as Record<string, unknown>)
        .labelFilterBehavior,
      'include',
    );
  });

  it('a second run creates, updates and grants nothing, asks for no consent, and keeps the cursor', async () => {
    const before = accountRow(ws)!;
    // The operator pasted the printed section into the config: that step is unchanged too.
    writeConfig(ws, webhooksWith(printedSection(first.stdout), 'http://127.0.0.1:9'));
    // The mailbox moves on meanwhile: the watch answers a newer historyId, which must not become the cursor.
    fake.addEmail({ from: 'bob@example.com', subject: 'meanwhile', text: 'hi' });
    const from = fake.calls.length;
    const second = await runSetup(fake, ws, pushArgs(ws));
    assert.equal(second.code, 0, second.stderr);
    const calls = fake.calls.slice(from);
    assert.deepEqual(
      mutating(calls).map((c) => `${c.method} ${c.path}`),
      [],
    );
    assert.equal(second.authUrl, undefined, 'no authorisation URL printed');
    assert.ok(
      calls.some((c) => c.path === '/token' && (c.body as Record<string, string>).grant_type === 'refresh_token'),
      'the stored grant was used',
    );
    assert.deepEqual(
      stepLines(second.stdout).map(([, step, rest]) => `${step} ${rest.startsWith('(unchanged)')}`),
      ['authorise true', 'topic true', 'subscription true', 'watch true', 'config true'],
    );
    assert.doesNotMatch(second.stdout, /gmail: \{/, 'the section is not printed again');
    const after = accountRow(ws)!;
    assert.equal(after.cursor, before.cursor, 'cursor not moved');
    assert.ok(
      BigInt(fake.state.watches.get(ACCOUNT)!.historyId) > BigInt(before.cursor),
      'the watch did answer a newer historyId',
    );
    assert.match(second.stdout, /cursor \d+ \(kept\)/);
  });

  it('once a grant is stored, neither --credentials nor --project is needed: the project is the one kept with the grant', async () => {
    // No webhooks.gmail in the config either: the stored grant is the only place the project can come from.
    writeConfig(ws);
    try {
      const args = ['--mode', 'push', '--push-endpoint', PUSH_URL, '--push-service-account', PUSH_SERVICE_ACCOUNT];
      const plan = await runSetup(fake, ws, [...args, '--dry-run']);
      assert.equal(plan.code, 0, plan.stderr);
      assert.ok(plan.stdout.includes(`GET ${fake.url}v1/${TOPIC};`), plan.stdout);

      const from = fake.calls.length;
      const again = await runSetup(fake, ws, args);
      assert.equal(again.code, 0, again.stderr);
      assert.equal(again.authUrl, undefined, 'no consent asked');
      assert.deepEqual(
        mutating(fake.calls.slice(from)).map((c) => `${c.method} ${c.path}`),
        [],
      );
      assert.deepEqual(
        stepLines(again.stdout).map(([, step, rest]) => `${step} ${rest.startsWith('(unchanged)')}`),
        ['authorise true', 'topic true', 'subscription true', 'watch true', 'config false'],
      );
      assert.equal(printedSection(again.stdout).project, PROJECT);
      assert.deepEqual(contractRefusals(fake.calls.slice(from)), []);
    } finally {
      writeConfig(ws, webhooksWith(printedSection(first.stdout), 'http://127.0.0.1:9'));
    }
  });

  it('the refresh token and client secret are stored encrypted: neither is anywhere in the SQLite files', () => {
    const refresh = fake.calls.map((c) => (c.body as Record<string, string> | undefined)?.refresh_token).find(Boolean);
    assert.ok(refresh, 'the fake saw the refresh token');
    const sealed = accountRow(ws)!.sealed_grant as string;
    assert.match(sealed, /^v1:[\w-]+:[\w-]+:[\w-]+$/);
    const bytes = storageBytes(ws);
    assert.ok(bytes.includes(sealed), 'the sealed grant is in the files read');
    assert.equal(bytes.includes(refresh!), false, 'the refresh token is not stored in clear');
    assert.equal(bytes.includes(FAKE_CLIENT.clientSecret), false, 'the client secret is not stored in clear');
    assert.equal((first.stdout + first.stderr).includes(refresh!), false, 'nor printed');
  });

  it('a revoked grant is authorised again (the rest stays unchanged, the cursor kept)', async () => {
    const before = accountRow(ws)!;
    fake.revokeRefreshTokens();
    const from = fake.calls.length;
    const again = await runSetup(fake, ws, pushArgs(ws));
    assert.equal(again.code, 0, again.stderr);
    assert.ok(again.authUrl, 'consent asked again');
    assert.equal(again.browser!.loopbackStatus, 200);
    assert.deepEqual(
      mutating(fake.calls.slice(from)).map((c) => `${c.method} ${c.path}`),
      ['GET /o/oauth2/v2/auth', 'POST /token'],
    );
    assert.deepEqual(
      stepLines(again.stdout).map(([, step, rest]) => `${step} ${rest.startsWith('(unchanged)')}`),
      ['authorise false', 'topic true', 'subscription true', 'watch true', 'config true'],
    );
    const after = accountRow(ws)!;
    assert.notEqual(after.sealed_grant, before.sealed_grant, 'the new grant is stored');
    assert.equal(after.cursor, before.cursor);
  });
});

describe('gmail setup: output modes', () => {
  let fake: FakeGoogle;
  before(async () => (fake = await startFakeGoogle()));
  after(() => fake.close());

  it('--dry-run prints every planned call, calls Google not at all and writes nothing (no key needed)', async () => {
    const ws = workspace();
    const run = await runSetup(fake, ws, [...pushArgs(ws), '--dry-run'], { env: { GATEHOUSE_SECRET_KEY: undefined } });
    assert.equal(run.code, 0, run.stderr);
    assert.deepEqual(fake.calls, []);
    assert.equal(existsSync(ws.db), false, 'no storage written');
    assert.deepEqual(
      stepLines(run.stdout).map(([mark, step]) => `${mark} ${step}`),
      ['· authorise', '· topic', '· subscription', '· watch', '· config'],
    );
    assert.match(run.stdout, /dry run: nothing is changed/);
    assert.ok(run.stdout.includes(`PUT ${fake.url}v1/${TOPIC} if missing`));
    assert.ok(
      run.stdout.includes(`GET ${fake.url}v1/${TOPIC}:getIamPolicy?options.requestedPolicyVersion=3`),
      run.stdout,
    );
    assert.ok(run.stdout.includes('labelFilterBehavior: include }'), run.stdout);
    assert.ok(run.stdout.includes(`${TOPIC}:setIamPolicy if ${GMAIL_PUBLISHER} lacks roles/pubsub.publisher`));
    assert.ok(
      run.stdout.includes(
        `pushConfig { pushEndpoint: ${PUSH_URL}, oidcToken { serviceAccountEmail: ${PUSH_SERVICE_ACCOUNT}, audience: ${PUSH_URL} } }`,
      ),
    );
    assert.ok(run.stdout.includes(`POST ${fake.url}gmail/v1/users/me/watch`));
    assert.equal(printedSection(run.stdout).mode, 'push');
  });

  it('--json: one object on stdout (steps, section, next); the URL to open goes to stderr', async () => {
    const ws = workspace();
    const run = await runSetup(fake, ws, [...pushArgs(ws), '--json']);
    assert.equal(run.code, 0, run.stderr);
    assert.ok(run.stderr.includes(run.authUrl!.href), 'the URL was on stderr');
    const lines = run.stdout.trim().split('\n');
    assert.equal(lines.length, 1, run.stdout);
    const out = JSON.parse(lines[0]!);
    assert.deepEqual(Object.keys(out).sort(), ['dryRun', 'next', 'ok', 'section', 'steps']);
    assert.equal(out.ok, true);
    assert.equal(out.dryRun, false);
    assert.deepEqual(
      out.steps.map((s: { step: string; status: string }) => `${s.step}:${s.status}`),
      ['authorise:done', 'topic:done', 'subscription:done', 'watch:done', 'config:done'],
    );
    for (const s of out.steps) assert.equal(typeof s.detail, 'string');
    assert.deepEqual(out.section.push, {
      path: '/webhook/gmail',
      audience: PUSH_URL,
      serviceAccountEmail: PUSH_SERVICE_ACCOUNT,
    });
    assert.match(out.next, /gatehouse start/);
  });

  it('pull mode: a subscription without pushConfig, and a section without push', async () => {
    const ws = workspace();
    const run = await runSetup(fake, ws, [
      '--credentials',
      ws.credentials,
      '--mode',
      'pull',
      '--subscription',
      'gatehouse-gmail-pull',
    ]);
    assert.equal(run.code, 0, run.stderr);
    const sub = fake.state.subscriptions.get(`projects/${PROJECT}/subscriptions/gatehouse-gmail-pull`)!;
    assert.equal(sub.topic, TOPIC);
    assert.deepEqual(sub.pushConfig, {});
    assert.deepEqual(printedSection(run.stdout), {
      account: ACCOUNT,
      project: PROJECT,
      mode: 'pull',
      subscription: 'gatehouse-gmail-pull',
      googleApiUrl: fake.url,
    });
    assert.match(run.stdout, /✓ subscription\s+.*created \(pull\)/);
  });
});

describe('gmail setup: which endpoints it calls', () => {
  let fake: FakeGoogle;
  before(async () => (fake = await startFakeGoogle()));
  after(() => fake.close());

  /** A client_secret.json naming its own OAuth endpoints, as Google's download does. */
  const clientFileWith = (ws: Workspace, uris: { auth_uri: string; token_uri: string }) =>
    writeFileSync(
      ws.credentials,
      JSON.stringify({
        installed: {
          client_id: FAKE_CLIENT.clientId,
          client_secret: FAKE_CLIENT.clientSecret,
          project_id: FAKE_CLIENT.projectId,
          ...uris,
        },
      }),
    );
  const planned = (stdout: string, step: string) => stepLines(stdout).find(([, s]) => s === step)![2];

  it('webhooks.gmail.googleApiUrl in the config, without the flag: every call (OAuth, Pub/Sub, Gmail) goes there', async () => {
    const ws = workspace();
    // An egress proxy configured once, for setup and run alike.
    writeConfig(
      ws,
      webhooksWith(
        {
          account: ACCOUNT,
          project: PROJECT,
          mode: 'pull',
          subscription: 'gatehouse-gmail-pull',
          googleApiUrl: fake.url,
        },
        'http://127.0.0.1:9',
      ),
    );
    const from = fake.calls.length;
    const run = await runSetup(
      fake,
      ws,
      ['--credentials', ws.credentials, '--mode', 'pull', '--subscription', 'gatehouse-gmail-pull'],
      { flag: false, timeoutMs: 15_000 },
    );
    assert.equal(run.code, 0, run.stderr);
    assert.equal(run.authUrl!.origin, new URL(fake.url).origin, 'the consent page is the configured one');
    assert.deepEqual(methodsUsed(fake.calls.slice(from)), [
      'gmail.users.getProfile',
      'pubsub.projects.topics.get',
      'pubsub.projects.topics.create',
      'pubsub.projects.topics.getIamPolicy',
      'pubsub.projects.topics.setIamPolicy',
      'pubsub.projects.subscriptions.get',
      'pubsub.projects.subscriptions.create',
      'gmail.users.watch',
    ]);
    assert.ok(
      fake.calls.slice(from).some((c) => c.path === '/token'),
      'the code was exchanged there too',
    );
    // The printed section is the configured one: nothing to paste.
    assert.deepEqual(
      stepLines(run.stdout)
        .map(([mark, step, rest]) => `${mark} ${step} ${rest.startsWith('(unchanged)')}`)
        .at(-1),
      '✓ config true',
    );
  });

  it("the client file's auth_uri and token_uri are used for OAuth, unless googleApiUrl (the config key, then the flag) says otherwise", async () => {
    const ws = workspace();
    clientFileWith(ws, {
      auth_uri: 'https://oauth-proxy.example/o/oauth2/auth',
      token_uri: 'https://oauth-proxy.example/token',
    });
    const args = ['--credentials', ws.credentials, '--mode', 'pull', '--dry-run'];
    const from = fake.calls.length;
    const fromFile = await runSetup(fake, ws, args, { flag: false, env: { GATEHOUSE_SECRET_KEY: undefined } });
    assert.equal(fromFile.code, 0, fromFile.stderr);
    assert.match(
      planned(fromFile.stdout, 'authorise'),
      /open https:\/\/oauth-proxy\.example\/o\/oauth2\/auth .*POST https:\/\/oauth-proxy\.example\/token /,
    );
    assert.match(
      planned(fromFile.stdout, 'topic'),
      /^GET https:\/\/pubsub\.googleapis\.com\/v1\//,
      "the APIs stay Google's own",
    );

    writeConfig(
      ws,
      webhooksWith(
        { account: ACCOUNT, project: PROJECT, mode: 'pull', googleApiUrl: 'http://egress.example:3128/' },
        'http://127.0.0.1:9',
      ),
    );
    const fromConfig = await runSetup(fake, ws, args, { flag: false, env: { GATEHOUSE_SECRET_KEY: undefined } });
    assert.equal(fromConfig.code, 0, fromConfig.stderr);
    assert.match(
      planned(fromConfig.stdout, 'authorise'),
      /open http:\/\/egress\.example:3128\/o\/oauth2\/v2\/auth .*POST http:\/\/egress\.example:3128\/token /,
    );
    assert.match(planned(fromConfig.stdout, 'topic'), /^GET http:\/\/egress\.example:3128\/v1\//);

    const fromFlag = await runSetup(fake, ws, args, { env: { GATEHOUSE_SECRET_KEY: undefined } });
    assert.equal(fromFlag.code, 0, fromFlag.stderr);
    assert.match(planned(fromFlag.stdout, 'topic'), new RegExp(`^GET ${fake.url}v1/`));
    assert.deepEqual(fake.calls.slice(from), [], 'dry runs call nothing');
  });

  it('--google-api-url is in the help', async () => {
    const help = await runCli(['webhooks', 'gmail', 'setup', '--help']);
    assert.match(help.stdout, /--google-api-url <url>/);
  });
});

describe('gmail setup: refusals and failures name the step and the fix', () => {
  let fake: FakeGoogle;
  before(async () => (fake = await startFakeGoogle()));
  after(() => fake.close());

  it('without GATEHOUSE_SECRET_KEY: exit 1 before anything happens, saying how to make a key', async () => {
    const ws = workspace();
    const from = fake.calls.length;
    const run = await runSetup(fake, ws, pushArgs(ws), { env: { GATEHOUSE_SECRET_KEY: undefined } });
    assert.equal(run.code, 1);
    assert.match(run.stderr, /GATEHOUSE_SECRET_KEY is not set/);
    assert.match(run.stderr, /openssl rand -base64 32/);
    assert.equal(run.authUrl, undefined);
    assert.equal(fake.calls.length, from, 'no call to Google');
    assert.equal(existsSync(ws.db), false, 'no storage created');

    const short = await runSetup(fake, ws, pushArgs(ws), {
      env: { GATEHOUSE_SECRET_KEY: Buffer.alloc(16).toString('base64') },
    });
    assert.equal(short.code, 1);
    assert.match(short.stderr, /not 32 bytes of base64 \(got 16 bytes\).*openssl rand -base64 32/);
    assert.equal(fake.calls.length, from);
  });

  it('the Pub/Sub API disabled: step "topic" fails with the link that enables it', async () => {
    const ws = workspace();
    fake.disableApi('pubsub');
    try {
      const run = await runSetup(fake, ws, pushArgs(ws));
      assert.equal(run.code, 1);
      assert.match(run.stderr, /setup failed at step "topic"/);
      assert.ok(
        run.stderr.includes(`https://console.cloud.google.com/apis/library/pubsub.googleapis.com?project=${PROJECT}`),
        run.stderr,
      );
      assert.deepEqual(
        stepLines(run.stdout).map(([mark, step]) => `${mark} ${step}`),
        ['✓ authorise', '✗ topic'],
      );
      assert.equal(fake.state.topics.size, 0);
      assert.equal(fake.state.subscriptions.size, 0);
      assert.equal(fake.state.watches.size, 0);
    } finally {
      fake.disableApi('pubsub', false);
    }
  });

  it('consent denied: step "authorise" fails clearly; no token exchange, nothing stored or created', async () => {
    const ws = workspace();
    const from = fake.calls.length;
    fake.setConsent({ deny: true });
    try {
      const run = await runSetup(fake, ws, pushArgs(ws));
      assert.equal(run.code, 1);
      assert.equal(run.browser!.location.searchParams.get('error'), 'access_denied');
      assert.match(run.browser!.loopbackPage, /refused/);
      assert.match(
        run.stderr,
        /setup failed at step "authorise": Google answered "access_denied": the consent was not given/,
      );
      assert.deepEqual(
        fake.calls.slice(from).map((c) => c.path),
        ['/o/oauth2/v2/auth'],
      );
      assert.equal(accountRow(ws), undefined);
    } finally {
      fake.setConsent({ deny: false });
    }
  });

  it('signing in as another account is refused: nothing stored, nothing created', async () => {
    const ws = workspace();
    fake.setConsent({ account: 'mallory@example.com' });
    try {
      const run = await runSetup(fake, ws, pushArgs(ws));
      assert.equal(run.code, 1);
      assert.match(run.stderr, /step "authorise": you signed in as mallory@example\.com, not alice@example\.com/);
      assert.equal(accountRow(ws), undefined);
      assert.equal(fake.state.topics.size, 0);
    } finally {
      fake.setConsent({ account: ACCOUNT });
    }
  });

  it("an HTML error page (Google's front end, a proxy) is reported as status and request, with a hint for it, never as HTML", async () => {
    const ws = workspace();
    const html = /<!DOCTYPE|<html|<title|That’s an error/i;
    // A 404 page for the topic: not "the topic is missing" (nothing is created), not "check the project id".
    fake.failNext({ method: 'GET', path: `/v1/${TOPIC}` }, { status: 404, message: '', html: true });
    const from = fake.calls.length;
    const missing = await runSetup(fake, ws, pushArgs(ws));
    assert.equal(missing.code, 1);
    assert.match(
      missing.stderr,
      new RegExp(
        `setup failed at step "topic": Google answered 404 Not Found to GET ${fake.url}v1/${TOPIC}\\. That server serves no such URL: check webhooks\\.gmail\\.googleApiUrl \\(or --google-api-url\\)`,
      ),
    );
    assert.doesNotMatch(missing.stderr + missing.stdout, html);
    assert.doesNotMatch(missing.stderr, /project id/);
    assert.deepEqual(
      fake.calls.slice(from).filter((c) => c.method === 'PUT'),
      [],
      'an HTML 404 is not taken for a missing topic',
    );
    assert.equal(fake.state.topics.size, 0);

    // The same for the IAM read, and a 502 page while creating the subscription: try again later.
    fake.failNext({ method: 'GET', path: `/v1/${TOPIC}:getIamPolicy` }, { status: 404, message: '', html: true });
    const iam = await runSetup(fake, ws, pushArgs(ws));
    assert.equal(iam.code, 1);
    assert.ok(
      iam.stderr.includes(
        `setup failed at step "topic": Google answered 404 Not Found to GET ${fake.url}v1/${TOPIC}:getIamPolicy.`,
      ),
      iam.stderr,
    );
    assert.doesNotMatch(iam.stderr, html);

    fake.failNext({ method: 'PUT', path: `/v1/${PUSH_SUBSCRIPTION}` }, { status: 502, message: '', html: true });
    const down = await runSetup(fake, ws, pushArgs(ws));
    assert.equal(down.code, 1);
    assert.ok(
      down.stderr.includes(
        `setup failed at step "subscription": Google answered 502 Bad Gateway to PUT ${fake.url}v1/${PUSH_SUBSCRIPTION}. The server in between could not answer for now: run setup again in a minute`,
      ),
      down.stderr,
    );
    assert.doesNotMatch(down.stderr, html);
  });
});
