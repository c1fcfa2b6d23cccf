import { readFileSync } from 'node:fs';
import JSON5 from 'json5';
import type { GmailConfig } from '../../config/schema.js';
import { UsageError } from '../../errors.js';
import { gmailGrantContext, openSecret, sealSecret, type SecretKeys } from '../../storage/secrets.js';
import type { StorageConfig } from '../../config/schema.js';
import { openEventStore, openGmailStore, peekStoredProject } from '../../storage/open.js';
import { authorizeWithLoopback } from './authorize.js';
import {
  createGmailClient,
  createOAuthClient,
  explainGoogleError,
  GMAIL_PUBLISHER,
  GMAIL_SCOPES,
  googleEndpoints,
  PubSubRest,
  watchRequest,
  type GoogleEndpoints,
  type PubSubSubscription,
} from './google.js';
import type { GmailGrant } from './run.js';

/** `gatehouse webhooks gmail setup` options, after the CLI has parsed them. */
export interface GmailSetupOptions {
  account: string;
  project?: string;
  credentials?: string;
  topic: string;
  subscription: string;
  mode: 'push' | 'pull';
  pushEndpoint?: string;
  pushServiceAccount?: string;
  labels: string[];
  action: 'message' | 'agent';
  template?: string;
  includeBody: boolean;
  maxBytes: number;
  renewMinutes: number;
  dryRun: boolean;
  browser: boolean;
  reauthorize: boolean;
  /** One base URL for every Google endpoint: --google-api-url, else the config's webhooks.gmail.googleApiUrl. */
  googleApiUrl?: string;
  /** The config's storage; the config's current webhooks.gmail, if any. */
  storage: StorageConfig;
  configFile: string;
  currentSection?: GmailConfig;
}

export interface SetupStep {
  step: string;
  status: 'done' | 'unchanged' | 'planned' | 'failed';
  detail: string;
}

export interface SetupIo {
  /** A finished step (the CLI prints ✓/✗ lines, or collects them for --json). */
  report(step: SetupStep): void;
  /** The authorisation URL the user must open. */
  showUrl(url: string): void;
  /** Opens the URL in a browser (best effort). */
  openBrowser?(url: string): void;
  secretKeys?: SecretKeys;
}

interface DesktopClient {
  clientId: string;
  clientSecret: string;
  projectId?: string;
  /** The file's auth_uri and token_uri: where this client authorises (Google's, unless edited for a proxy). */
  authUri?: string;
  tokenUri?: string;
}

/** A step failed: its name, Google's error and the fix are in the message. */
export class SetupFailed extends UsageError {}

/**
 * The setup, step by step; each step is idempotent (a second run reports `unchanged` and makes
 * no create, update or grant call). `--dry-run` reports the calls it would make and changes
 * nothing (no Google call, no storage write).
 */
