// Types only: the libraries themselves (with googleapis-common, gaxios and the rest, ~100 modules)
// are imported when a client is first made, so a start without Gmail never loads them.
import type { gmail_v1 } from '@googleapis/gmail';
import type { OAuth2Client } from 'google-auth-library';

/**
 * Google's endpoints and clients as gatehouse uses them: the official Gmail client
 * (@googleapis/gmail), google-auth-library's OAuth2Client, and the Pub/Sub REST API through that
 * client's authorised `request` (there is no standalone Pub/Sub REST package for Node 20).
 */
export interface GoogleEndpoints {
  /** rootUrl of the Gmail client: requests go to `<root>gmail/v1/…`. */
  gmailRoot: string;
  /** Pub/Sub REST: `<root>v1/projects/…`. */
  pubsubRoot: string;
  authorizeUrl: string;
  tokenUrl: string;
  /** Google's OIDC signing keys (push tokens). */
  jwksUri: string;
}

/** Google's own endpoints. */
export const GOOGLE_ENDPOINTS: Readonly<GoogleEndpoints> = Object.freeze({
  gmailRoot: 'https://gmail.googleapis.com/',
  pubsubRoot: 'https://pubsub.googleapis.com/',
  authorizeUrl: 'https://accounts.google.com/o/oauth2/v2/auth',
  tokenUrl: 'https://oauth2.googleapis.com/token',
  jwksUri: 'https://www.googleapis.com/oauth2/v3/certs',
});

/**
 * The endpoints to call, most specific first: `googleApiUrl` (the config key or setup's
 * --google-api-url: every endpoint under one base URL, for an egress proxy or tests), else the
 * OAuth client file's `auth_uri`/`token_uri` (or the token endpoint a stored grant came from)
 * for OAuth, else Google's own.
 */
export function googleEndpoints(
  choice: { googleApiUrl?: string; authUri?: string; tokenUri?: string } = {},
): GoogleEndpoints {
  const base = choice.googleApiUrl;
  if (base === undefined) {
    return {
      ...GOOGLE_ENDPOINTS,
      authorizeUrl: choice.authUri ?? GOOGLE_ENDPOINTS.authorizeUrl,
      tokenUrl: choice.tokenUri ?? GOOGLE_ENDPOINTS.tokenUrl,
    };
  }
  const root = base.endsWith('/') ? base : `${base}/`;
  return {
    gmailRoot: root,
    pubsubRoot: root,
    authorizeUrl: `${root}o/oauth2/v2/auth`,
    tokenUrl: `${root}token`,
    jwksUri: `${root}oauth2/v3/certs`,
  };
}

const CALL_TIMEOUT_MS = 30_000;

/** Scopes gatehouse asks for: read mail, and manage/pull the Pub/Sub topic and subscription. */
export const GMAIL_SCOPES = [
  'https://www.googleapis.com/auth/gmail.readonly',
  'https://www.googleapis.com/auth/pubsub',
];

/** The service account Gmail publishes notifications as; it needs roles/pubsub.publisher on the topic. */
export const GMAIL_PUBLISHER = 'serviceAccount:gmail-api-push@system.gserviceaccount.com';

/** google-auth-library's OAuth2Client for these endpoints; the library is loaded on the first call. */
export async function createOAuthClient(
  endpoints: GoogleEndpoints,
  client: { clientId: string; clientSecret: string; redirectUri?: string },
): Promise<OAuth2Client> {
  const { OAuth2Client } = await import('google-auth-library');
  return new OAuth2Client({
    clientId: client.clientId,
    clientSecret: client.clientSecret,
    redirectUri: client.redirectUri,
    endpoints: { oauth2AuthBaseUrl: endpoints.authorizeUrl, oauth2TokenUrl: endpoints.tokenUrl },
  });
}

/** The official Gmail client (@googleapis/gmail) for these endpoints; the library is loaded on the first call. */
export async function createGmailClient(endpoints: GoogleEndpoints, auth: OAuth2Client): Promise<gmail_v1.Gmail> {
  const { gmail } = await import('@googleapis/gmail');
  // A bounded wait per call: a hung Google call must not hold a notification (or shutdown) forever.
  return gmail({ version: 'v1', auth, rootUrl: endpoints.gmailRoot, timeout: CALL_TIMEOUT_MS });
}

/**
 * users.watch's request body for these labels: notify on changes to them. `labelFilterBehavior`
 * takes `include` or `exclude`, lower case (Gmail v1 discovery document, WatchRequest).
 */
export function watchRequest(topicName: string, labelIds: string[]): gmail_v1.Schema$WatchRequest {
  return { topicName, labelIds, labelFilterBehavior: 'include' };
}

