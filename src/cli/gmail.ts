import { Option, type Command } from 'commander';
import { loadConfig } from '../config/load.js';
import { UsageError } from '../errors.js';
import { MemoryLockoutStore } from '../http/lockout.js';
import { runGmailSetup, formatSection, type SetupStep } from '../integrations/gmail/setup.js';
import type { GmailAccountState } from '../integrations/gmail/state.js';
import { describeGmailAccount } from '../integrations/gmail/status.js';
import { createLogger } from '../observability/log.js';
import { secretKeysFromEnv } from '../storage/secrets.js';
import { startWebhooks } from '../runtime/server.js';
import { describeStorage, openEventStore, openGmailStore } from '../storage/open.js';
import { unreachable } from './storage.js';
import { DEFAULT_CONFIG_FILE } from './config.js';
import { toJsonWithIsoDates } from '../admin/json.js';
import { describeTime, openBrowser } from './terminal.js';

const MARK: Record<SetupStep['status'], string> = { done: '✓', unchanged: '✓', planned: '·', failed: '✗' };

/** `gatehouse webhooks gmail setup | run | status` (see src/integrations/gmail/). */
export function registerGmailCommands(webhooks: Command): void {
  const gmail = webhooks.command('gmail').description('new Gmail messages as actions, through Pub/Sub');

  gmail
    .command('setup')
    .description('authorise a Gmail account, create the Pub/Sub topic and subscription, start the watch')
    .requiredOption('--account <email>', 'the Gmail address to watch')
    .option('-c, --config <file>', 'config file (storage.path; its webhooks.gmail is compared)', DEFAULT_CONFIG_FILE)
    .option('--project <id>', 'Google Cloud project (default: project_id of the credentials file)')
    .option('--credentials <client_secret.json>', 'OAuth client of type "Desktop app"')
    .option('--topic <name>', 'Pub/Sub topic', 'gatehouse-gmail')
    .option('--subscription <name>', 'Pub/Sub subscription', 'gatehouse-gmail-push')
    .addOption(
      new Option('--mode <mode>', 'push: Pub/Sub POSTs to gatehouse; pull: gatehouse polls')
        .choices(['push', 'pull'])
        .default('push'),
    )
    .option(
      '--push-endpoint <url>',
      'push: the public https URL of the Gmail route (e.g. https://hooks.example.com/webhook/gmail)',
    )
    .option('--push-service-account <email>', 'push: the service account Pub/Sub signs its OIDC tokens as')
    .option('--label <label>', 'watch this label (repeatable)', (value: string, previous: string[] | undefined) => [
      ...(previous ?? []),
      value,
    ])
    .addOption(
      new Option('--action <action>', 'the action each email becomes').choices(['message', 'agent']).default('message'),
    )
    .option('--template <text>', 'the action\'s message, e.g. "New email from {{from}}: {{subject}}"')
    .option('--include-body', 'add the text body (cut to --max-bytes)', false)
    .option('--max-bytes <n>', 'body size limit', '20000')
    .option('--renew-minutes <n>', 'renew the watch this often', '720')
    .option('--reauthorize', 'authorise again even when the stored grant works', false)
    .option('--no-browser', 'print the authorisation URL only (headless)')
    .option('--dry-run', 'print every API call it would make; change nothing', false)
    .option('--json', 'one JSON object on stdout (the URL to open goes to stderr)', false)
    .option(
      '--google-api-url <url>',
      'one base URL for every Google endpoint, e.g. an egress proxy (default: webhooks.gmail.googleApiUrl of --config)',
    )
    .action(async (o: Record<string, any>) => {
      const { config, file } = loadConfig(o.config);
      const positive = (name: string, value: string) => {
        const n = Number(value);
        if (!Number.isInteger(n) || n < 1)
          throw new UsageError(`--${name} must be a positive integer (got "${value}")`);
        return n;
      };
      const options = {
        account: o.account,
        project: o.project,
        credentials: o.credentials,
        topic: o.topic,
        subscription: o.subscription,
        mode: o.mode,
        pushEndpoint: o.pushEndpoint,
        pushServiceAccount: o.pushServiceAccount,
        labels: o.label ?? ['INBOX'],
        action: o.action,
        template: o.template,
        includeBody: o.includeBody,
        maxBytes: positive('max-bytes', o.maxBytes),
        renewMinutes: positive('renew-minutes', o.renewMinutes),
        dryRun: o.dryRun,
        browser: o.browser,
        reauthorize: o.reauthorize,
        // The flag, else the config's key (an egress proxy is configured once, for setup and run alike).
        googleApiUrl: (o.googleApiUrl as string | undefined) ?? config.webhooks.gmail?.googleApiUrl,
        storage: config.storage,
        configFile: file,
        currentSection: config.webhooks.gmail,
      };
      if (options.googleApiUrl !== undefined && !/^https?:\/\/[^/]/.test(options.googleApiUrl)) {
        throw new UsageError(`--google-api-url must be an http(s) URL (got "${options.googleApiUrl}")`);
      }
      // Pub/Sub pushes only to https; plain http is allowed to a loopback address (tests, local fakes).
      if (
        options.pushEndpoint !== undefined &&
        !/^https:\/\//.test(options.pushEndpoint) &&
        !/^http:\/\/(127\.\d+\.\d+\.\d+|localhost|\[::1\])[:/]/.test(options.pushEndpoint)
      ) {
        throw new UsageError(`--push-endpoint must be an https URL (got "${options.pushEndpoint}")`);
      }
      // Refuse before anything is asked of the user: without the key the grant could not be stored.
      const secretKeys = options.dryRun ? undefined : secretKeysFromEnv();
      const json = Boolean(o.json);
      const say = (text: string) => (json ? process.stderr : process.stdout).write(`${text}\n`);
      if (!json)
        say(
          options.dryRun
            ? `gmail setup for ${options.account} (dry run: nothing is changed)`
            : `gmail setup for ${options.account}`,
        );
      let result;
      try {
        result = await runGmailSetup(options, {
          secretKeys,
          report: (s) =>
            !json &&
            say(
              `  ${MARK[s.status]} ${s.step.padEnd(12)} ${s.status === 'unchanged' ? '(unchanged) ' : ''}${s.detail}`,
            ),
          showUrl: (url) =>
            say(`\nOpen this URL in a browser signed in as ${options.account}, and approve:\n\n  ${url}\n`),
          openBrowser,
        });
      } catch (err) {
        if (json) process.stdout.write(`${JSON.stringify({ ok: false, error: (err as Error).message })}\n`);
        throw err;
      }
      const next =
        options.mode === 'push'
          ? 'gatehouse start (the webhook receiver serves the push route), or: gatehouse webhooks gmail run'
          : 'gatehouse start, or: gatehouse webhooks gmail run';
      if (json) {
        process.stdout.write(
          `${JSON.stringify({ ok: true, dryRun: options.dryRun, steps: result.steps, section: result.section, next })}\n`,
        );
        return;
      }
      if (!result.steps.some((s) => s.step === 'config' && s.status === 'unchanged')) {
        say(
          `\nwebhooks.gmail for ${file} (inside webhooks: { … }, with webhooks.enabled: true and a webhooks.targets.${options.action}):\n`,
        );
        say(
          formatSection(result.section)
            .split('\n')
            .map((line) => `  ${line}`)
            .join('\n'),
        );
      }
      say(`\nnext: ${next}`);
    });

  gmail
    .command('run')
    .description('run the Gmail integration (and the webhook receiver it delivers through) without the /api/ gateway')
    .option('-c, --config <file>', 'config file', DEFAULT_CONFIG_FILE)
    .action(async (o: { config: string }) => {
      const { config } = loadConfig(o.config);
      if (!config.webhooks.gmail)
        throw new UsageError(`${o.config} has no webhooks.gmail section: run \`gatehouse webhooks gmail setup\` first`);
      const logger = createLogger({ level: config.log.level, format: config.log.format });
      const running = await startWebhooks(config, logger, new MemoryLockoutStore());
      await new Promise<void>((resolve) => {
        const stop = (signal: string) => {
          logger.info({ signal }, 'shutting down');
          void running!.close(10_000).then(resolve);
        };
        process.once('SIGTERM', stop);
        process.once('SIGINT', stop);
      });
      logger.info('stopped');
      logger.flush?.();
    });

  gmail
    .command('status')
    .description('the watch, the cursor, the last notification and the last error of each Gmail account')
    .option('-c, --config <file>', 'config file', DEFAULT_CONFIG_FILE)
    .option('--account <email>', 'this account (default: the one in webhooks.gmail)')
    .option('--json', 'one JSON object', false)
    .action(async (o: { config: string; account?: string; json: boolean }) => {
      const { config } = loadConfig(o.config);
      const account = o.account ?? config.webhooks.gmail?.account;
      if (!account) throw new UsageError('no account: pass --account <email> or configure webhooks.gmail');
      const where = describeStorage(config.storage);
      const store = await openEventStore(config.storage, { role: 'cli' }).catch(unreachable(where));
      let state: GmailAccountState | undefined;
      try {
        state = await openGmailStore(store).get(account);
      } finally {
        await store.close();
      }
      if (!state)
        throw new UsageError(
          `${account} is not set up in ${where}: run \`gatehouse webhooks gmail setup --account ${account}\``,
        );
      const now = Date.now();
      const status = describeGmailAccount(state, now);
      const watchOk = status.watchActive;
      if (o.json) {
        process.stdout.write(`${toJsonWithIsoDates({ ...status, mode: config.webhooks.gmail?.mode })}\n`);
        return;
      }
      const when = (t: number | null) => describeTime(t, now);
      const lines = [
        `gmail ${account}${config.webhooks.gmail ? ` (${config.webhooks.gmail.mode}, project ${config.webhooks.gmail.project}, topic ${config.webhooks.gmail.topic})` : ''}`,
        `  watch              ${watchOk ? 'active' : 'EXPIRED OR MISSING'}: expires ${when(state.watchExpiration)}, renewed ${when(state.watchRenewedAt)}`,
        `  cursor             ${state.cursor ?? 'none'} (moved ${when(state.cursorAt)})`,
        `  last notification  ${when(state.lastNotificationAt)}`,
        `  last error         ${state.lastError ? `${state.lastError} at ${when(state.lastErrorAt)}` : 'none'}`,
        `  emails enqueued    ${state.emailsEnqueued}`,
      ];
      process.stdout.write(`${lines.join('\n')}\n`);
    });
}
