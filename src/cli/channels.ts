import type { Command } from 'commander';
import { loginChannel } from '../integrations/channels/login.js';
import { telegram } from '../integrations/channels/platforms.js';
import type { ChannelStore } from '../integrations/channels/state.js';
import { describeChannels } from '../integrations/channels/status.js';
import { loadConfig } from '../config/load.js';
import type { ChannelConfig, Config } from '../config/schema.js';
import { platformOf } from '../integrations/channels/inbound.js';
import { UsageError } from '../errors.js';
import { secretKeysFromEnv } from '../storage/secrets.js';
import { describeStorage, openChannelStore } from '../storage/open.js';
import { unreachable } from './storage.js';
import { toJsonWithIsoDates } from '../admin/json.js';
import { describeTime, openBrowser } from './terminal.js';
import { DEFAULT_CONFIG_FILE } from './config.js';

/**
 * `gatehouse channels login|list|status|logout|devices|revoke`: each channel's ceremony and its
 * state, in the same storage the running servers read (a login takes effect without a restart).
 */
export function registerChannelsCommands(program: Command): void {
  const channels = program
    .command('channels')
    .description('messaging channels: log in, see their state, manage paired devices');
  const configOption = ['-c, --config <file>', 'config file', DEFAULT_CONFIG_FILE] as const;

  const open = async (
    file: string,
    name: string | undefined,
    role: 'setup' | 'cli',
  ): Promise<{ config: Config; store: ChannelStore; channel?: ChannelConfig }> => {
    const { config } = loadConfig(file);
    const channel = name !== undefined && Object.hasOwn(config.channels, name) ? config.channels[name] : undefined;
    if (name !== undefined && !channel) {
      const known = Object.keys(config.channels);
      throw new UsageError(
        `no channel "${name}" in ${file}${known.length ? ` (configured: ${known.join(', ')})` : ' (no channels configured)'}`,
      );
    }
    const store = await openChannelStore(config.storage, { role }).catch(unreachable(describeStorage(config.storage)));
    return { config, store, channel };
  };
  /** Runs `work` with the config, the channel (when named) and the store (made when missing only for `setup`: a login), closing the store after. */
  const withChannels = async (
    file: string,
    name: string | undefined,
    work: (opened: Awaited<ReturnType<typeof open>>) => unknown,
    role: 'setup' | 'cli' = 'cli',
  ): Promise<void> => {
    const opened = await open(file, name, role);
    try {
      await work(opened);
    } finally {
      await opened.store.close();
    }
  };

  channels
    .command('login <name>')
    .description("run the channel's authentication ceremony (QR pairing, bot token, OAuth)")
    .option(...configOption)
    .option('--no-browser', 'print the authorisation URL only (headless)')
    .option(
      '--public',
      "OAuth kinds: receive the answer on the running server's /webhook/channels/<name>/oauth/callback (needs the channel's publicUrl)",
      false,
    )
    .option(
      '--port <port>',
      "OAuth kinds: the loopback redirect's port (register http://127.0.0.1:<port>/ with the platform)",
    )
    .option('--timeout <minutes>', 'how long to wait for the browser or the device', '10')
    .action(
      async (
        name: string,
        o: { config: string; browser: boolean; public: boolean; port?: string; timeout: string },
      ) => {
        const secretKeys = secretKeysFromEnv(); // refuse before any ceremony: nothing could be stored
        const loopbackPort = o.port === undefined ? undefined : Number(o.port);
        if (loopbackPort !== undefined && !(Number.isInteger(loopbackPort) && loopbackPort > 0 && loopbackPort < 65536))
          throw new UsageError(`--port must be a TCP port (got "${o.port}")`);
        const minutes = Number(o.timeout);
        // At most a timer's reach (2^31 - 1 ms, 24 days): past it Node fires at once and the login "timed out".
        if (!(minutes > 0 && minutes * 60_000 <= 2 ** 31 - 1))
          throw new UsageError(`--timeout must be a number of minutes above 0, at most 35791 (got "${o.timeout}")`);
        return withChannels(
          o.config,
          name,
          async ({ config, store, channel }) => {
            const { host, port } = config.webhooks.listen;
            process.stdout.write(`channel ${name} (${channel!.kind}, ${platformOf(channel!)})\n`);
            await loginChannel({
              name,
              channel: channel!,
              store,
              secretKeys,
              webhookBaseUrl: `http://${host.includes(':') ? `[${host}]` : host}:${port}`,
              browser: o.browser,
              publicCallback: o.public,
              loopbackPort,
              timeoutMs: minutes * 60_000,
              io: {
                step: (ok, step, detail) => process.stdout.write(`  ${ok ? '✓' : '✗'} ${step.padEnd(10)} ${detail}\n`),
                say: (text) => process.stdout.write(`${text}\n`),
                openBrowser,
              },
            });
            process.stdout.write(`channel ${name} connected\n`);
          },
          'setup',
        );
      },
    );

  channels
    .command('list')
    .description('every configured channel and whether it is connected')
    .option(...configOption)
    .option('--json', 'one JSON array', false)
    .action((o: { config: string; json: boolean }) => {
      return withChannels(o.config, undefined, async ({ config, store }) => {
        const rows = await describeChannels(config.channels, store);
        if (o.json) return void process.stdout.write(`${toJsonWithIsoDates(rows)}\n`);
        if (rows.length === 0) return void process.stdout.write('no channels configured\n');
        for (const r of rows)
          process.stdout.write(
            `${r.name.padEnd(16)} ${r.kind.padEnd(10)} ${String(r.platform).padEnd(9)} ${r.connected ? `connected since ${iso(r.connectedAt)}` : 'NOT CONNECTED'}${r.lastError ? `  last error: ${r.lastError}` : ''}\n`,
          );
      });
    });

  channels
    .command('status [name]')
    .description('connected or not, since when, the last event and the last error (all channels, or one)')
    .option(...configOption)
    .option('--json', 'one JSON array', false)
    .action((name: string | undefined, o: { config: string; json: boolean }) => {
      return withChannels(o.config, name, async ({ config, store }) => {
        const rows = await describeChannels(config.channels, store, name);
        if (o.json) return void process.stdout.write(`${toJsonWithIsoDates(rows)}\n`);
        if (rows.length === 0) return void process.stdout.write('no channels configured\n');
        const now = Date.now();
        for (const r of rows) {
          process.stdout.write(
            [
              `${r.connected ? '✓' : '✗'} ${r.name} (${r.kind}, ${r.platform}): ${r.connected ? `connected since ${when(r.connectedAt, now)}` : `not connected: run \`gatehouse channels login ${r.name}\``}`,
              ...Object.entries(r.details)
                .filter(([, v]) => v !== undefined && v !== null)
                .map(([k, v]) => `    ${k.padEnd(14)} ${typeof v === 'object' ? JSON.stringify(v) : String(v)}`),
              ...(r.expiresAt !== null ? [`    ${'expires'.padEnd(14)} ${when(r.expiresAt, now)}`] : []),
              `    ${'last event'.padEnd(14)} ${when(r.lastEventAt, now)}`,
              `    ${'last error'.padEnd(14)} ${r.lastError ? `${r.lastError} (${when(r.lastErrorAt, now)})` : 'none'}`,
            ].join('\n') + '\n',
          );
        }
      });
    });

  channels
    .command('logout <name>')
    .description("forget the channel's stored grant (and revoke its devices); a Telegram webhook is removed")
    .option(...configOption)
    .action(async (name: string, o: { config: string }) => {
      return withChannels(o.config, name, async ({ store, channel }) => {
        if (channel!.kind === 'bot-token') {
          await telegram
            .deleteWebhook(channel!.apiBaseUrl, channel!.botToken)
            .catch((err: Error) =>
              process.stderr.write(`warning: deleteWebhook failed (${err.message}); the grant is forgotten anyway\n`),
            );
        }
        await store.forget(name, Date.now());
        process.stdout.write(`channel ${name}: logged out\n`);
      });
    });

  channels
    .command('devices <name>')
    .description('devices paired with a qr channel')
    .option(...configOption)
    .option('--json', 'one JSON array', false)
    .action((name: string, o: { config: string; json: boolean }) => {
      return withChannels(o.config, name, async ({ store, channel }) => {
        if (channel!.kind !== 'qr')
          throw new UsageError(`channel ${name} is ${channel!.kind}: only qr channels have devices`);
        const devices = await store.devices(name);
        if (o.json) return void process.stdout.write(`${toJsonWithIsoDates(devices)}\n`);
        if (devices.length === 0)
          return void process.stdout.write(`no devices: pair one with \`gatehouse channels login ${name}\`\n`);
        for (const d of devices)
          process.stdout.write(
            `${d.id}  ${d.name.padEnd(24)} ${d.revokedAt ? `revoked ${iso(d.revokedAt)}` : 'active'}  paired ${iso(d.createdAt)}  last seen ${d.lastSeenAt ? iso(d.lastSeenAt) : 'never'}\n`,
          );
      });
    });

  channels
    .command('revoke <name> <device>')
    .description('revoke a paired device (by id or name): its token fails from the next request')
    .option(...configOption)
    .action((name: string, device: string, o: { config: string }) => {
      return withChannels(o.config, name, async ({ store }) => {
        const revoked = await store.revoke(name, device, Date.now());
        if (revoked === 0)
          throw new UsageError(
            `no active device "${device}" on channel ${name} (see \`gatehouse channels devices ${name}\`)`,
          );
        process.stdout.write(`revoked ${revoked} device${revoked === 1 ? '' : 's'}\n`);
      });
    });
}

const iso = (t: number | null) => (t === null ? 'never' : new Date(t).toISOString());
const when = describeTime;