export async function runGmailSetup(
  options: GmailSetupOptions,
  io: SetupIo,
): Promise<{ section: Record<string, unknown>; steps: SetupStep[] }> {
  const steps: SetupStep[] = [];
  const report = (step: SetupStep) => {
    steps.push(step);
    io.report(step);
  };
  const client = options.credentials ? readDesktopClient(options.credentials) : undefined;
  if (options.mode === 'push' && (!options.pushEndpoint || !options.pushServiceAccount)) {
    throw new UsageError(
      'push mode needs --push-endpoint <https URL of /webhook/gmail> and --push-service-account <email> (or use --mode pull)',
    );
  }
  // Config key (or flag), then the client file's OAuth URIs, then Google's own.
  const endpoints = googleEndpoints({
    googleApiUrl: options.googleApiUrl,
    authUri: client?.authUri,
    tokenUri: client?.tokenUri,
  });
  // --project, the client file's, the one kept with the stored grant, the config section's.
  const sectionProject =
    options.currentSection?.account.toLowerCase() === options.account.toLowerCase()
      ? options.currentSection.project
      : undefined;
  const project =
    options.project ??
    client?.projectId ??
    (await peekStoredProject(options.storage, options.account)) ??
    sectionProject;
  if (!project)
    throw new UsageError('no project: pass --project <id> (or use a client_secret.json that names its project_id)');
  const topicName = `projects/${project}/topics/${options.topic}`;
  const section = gmailSection(options, project);

  if (options.dryRun) {
    for (const step of plannedCalls(options, project, endpoints)) report(step);
    report({ step: 'config', status: 'planned', detail: 'print the webhooks.gmail section' });
    return { section, steps };
  }

  if (!io.secretKeys) throw new UsageError('internal: no secret key');
  const secretKeys = io.secretKeys;
  const store = await openEventStore(options.storage, { role: 'setup' });
  try {
    const state = openGmailStore(store);
    const context = gmailGrantContext(options.account);
    const stored = await state.get(options.account);

    // 1. Authorise (or reuse the stored grant while it still works).
    const auth = await step(
      report,
      'authorise',
      async () => {
        if (stored && !options.reauthorize) {
          const grant = JSON.parse(openSecret(stored.sealedGrant, secretKeys, context)) as GmailGrant;
          // The token endpoint the grant came from, unless the config or the client file names one.
          const reusedAt = googleEndpoints({
            googleApiUrl: options.googleApiUrl,
            authUri: client?.authUri,
            tokenUri: client?.tokenUri ?? grant.tokenUri,
          });
          const reused = await createOAuthClient(reusedAt, {
            clientId: stored.clientId,
            clientSecret: grant.clientSecret,
          });
          reused.setCredentials({ refresh_token: grant.refreshToken });
          try {
            await reused.getAccessToken();
            if (stored.project !== project) await state.saveProject(options.account, project);
            return {
              value: reused,
              status: 'unchanged' as const,
              detail: `${options.account}: the stored authorisation still works (--reauthorize to redo it)`,
            };
          } catch (err) {
            if (
              !/invalid_grant/.test(
                String(
                  (err as { response?: { data?: { error?: string } } }).response?.data?.error ?? (err as Error).message,
                ),
              )
            )
              throw err;
            // Revoked or expired: authorise again below.
          }
        }
        if (!client)
          throw new UsageError(
            '--credentials <client_secret.json> is required to authorise (an OAuth client of type "Desktop app": https://console.cloud.google.com/apis/credentials)',
          );
        const fresh = await createOAuthClient(endpoints, client);
        const { refreshToken } = await authorizeWithLoopback(fresh, {
          scopes: GMAIL_SCOPES,
          loginHint: options.account,
          showUrl: (url) => {
            io.showUrl(url);
            if (options.browser) io.openBrowser?.(url);
          },
        });
        const profile = await (await createGmailClient(endpoints, fresh)).users.getProfile({ userId: 'me' });
        if (profile.data.emailAddress?.toLowerCase() !== options.account.toLowerCase()) {
          throw new UsageError(
            `you signed in as ${profile.data.emailAddress}, not ${options.account}: run setup again and choose ${options.account}`,
          );
        }
        const grant: GmailGrant = {
          clientSecret: client.clientSecret,
          refreshToken,
          ...(client.tokenUri ? { tokenUri: client.tokenUri } : {}),
        };
        await state.saveGrant(
          options.account,
          client.clientId,
          sealSecret(JSON.stringify(grant), secretKeys, context),
          project,
        );
        return {
          value: fresh,
          status: 'done' as const,
          detail: `${options.account} authorised (gmail.readonly, pubsub); refresh token stored encrypted`,
        };
      },
      { project, api: 'Gmail' },
    );

    const pubsub = new PubSubRest(auth, endpoints.pubsubRoot, project);

    // 2. The topic, and Gmail's right to publish to it.
    await step(
      report,
      'topic',
      async () => {
        const exists = await pubsub.get(topicName);
        if (!exists) await pubsub.call('PUT', topicName, {});
        const policy = await pubsub.getIamPolicy(topicName);
        const bindings = policy.bindings ?? [];
        const publisher = bindings.find((b) => b.role === 'roles/pubsub.publisher');
        const granted = publisher?.members.includes(GMAIL_PUBLISHER) ?? false;
        if (!granted) {
          const next = publisher
            ? bindings.map((b) => (b === publisher ? { ...b, members: [...b.members, GMAIL_PUBLISHER] } : b))
            : [...bindings, { role: 'roles/pubsub.publisher', members: [GMAIL_PUBLISHER] }];
          await pubsub.setIamPolicy(topicName, { ...policy, bindings: next });
        }
        const what = [
          exists ? 'exists' : 'created',
          granted
            ? 'Gmail may already publish to it'
            : 'granted roles/pubsub.publisher to gmail-api-push@system.gserviceaccount.com',
        ];
        return {
          value: undefined,
          status: exists && granted ? ('unchanged' as const) : ('done' as const),
          detail: `${topicName}: ${what.join('; ')}`,
        };
      },
      { project, api: 'Pub/Sub' },
    );

    // 3. The subscription: push with an OIDC token (no secret in the URL), or pull.
    await step(
      report,
      'subscription',
      async () => {
        const name = pubsub.subscriptionName(options.subscription);
        const wanted: PubSubSubscription = {
          topic: topicName,
          ackDeadlineSeconds: 60,
          pushConfig:
            options.mode === 'push'
              ? {
                  pushEndpoint: options.pushEndpoint,
                  oidcToken: { serviceAccountEmail: options.pushServiceAccount, audience: options.pushEndpoint },
                }
              : {},
        };
        const existing = await pubsub.get<PubSubSubscription>(name);
        if (!existing) {
          await pubsub.call('PUT', name, wanted);
          return {
            value: undefined,
            status: 'done' as const,
            detail: `${name}: created (${describeSubscription(wanted)})`,
          };
        }
        if (existing.topic !== topicName) {
          throw new UsageError(
            `${name} exists but belongs to ${existing.topic}: choose another --subscription, or delete that one`,
          );
        }
        if (sameSubscription(existing, wanted))
          return {
            value: undefined,
            status: 'unchanged' as const,
            detail: `${name}: ${describeSubscription(existing)}`,
          };
        await pubsub.call('PATCH', name, { subscription: wanted, updateMask: 'pushConfig,ackDeadlineSeconds' });
        return {
          value: undefined,
          status: 'done' as const,
          detail: `${name}: updated to ${describeSubscription(wanted)}`,
        };
      },
      { project, api: 'Pub/Sub' },
    );

    // 4. The watch; its historyId becomes the cursor unless one is already kept (never moved back or skipped ahead).
    await step(
      report,
      'watch',
      async () => {
        const gmail = await createGmailClient(endpoints, auth);
        const before = await state.get(options.account);
        const { data } = await gmail.users.watch({
          userId: 'me',
          requestBody: watchRequest(topicName, options.labels),
        });
        await state.recordWatch(options.account, data.historyId!, Number(data.expiration), Date.now());
        const cursor = before?.cursor ?? data.historyId;
        return {
          value: undefined,
          status: before?.cursor ? ('unchanged' as const) : ('done' as const),
          detail: `watching ${options.labels.join(', ')} until ${new Date(Number(data.expiration)).toISOString()}; cursor ${cursor}${before?.cursor ? ' (kept)' : ''}`,
        };
      },
      { project, api: 'Gmail' },
    );
  } finally {
    await store.close();
  }

  // 5. The config section: printed, not written (JSON5 comments would not survive a rewrite).
  const same = options.currentSection !== undefined && sameSection(options.currentSection, section);
  report({
    step: 'config',
    status: same ? 'unchanged' : 'done',
    detail: same
      ? `${options.configFile} already has this webhooks.gmail section`
      : `add the section below to webhooks in ${options.configFile}`,
  });
  return { section, steps };
}

