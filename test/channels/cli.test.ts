/**
 * The channels CLI around the ceremonies: `login` refuses without GATEHOUSE_SECRET_KEY (and says
 * how to make one) before any platform call, `list` and `status` tell at a glance which channels
 * are connected and since when (human and --json), and mistakes in names are refused with the fix.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import {
  DISCORD_CLIENT,
  SLACK_CLIENT,
  startFakeDiscord,
  startFakeSlack,
  startFakeTelegram,
  type FakeDiscord,
  type FakeSlack,
  type FakeTelegram,
} from '../helpers/fake-chat.js';
import { runCli } from '../helpers/process.js';
import {
  channelsCli,
  startLogin,
  storedGrant,
  withDatabase,
  removeWorkspace,
  workspace,
  writeConfig,
  type Workspace,
} from './helpers.js';

describe('channels CLI', () => {
  let ws: Workspace;
  let telegram: FakeTelegram;
  let discord: FakeDiscord;
  let slack: FakeSlack;
  const allCalls = () => telegram.calls.length + discord.calls.length + slack.calls.length;

  before(async () => {
    [telegram, discord, slack, ws] = await Promise.all([
      startFakeTelegram(),
      startFakeDiscord(),
      startFakeSlack(),
      workspace('channels-cli'),
    ]);
    writeConfig(ws, {
      channels: {
        phone: { kind: 'qr', action: 'message' },
        tg: {
          kind: 'bot-token',
          platform: 'telegram',
          botToken: telegram.token,
          publicUrl: ws.webhookUrl,
          apiBaseUrl: telegram.url,
        },
        discord: {
          kind: 'oauth-bot',
          platform: 'discord',
          clientId: DISCORD_CLIENT.clientId,
          clientSecret: DISCORD_CLIENT.clientSecret,
          botToken: discord.botToken,
          publicKey: discord.publicKeyHex,
          permissions: '2048',
          apiBaseUrl: `${discord.url}/api/v10`,
          authorizeUrl: `${discord.url}/oauth2/authorize`,
          tokenUrl: `${discord.url}/api/oauth2/token`,
        },
        slack: {
          kind: 'oauth',
          platform: 'slack',
          clientId: SLACK_CLIENT.clientId,
          clientSecret: SLACK_CLIENT.clientSecret,
          signingSecret: SLACK_CLIENT.signingSecret,
          scopes: ['chat:write', 'channels:history'],
          apiBaseUrl: `${slack.url}/api`,
          authorizeUrl: `${slack.url}/oauth/v2/authorize`,
          tokenUrl: `${slack.url}/api/oauth.v2.access`,
        },
      },
      // Nothing listens there: these tests need no server.
      targetUrl: 'http://127.0.0.1:9',
      upstreamUrl: 'http://127.0.0.1:9',
    });
  });
  after(async () => {
    await Promise.all([telegram?.close(), discord?.close(), slack?.close()]);
    removeWorkspace(ws);
  });

  it('config check refuses channels without a usable GATEHOUSE_SECRET_KEY, as start would (one line; --json names the environment)', async () => {
    const check = (key: string, json = false) =>
      runCli(['config', 'check', '--config', ws.config, ...(json ? ['--json'] : [])], {
        env: { ...ws.env, GATEHOUSE_SECRET_KEY: key },
      });
    const missing = await check('');
    assert.equal(missing.code, 1);
    assert.match(
      missing.stderr.trim(),
      /^gatehouse: GATEHOUSE_SECRET_KEY is not set\. .*Make one with `openssl rand -base64 32`/,
    );
    assert.equal(missing.stderr.trim().split('\n').length, 1, missing.stderr);
    const short = await check(Buffer.alloc(16, 7).toString('base64'), true);
    assert.equal(short.code, 1);
    const report = JSON.parse(short.stdout);
    assert.equal(report.ok, false);
    assert.equal(report.problems[0].path, '(environment)');
    assert.match(report.problems[0].message, /not 32 bytes of base64 \(got 16 bytes\)/);
    const good = await check(ws.env.GATEHOUSE_SECRET_KEY!);
    assert.equal(good.code, 0, good.stderr);
  });

  it('login without GATEHOUSE_SECRET_KEY (or with a malformed one) refuses for every kind, says how to make a key, and calls no platform', async () => {
    const runs = await Promise.all([
      ...['phone', 'tg', 'discord'].map((name) => startLogin(ws, name, { env: { GATEHOUSE_SECRET_KEY: '' } }).exited),
      startLogin(ws, 'slack', { env: { GATEHOUSE_SECRET_KEY: Buffer.alloc(16, 7).toString('base64') } }).exited,
    ]);
    for (const [i, run] of runs.entries()) {
      assert.equal(run.code, 1, run.stdout);
      assert.match(
        run.stderr,
        i < 3 ? /GATEHOUSE_SECRET_KEY is not set\./ : /GATEHOUSE_SECRET_KEY is not 32 bytes of base64 \(got 16 bytes\)/,
      );
      assert.match(run.stderr, /Make one with `openssl rand -base64 32`/);
      assert.doesNotMatch(run.stdout, /oauth|pairing code|http:/, 'a ceremony started');
    }
    assert.equal(allCalls(), 0, 'a platform was called');
    // Nothing stored, not even a pairing code.
    const pairings = !existsSync(ws.db)
      ? 0
      : withDatabase(ws, (db) => {
          const table = db.prepare("SELECT name FROM sqlite_master WHERE name = 'channel_pairings'").get();
          return table ? (db.prepare('SELECT count(*) AS n FROM channel_pairings').get() as { n: number }).n : 0;
        });
    assert.equal(pairings, 0);
  });

  it('list and status show at a glance which channels are connected, and since when (human and --json)', async () => {
    const login = await startLogin(ws, 'tg').exited;
    assert.equal(login.code, 0, login.stderr);
    const since = Date.now();

    const [list, listJson, status, statusJson] = await Promise.all([
      channelsCli(ws, ['list']),
      channelsCli(ws, ['list', '--json']),
      channelsCli(ws, ['status']),
      channelsCli(ws, ['status', '--json']),
    ]);
    for (const run of [list, listJson, status, statusJson]) assert.equal(run.code, 0, run.stderr);

    const lines = list.stdout.trimEnd().split('\n');
    assert.equal(lines.length, 4);
    assert.match(
      lines.find((l) => l.startsWith('tg '))!,
      /^tg\s+bot-token\s+telegram\s+connected since \d{4}-\d\d-\d\dT[\d:.]+Z$/,
    );
    for (const [name, kind, platform] of [
      ['phone', 'qr', 'device'],
      ['discord', 'oauth-bot', 'discord'],
      ['slack', 'oauth', 'slack'],
    ]) {
      assert.match(
        lines.find((l) => l.startsWith(`${name} `))!,
        new RegExp(`^${name}\\s+${kind}\\s+${platform}\\s+NOT CONNECTED$`),
      );
    }

    const rows = new Map<string, any>(JSON.parse(listJson.stdout).map((r: any) => [r.name, r]));
    assert.deepEqual([...rows.keys()].sort(), ['discord', 'phone', 'slack', 'tg']);
    assert.equal(rows.get('tg').connected, true);
    assert.ok(Math.abs(Date.parse(rows.get('tg').connectedAt) - since) < 10_000, 'connectedAt is an ISO 8601 date');
    assert.equal(rows.get('tg').lastError, null);
    for (const name of ['phone', 'discord', 'slack']) assert.equal(rows.get(name).connected, false, name);
    assert.deepEqual(JSON.parse(statusJson.stdout), JSON.parse(listJson.stdout));

    assert.match(status.stdout, /^✓ tg \(bot-token, telegram\): connected since \d{4}-.*\(\d+ s ago\)$/m);
    assert.match(status.stdout, /^ {4}last error {5}none$/m);
    for (const [name, kind, platform] of [
      ['phone', 'qr', 'device'],
      ['discord', 'oauth-bot', 'discord'],
      ['slack', 'oauth', 'slack'],
    ]) {
      assert.match(
        status.stdout,
        new RegExp(
          `^✗ ${name} \\(${kind}, ${platform}\\): not connected: run \`gatehouse channels login ${name}\`$`,
          'm',
        ),
      );
    }
  });

  it('an unknown channel name, or devices of a non-qr channel: exit 1 with the fix', async () => {
    const [unknown, devices] = await Promise.all([
      channelsCli(ws, ['status', 'nope']),
      channelsCli(ws, ['devices', 'tg']),
    ]);
    assert.equal(unknown.code, 1);
    assert.match(unknown.stderr, /no channel "nope" in .*gatehouse\.json5 \(configured: phone, tg, discord, slack\)/);
    assert.equal(devices.code, 1);
    assert.match(devices.stderr, /channel tg is bot-token: only qr channels have devices/);
    assert.equal(storedGrant(ws, 'nope'), undefined);
  });
});