export interface PubSubSubscription {
  name?: string;
  topic?: string;
  pushConfig?: { pushEndpoint?: string; oidcToken?: { serviceAccountEmail?: string; audience?: string } };
  ackDeadlineSeconds?: number;
}

export interface IamPolicy {
  bindings?: { role: string; members: string[] }[];
  etag?: string;
  version?: number;
}

export interface PulledMessage {
  ackId: string;
  message: { data?: string; messageId?: string; publishTime?: string; attributes?: Record<string, string> };
}

/** The few Pub/Sub REST calls gatehouse makes, authorised by the account's OAuth grant. */
export class PubSubRest {
  constructor(
    private readonly auth: OAuth2Client,
    private readonly root: string,
    readonly project: string,
  ) {}

  topicName(topic: string): string {
    return `projects/${this.project}/topics/${topic}`;
  }

  subscriptionName(subscription: string): string {
    return `projects/${this.project}/subscriptions/${subscription}`;
  }

  /** undefined when the resource does not exist (Google's 404 NOT_FOUND). */
  async get<T>(name: string): Promise<T | undefined> {
    try {
      return await this.call<T>('GET', name);
    } catch (err) {
      if (isGoogleNotFound(err)) return undefined;
      throw err;
    }
  }

  /**
   * `topics.getIamPolicy`: GET with the version as a query parameter (Pub/Sub v1 REST
   * reference). Version 3 so that a policy with conditional bindings is read whole, and written
   * back whole by setIamPolicy.
   */
  async getIamPolicy(resource: string): Promise<IamPolicy> {
    return this.call<IamPolicy>('GET', `${resource}:getIamPolicy`, undefined, undefined, {
      'options.requestedPolicyVersion': '3',
    });
  }

  /** `topics.setIamPolicy`: POST `{ policy }`, the policy as read (its etag guards against a concurrent change). */
  async setIamPolicy(resource: string, policy: IamPolicy): Promise<IamPolicy> {
    return this.call<IamPolicy>('POST', `${resource}:setIamPolicy`, { policy });
  }

  async call<T>(
    method: 'GET' | 'PUT' | 'PATCH' | 'POST',
    nameAndVerb: string,
    data?: unknown,
    signal?: AbortSignal,
    query?: Record<string, string>,
  ): Promise<T> {
    // pull may long-poll (Google holds it up to ~90 s when nothing is there).
    const timeout = nameAndVerb.endsWith(':pull') ? 100_000 : CALL_TIMEOUT_MS;
    const search = query ? `?${new URLSearchParams(query)}` : '';
    const response = await this.auth.request<T>({
      url: `${this.root}v1/${nameAndVerb}${search}`,
      method,
      data,
      signal,
      timeout,
      retry: method === 'GET',
    });
    return response.data;
  }

  async pull(subscription: string, maxMessages: number, signal?: AbortSignal): Promise<PulledMessage[]> {
    const reply = await this.call<{ receivedMessages?: PulledMessage[] }>(
      'POST',
      `${this.subscriptionName(subscription)}:pull`,
      { maxMessages },
      signal,
    );
    return reply.receivedMessages ?? [];
  }

  async acknowledge(subscription: string, ackIds: string[]): Promise<void> {
    await this.call('POST', `${this.subscriptionName(subscription)}:acknowledge`, { ackIds });
  }
}

/** The HTTP status of a Google API error (gaxios), if it has one. */
export function googleStatus(err: unknown): number | undefined {
  const e = err as { status?: unknown; response?: { status?: unknown } };
  const status = e?.status ?? e?.response?.status;
  return typeof status === 'number' ? status : undefined;
}

interface GoogleErrorBody {
  error?: { code?: number; status?: string; message?: string } | string;
  error_description?: string;
}

/**
 * The error body when it is one of Google's JSON envelopes: an API error (AIP-193
 * `{"error":{"code","message","status"}}`) or an OAuth one (RFC 6749 §5.2 `{"error":"…"}`);
 * undefined for anything else, such as the HTML page Google's front end (or a proxy) sends.
 */
function googleErrorBody(err: unknown): GoogleErrorBody | undefined {
  const data = (err as { response?: { data?: unknown } })?.response?.data;
  if (data === null || typeof data !== 'object' || Array.isArray(data)) return undefined;
  const error = (data as GoogleErrorBody).error;
  return (typeof error === 'object' && error !== null) || typeof error === 'string'
    ? (data as GoogleErrorBody)
    : undefined;
}

/**
 * Google said "no such resource" (404 with its JSON error): a topic to create, a message
 * deleted, a history id too old. An HTML 404 is not that: it means the URL itself is wrong
 * (a misrouted proxy, a wrong endpoint), and must not be taken for a missing resource.
 */
export function isGoogleNotFound(err: unknown): boolean {
  return googleStatus(err) === 404 && typeof googleErrorBody(err)?.error === 'object';
}

