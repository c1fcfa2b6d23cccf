import { gmail, type gmail_v1 } from '@googleapis/gmail';
import { OAuth2Client } from 'google-auth-library';

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

/** Google's real endpoints, or all of them under one base URL (`googleApiUrl`: tests, egress proxies). */
export function googleEndpoints(base?: string): GoogleEndpoints {
  if (base === undefined) {
    return {
      gmailRoot: 'https://gmail.googleapis.com/',
      pubsubRoot: 'https://pubsub.googleapis.com/',
      authorizeUrl: 'https://accounts.google.com/o/oauth2/v2/auth',
      tokenUrl: 'https://oauth2.googleapis.com/token',
      jwksUri: 'https://www.googleapis.com/oauth2/v3/certs',
    };
  }
  const root = base.endsWith('/') ? base : `${base}/`;
  return { gmailRoot: root, pubsubRoot: root, authorizeUrl: `${root}o/oauth2/v2/auth`, tokenUrl: `${root}token`, jwksUri: `${root}oauth2/v3/certs` };
}

const CALL_TIMEOUT_MS = 30_000;

/** Scopes gatehouse asks for: read mail, and manage/pull the Pub/Sub topic and subscription. */
export const GMAIL_SCOPES = ['https://www.googleapis.com/auth/gmail.readonly', 'https://www.googleapis.com/auth/pubsub'];

/** The service account Gmail publishes notifications as; it needs roles/pubsub.publisher on the topic. */
export const GMAIL_PUBLISHER = 'serviceAccount:gmail-api-push@system.gserviceaccount.com';

export function createOAuthClient(endpoints: GoogleEndpoints, client: { clientId: string; clientSecret: string; redirectUri?: string }): OAuth2Client {
  return new OAuth2Client({
    clientId: client.clientId,
    clientSecret: client.clientSecret,
    redirectUri: client.redirectUri,
    endpoints: { oauth2AuthBaseUrl: endpoints.authorizeUrl, oauth2TokenUrl: endpoints.tokenUrl },
  });
}

export function createGmailClient(endpoints: GoogleEndpoints, auth: OAuth2Client): gmail_v1.Gmail {
  // A bounded wait per call: a hung Google call must not hold a notification (or shutdown) forever.
  return gmail({ version: 'v1', auth, rootUrl: endpoints.gmailRoot, timeout: CALL_TIMEOUT_MS });
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

  /** undefined when the resource does not exist (404). */
  async get<T>(name: string): Promise<T | undefined> {
    try {
      return await this.call<T>('GET', name);
    } catch (err) {
      if (googleStatus(err) === 404) return undefined;
      throw err;
    }
  }

  async call<T>(method: 'GET' | 'PUT' | 'PATCH' | 'POST', nameAndVerb: string, data?: unknown, signal?: AbortSignal): Promise<T> {
    // pull may long-poll (Google holds it up to ~90 s when nothing is there).
    const timeout = nameAndVerb.endsWith(':pull') ? 100_000 : CALL_TIMEOUT_MS;
    const response = await this.auth.request<T>({ url: `${this.root}v1/${nameAndVerb}`, method, data, signal, timeout, retry: method === 'GET' });
    return response.data;
  }

  async pull(subscription: string, maxMessages: number, signal?: AbortSignal): Promise<PulledMessage[]> {
    const reply = await this.call<{ receivedMessages?: PulledMessage[] }>('POST', `${this.subscriptionName(subscription)}:pull`, { maxMessages }, signal);
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

/** Google's own words for an error: `status: message` from the JSON error body, else the error's message. */
export function googleMessage(err: unknown): string {
  const data = (err as { response?: { data?: unknown } })?.response?.data as { error?: { status?: string; message?: string } | string; error_description?: string } | undefined;
  if (data && typeof data.error === 'object' && data.error?.message) return `${data.error.status ?? googleStatus(err)}: ${data.error.message}`;
  if (data && typeof data.error === 'string') return `${data.error}${data.error_description ? `: ${data.error_description}` : ''}`;
  return err instanceof Error ? err.message : String(err);
}

/**
 * What went wrong and how to fix it, for the messages setup and run print: the common causes
 * (API not enabled, missing permission, wrong project, revoked grant) get their fix spelled out.
 */
export function explainGoogleError(err: unknown, context: { project?: string; api?: 'Gmail' | 'Pub/Sub' }): string {
  const status = googleStatus(err);
  const said = googleMessage(err);
  const project = context.project ?? '<project>';
  const api = context.api ?? 'Google';
  if (/invalid_grant/.test(said)) return `${said}. The stored authorisation was revoked or expired: run \`gatehouse webhooks gmail setup\` again.`;
  if (status === 403 && /SERVICE_DISABLED|has not been used|is disabled|accessNotConfigured/i.test(said)) {
    const service = api === 'Gmail' ? 'gmail.googleapis.com' : 'pubsub.googleapis.com';
    return `${said}. Enable the ${api} API: https://console.cloud.google.com/apis/library/${service}?project=${project}`;
  }
  if (status === 403) return `${said}. The authorised account lacks permission in project ${project}: it needs roles/pubsub.admin (or editor) there.`;
  if (status === 404 && api === 'Pub/Sub') return `${said}. Check the project id (--project ${project}): it must be an existing Google Cloud project.`;
  if (status === 401) return `${said}. The access token was refused: run \`gatehouse webhooks gmail setup\` again.`;
  if (status === undefined) return `${said}. Google could not be reached: check the network (and any egress proxy).`;
  return said;
}