async function step<T>(
  report: (step: SetupStep) => void,
  name: string,
  run: () => Promise<{ value: T; status: 'done' | 'unchanged'; detail: string }>,
  context: { project: string; api: 'Gmail' | 'Pub/Sub' },
): Promise<T> {
  try {
    const { value, status, detail } = await run();
    report({ step: name, status, detail });
    return value;
  } catch (err) {
    const detail = err instanceof UsageError ? err.message : explainGoogleError(err, { ...context, step: name });
    report({ step: name, status: 'failed', detail });
    throw new SetupFailed(`setup failed at step "${name}": ${detail}`);
  }
}

/** The Desktop-app OAuth client from Google's client_secret.json. */
function readDesktopClient(file: string): DesktopClient {
  let parsed: { installed?: Record<string, unknown>; web?: Record<string, unknown> };
  try {
    parsed = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new UsageError(
      `--credentials ${file}: cannot read it as JSON (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}). Download the OAuth client ("Desktop app") JSON from https://console.cloud.google.com/apis/credentials`,
    );
  }
  const installed = parsed.installed;
  if (!installed)
    throw new UsageError(
      `--credentials ${file}: not a "Desktop app" OAuth client (no "installed" section); the loopback flow needs one`,
    );
  const clientId = installed.client_id;
  const clientSecret = installed.client_secret;
  if (typeof clientId !== 'string' || typeof clientSecret !== 'string')
    throw new UsageError(`--credentials ${file}: client_id or client_secret missing`);
  const uri = (key: 'auth_uri' | 'token_uri') => {
    const value = installed[key];
    if (value === undefined) return undefined;
    if (typeof value !== 'string' || !/^https?:\/\/[^/]/.test(value))
      throw new UsageError(`--credentials ${file}: ${key} must be an http(s) URL (got ${JSON.stringify(value)})`);
    return value;
  };
  return {
    clientId,
    clientSecret,
    projectId: typeof installed.project_id === 'string' ? installed.project_id : undefined,
    authUri: uri('auth_uri'),
    tokenUri: uri('token_uri'),
  };
}