/** `GET https://host/path` (no query string: it may carry ids worth keeping out of logs). */
function requestLine(err: unknown): string {
  const config = (err as { config?: { method?: string; url?: unknown } })?.config;
  let url = String(config?.url ?? '');
  try {
    const parsed = new URL(url);
    url = `${parsed.origin}${parsed.pathname}`;
  } catch {
    // not a URL: shown as it is
  }
  return `${(config?.method ?? 'GET').toUpperCase()} ${url}`;
}

/** Google's own words for an error: `status: message` from its JSON error body; else what came back, and to which request. */
export function googleMessage(err: unknown): string {
  const data = googleErrorBody(err);
  if (data && typeof data.error === 'object' && data.error.message)
    return `${data.error.status ?? googleStatus(err)}: ${data.error.message}`;
  if (data && typeof data.error === 'string')
    return `${data.error}${data.error_description ? `: ${data.error_description}` : ''}`;
  const status = googleStatus(err);
  if (status !== undefined && (err as { response?: unknown }).response) {
    // An HTML page (Google's front end, or a proxy) or an empty body: never printed raw.
    const text = (err as { response?: { statusText?: string } }).response?.statusText || STATUS_TEXT[status] || '';
    return `Google answered ${status}${text ? ` ${text}` : ''} to ${requestLine(err)}`;
  }
  return err instanceof Error ? err.message : String(err);
}

const STATUS_TEXT: Record<number, string> = {
  400: 'Bad Request',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'Not Found',
  405: 'Method Not Allowed',
  429: 'Too Many Requests',
  500: 'Internal Server Error',
  502: 'Bad Gateway',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
};

/** Whether the failed request went to one of Google's own hosts (rather than googleApiUrl, a proxy). */
function wentToGoogle(err: unknown): boolean {
  try {
    const host = new URL(String((err as { config?: { url?: unknown } })?.config?.url ?? '')).hostname;
    return host.endsWith('.googleapis.com') || host === 'accounts.google.com';
  } catch {
    return false;
  }
}

/**
 * What went wrong and how to fix it, for the messages setup and run print: the common causes
 * (API not enabled, missing permission, wrong project, revoked grant, a wrong endpoint or
 * proxy) get their fix spelled out. `step` is setup's step; without it, the call was made by
 * the running integration (which retries by itself).
 */
export function explainGoogleError(
  err: unknown,
  context: { project?: string; api?: 'Gmail' | 'Pub/Sub'; step?: string },
): string {
  const status = googleStatus(err);
  const said = googleMessage(err);
  const project = context.project ?? '<project>';
  const api = context.api ?? 'Google';
  const json = googleErrorBody(err) !== undefined;
  if (/invalid_grant/.test(said))
    return `${said}. The stored authorisation was revoked or expired: run \`gatehouse webhooks gmail setup\` again.`;
  if (status !== undefined && !json && (err as { response?: unknown }).response) {
    // Not Google's API answering: its front end (no such URL, backend down) or a proxy in between.
    const endpoints =
      context.step === 'authorise'
        ? "the OAuth endpoints (the client file's auth_uri and token_uri, or googleApiUrl)"
        : 'webhooks.gmail.googleApiUrl (or --google-api-url)';
    if (status === 404) {
      return wentToGoogle(err)
        ? `${said}. Google serves no such URL: this is a gatehouse bug, please report it with this message.`
        : `${said}. That server serves no such URL: check ${endpoints}; it must forward each path to Google unchanged.`;
    }
    if (status >= 500) {
      const again = context.step ? 'run setup again in a minute' : 'gatehouse retries by itself';
      return `${said}. ${wentToGoogle(err) ? 'Google' : 'The server in between'} could not answer for now: ${again}${wentToGoogle(err) ? '' : `; if it persists, check ${endpoints}`}.`;
    }
    return wentToGoogle(err) ? said : `${said}. Check ${endpoints}.`;
  }
  if (status === 403 && /SERVICE_DISABLED|has not been used|is disabled|accessNotConfigured/i.test(said)) {
    const service = api === 'Gmail' ? 'gmail.googleapis.com' : 'pubsub.googleapis.com';
    return `${said}. Enable the ${api} API: https://console.cloud.google.com/apis/library/${service}?project=${project}`;
  }
  if (status === 403)
    return `${said}. The authorised account lacks permission in project ${project}: it needs roles/pubsub.admin (or editor) there.`;
  if (status === 404 && api === 'Pub/Sub')
    return `${said}. Check the project id (--project ${project}): it must be an existing Google Cloud project.`;
  if (status === 401) return `${said}. The access token was refused: run \`gatehouse webhooks gmail setup\` again.`;
  if (status === undefined) return `${said}. Google could not be reached: check the network (and any egress proxy).`;
  return said;
}
