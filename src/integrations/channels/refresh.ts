import type { Logger } from 'pino';
import type { Config } from '../../config/schema.js';
import { channelGrantContext, openSecret, sealSecret, type SecretKeys } from '../../storage/secrets.js';
import type { SealedGrant } from './login.js';
import { refreshGrant } from './platforms.js';
import type { ChannelGrant, ChannelStore } from './state.js';

/** A grant is refreshed once it has less than this left (Discord's last a week). */
export const REFRESH_AHEAD_MS = 24 * 60 * 60 * 1000;
const CHECK_EVERY_MS = 60 * 60 * 1000;

/**
 * Keeps `oauth-bot` grants alive: at start and every hour, a grant expiring within a day is
 * refreshed at the platform's token URL and stored sealed again. A failure is logged at error
 * level and recorded for `channels status`; the next check tries again.
 */
export function startGrantRefresher(
  initial: Config,
  deps: { store: ChannelStore; secretKeys: SecretKeys; logger: Logger; now?: () => number },
): { close(): Promise<void>; reconfigure(next: Config): void; refreshDue(): Promise<void> } {
  const now = deps.now ?? Date.now;
  let config = initial;
  let closed = false;
  // One pass at a time: Discord rotates refresh tokens, so two passes would race on the same one.
  let running: Promise<void> | undefined;
  function refreshDue(): Promise<void> {
    running ??= refreshPass()
      .catch((err: Error) => deps.logger.error({ problem: err.message }, 'channel grant refresh pass failed'))
      .finally(() => (running = undefined));
    return running;
  }
  async function refreshPass(): Promise<void> {
    for (const [name, channel] of Object.entries(config.channels)) {
      if (closed) return;
      if (channel.kind !== 'oauth-bot') continue;
      const due = (grant: ChannelGrant) => grant.expiresAt !== null && grant.expiresAt - now() <= REFRESH_AHEAD_MS;
      try {
        // Under the grant's lock: of several instances, one asks the platform, the others find its result.
        const { refreshed, grant } = await deps.store.refreshGrant(name, due, async (current) => {
          const sealed = JSON.parse(
            openSecret(current.sealed, deps.secretKeys, channelGrantContext(name)),
          ) as SealedGrant;
          if (sealed.kind !== 'oauth-bot') throw new Error('stored grant is not an oauth-bot grant');
          const tokens = await refreshGrant('discord', channel.tokenUrl, {
            clientId: channel.clientId,
            clientSecret: channel.clientSecret,
            refreshToken: sealed.refreshToken,
          });
          const next: SealedGrant = {
            kind: 'oauth-bot',
            accessToken: tokens.access_token,
            refreshToken: tokens.refresh_token ?? sealed.refreshToken,
          };
          return {
            sealed: sealSecret(JSON.stringify(next), deps.secretKeys, channelGrantContext(name)),
            expiresAt: tokens.expires_in ? now() + Number(tokens.expires_in) * 1000 : null,
          };
        });
        if (refreshed)
          deps.logger.info(
            { channel: name, expiresAt: grant?.expiresAt && new Date(grant.expiresAt).toISOString() },
            'channel grant refreshed',
          );
      } catch (err) {
        if (closed) return;
        const problem = `grant refresh failed: ${(err as Error).message}`;
        await deps.store.noteError(name, problem, now()).catch(() => undefined);
        deps.logger.error(
          { channel: name, problem },
          `CHANNEL GRANT REFRESH FAILED: run \`gatehouse channels login ${name}\` if it keeps failing`,
        );
      }
    }
  }
  void refreshDue();
  const timer = setInterval(() => void refreshDue(), CHECK_EVERY_MS);
  timer.unref();
  return {
    /** Stops the checks and waits for a pass in progress (the store closes after). */
    async close() {
      closed = true;
      clearInterval(timer);
      await running;
    },
    /** After a reload: the channels as now configured (new ones are checked at once). */
    reconfigure(next) {
      config = next;
      void refreshDue();
    },
    refreshDue,
  };
}