function describeSubscription(s: PubSubSubscription): string {
  return s.pushConfig?.pushEndpoint
    ? `push to ${s.pushConfig.pushEndpoint} with an OIDC token as ${s.pushConfig.oidcToken?.serviceAccountEmail}`
    : 'pull';
}

function sameSubscription(a: PubSubSubscription, b: PubSubSubscription): boolean {
  const push = (s: PubSubSubscription) =>
    [
      s.pushConfig?.pushEndpoint ?? '',
      s.pushConfig?.oidcToken?.serviceAccountEmail ?? '',
      s.pushConfig?.oidcToken?.audience ?? '',
    ].join('|');
  return push(a) === push(b) && (a.ackDeadlineSeconds ?? 10) === (b.ackDeadlineSeconds ?? 10);
}

/** The `webhooks.gmail` section for these options (defaults left out). */
function gmailSection(o: GmailSetupOptions, project: string): Record<string, unknown> {
  const section: Record<string, unknown> = { account: o.account, project, mode: o.mode };
  if (o.topic !== 'gatehouse-gmail') section.topic = o.topic;
  if (o.subscription !== 'gatehouse-gmail-push') section.subscription = o.subscription;
  if (o.labels.join() !== 'INBOX') section.labels = o.labels;
  if (o.action !== 'message') section.action = o.action;
  if (o.template !== undefined) section.template = o.template;
  if (o.includeBody) section.includeBody = true;
  if (o.maxBytes !== 20_000) section.maxBytes = o.maxBytes;
  if (o.renewMinutes !== 720) section.renewMinutes = o.renewMinutes;
  if (o.mode === 'push')
    section.push = {
      path: new URL(o.pushEndpoint!).pathname,
      audience: o.pushEndpoint,
      serviceAccountEmail: o.pushServiceAccount,
    };
  if (o.googleApiUrl) section.googleApiUrl = o.googleApiUrl;
  return section;
}

/** The section as it would read once parsed, against what the config has now. */
function sameSection(current: GmailConfig, wanted: Record<string, unknown>): boolean {
  return Object.entries(wanted).every(([key, value]) => {
    const have = (current as Record<string, unknown>)[key];
    if (key === 'push' && value && have) {
      const w = value as Record<string, string>;
      const h = have as Record<string, string>;
      return w.path === h.path && w.audience === h.audience && w.serviceAccountEmail === h.serviceAccountEmail;
    }
    return JSON.stringify(have) === JSON.stringify(value);
  });
}

/** The section as JSON5 text to paste inside `webhooks: { … }`. */
export function formatSection(section: Record<string, unknown>): string {
  return `gmail: ${JSON5.stringify(section, null, 2)},`;
}

/** What --dry-run prints: every call setup would make, in order, with what decides it. */
function plannedCalls(o: GmailSetupOptions, project: string, e: GoogleEndpoints): SetupStep[] {
  const topic = `${e.pubsubRoot}v1/projects/${project}/topics/${o.topic}`;
  const subscription = `${e.pubsubRoot}v1/projects/${project}/subscriptions/${o.subscription}`;
  const gmail = `${e.gmailRoot}gmail/v1/users/me`;
  const push =
    o.mode === 'push'
      ? `pushConfig { pushEndpoint: ${o.pushEndpoint}, oidcToken { serviceAccountEmail: ${o.pushServiceAccount}, audience: ${o.pushEndpoint} } }`
      : 'no pushConfig (pull)';
  return [
    {
      step: 'authorise',
      status: 'planned',
      detail: `unless a working grant for ${o.account} is stored: open ${e.authorizeUrl} (scopes ${GMAIL_SCOPES.join(' ')}, PKCE S256, loopback redirect), then POST ${e.tokenUrl} (authorization_code) and GET ${gmail}/profile`,
    },
    {
      step: 'topic',
      status: 'planned',
      detail: `GET ${topic}; PUT ${topic} if missing; GET ${topic}:getIamPolicy?options.requestedPolicyVersion=3; POST ${topic}:setIamPolicy if ${GMAIL_PUBLISHER} lacks roles/pubsub.publisher`,
    },
    {
      step: 'subscription',
      status: 'planned',
      detail: `GET ${subscription}; PUT ${subscription} if missing, PATCH if its settings differ: topic projects/${project}/topics/${o.topic}, ackDeadlineSeconds 60, ${push}`,
    },
    {
      step: 'watch',
      status: 'planned',
      detail: `POST ${gmail}/watch { topicName: projects/${project}/topics/${o.topic}, labelIds: [${o.labels.join(', ')}], labelFilterBehavior: include }; store historyId as the cursor if none is kept`,
    },
  ];
}
