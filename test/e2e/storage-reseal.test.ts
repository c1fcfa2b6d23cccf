import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import type { StorageConfig } from '../../src/config/schema.js';
import {
  channelGrantContext,
  gmailGrantContext,
  openSealed,
  sealSecret,
  type SecretKeys,
} from '../../src/storage/secrets.js';
import { openChannelStore, openEventStore, openGmailStore } from '../../src/storage/open.js';
import { postgresDatabases } from '../helpers/postgres.js';
import { runCli } from '../helpers/process.js';

// `gatehouse storage reseal`: the end of a GATEHOUSE_SECRET_KEY rotation, on either driver.

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-reseal-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const cluster = await postgresDatabases();
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

const OLD = randomBytes(32);
const NEW = randomBytes(32);
const b64 = (key: Buffer) => key.toString('base64');
const only = (key: Buffer): SecretKeys => ({ current: key, previous: [] });

/** A store holding a Gmail grant and two channel grants sealed under OLD, and one channel grant already under NEW. */
async function seed(storage: StorageConfig): Promise<void> {
  const events = await openEventStore(storage, { role: 'setup' });
  const channels = await openChannelStore(storage, { role: 'server' });
  try {
    await openGmailStore(events).saveGrant(
      'ana@example.com',
      'client',
      sealSecret('{"refreshToken":"1//ana"}', only(OLD), gmailGrantContext('ana@example.com')),
      'project',
    );
    for (const [name, key] of [
      ['tg', OLD],
      ['discord', OLD],
      ['slack', NEW],
    ] as const) {
      await channels.saveGrant(
        {
          name,
          kind: 'bot-token',
          sealed: sealSecret(`{"token":"${name}"}`, only(key), channelGrantContext(name)),
          details: {},
          expiresAt: null,
        },
        Date.now(),
      );
    }
  } finally {
    await channels.close();
    await events.close();
  }
}

/** Every stored grant opened with `keys` alone: what it holds, or the error. */
async function openAll(storage: StorageConfig, keys: SecretKeys): Promise<Record<string, string>> {
  const events = await openEventStore(storage, { role: 'cli' });
  const channels = await openChannelStore(storage, { role: 'cli' });
  const attempt = (sealed: string, context: string) => {
    try {
      return openSealed(sealed, keys, context).plaintext;
    } catch {
      return 'unreadable';
    }
  };
  try {
    const opened: Record<string, string> = {};
    for (const g of await openGmailStore(events).sealedGrants())
      opened[g.account] = attempt(g.sealed, gmailGrantContext(g.account));
    for (const g of await channels.grants()) opened[g.name] = attempt(g.sealed, channelGrantContext(g.name));
    return opened;
  } finally {
    await channels.close();
    await events.close();
  }
}

const ALL_OPEN = {
  'ana@example.com': '{"refreshToken":"1//ana"}',
  discord: '{"token":"discord"}',
  slack: '{"token":"slack"}',
  tg: '{"token":"tg"}',
};

for (const driver of ['sqlite', 'postgres'] as const) {
  describe(
    `storage reseal (${driver})`,
    { skip: driver === 'postgres' && 'skip' in cluster ? cluster.skip : false },
    () => {
      it('refuses, changing nothing, while a grant opens with none of the keys; with the old key in GATEHOUSE_SECRET_KEY_PREVIOUS, seals every grant under the new key; a second run finds nothing left', async () => {
        const storage: StorageConfig =
          driver === 'sqlite'
            ? { driver, path: path.join(dir, 'reseal.db') }
            : {
                driver,
                url: await (cluster as { createDatabase(): Promise<string> }).createDatabase(),
                pool: { max: 2 },
              };
        await seed(storage);
        const config = path.join(dir, `${driver}.json5`);
        writeFileSync(config, JSON.stringify({ storage, gateway: { upstream: { target: 'http://127.0.0.1:9' } } }));
        const reseal = (env: Record<string, string>, ...flags: string[]) =>
          runCli(['storage', 'reseal', '--config', config, ...flags], {
            env: { GATEHOUSE_SECRET_KEY_PREVIOUS: '', ...env },
          });

        // The new key alone: three grants are sealed under the old one. Named, and nothing written.
        const refused = await reseal({ GATEHOUSE_SECRET_KEY: b64(NEW) });
        assert.equal(refused.code, 1, refused.stderr);
        assert.match(
          refused.stderr,
          /nothing resealed: 3 stored secret\(s\) open with none of the keys given \(put the key they were sealed with in GATEHOUSE_SECRET_KEY_PREVIOUS\)/,
        );
        for (const what of ['Gmail account ana@example.com', 'channel discord', 'channel tg'])
          assert.match(refused.stderr, new RegExp(`${what}: cannot decrypt`));
        assert.doesNotMatch(refused.stderr, /channel slack/);
        assert.deepEqual(await openAll(storage, only(OLD)), { ...ALL_OPEN, slack: 'unreadable' }, 'nothing changed');

        const done = await reseal(
          { GATEHOUSE_SECRET_KEY: b64(NEW), GATEHOUSE_SECRET_KEY_PREVIOUS: b64(OLD) },
          '--json',
        );
        assert.equal(done.code, 0, done.stderr);
        assert.deepEqual(JSON.parse(done.stdout), {
          storage: JSON.parse(done.stdout).storage,
          stored: 4,
          resealed: 3,
          alreadyCurrent: 1,
          changedMeanwhile: 0,
          gmail: 1,
          channels: 2,
          allUnderCurrentKey: true,
        });
        assert.deepEqual(await openAll(storage, only(NEW)), ALL_OPEN, 'every grant opens with the new key alone');
        assert.deepEqual(await openAll(storage, only(OLD)), {
          'ana@example.com': 'unreadable',
          discord: 'unreadable',
          slack: 'unreadable',
          tg: 'unreadable',
        });

        const again = await reseal({ GATEHOUSE_SECRET_KEY: b64(NEW) });
        assert.equal(again.code, 0, again.stderr);
        assert.match(
          again.stdout,
          /: 0 of 4 stored secret\(s\) sealed again under GATEHOUSE_SECRET_KEY \(Gmail 0, channels 0\); 4 already were\n$/,
        );

        const noKey = await reseal({ GATEHOUSE_SECRET_KEY: '' });
        assert.equal(noKey.code, 1);
        assert.match(noKey.stderr, /GATEHOUSE_SECRET_KEY is not set/);
      });
    },
  );
}
