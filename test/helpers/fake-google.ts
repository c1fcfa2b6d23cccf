/**
 * A local stand-in for the slice of Google that the Gmail integration talks to: OAuth 2.0
 * (authorization code + PKCE, refresh), Cloud Pub/Sub v1 REST, Gmail v1 REST, and Pub/Sub's
 * push delivery with OIDC tokens. One node:http server on 127.0.0.1:0 serves every host, so the
 * official clients are pointed at it with `rootUrl` (googleapis) and `endpoints` (OAuth2Client).
 *
 * Paths, bodies and error envelopes follow Google's public REST contracts; only what the
 * integration uses is implemented. Anything else answers 404, as Google does for an unknown path.
 */
import http from 'node:http';
import https from 'node:https';
import { createHash, randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { SignJWT, exportJWK, exportSPKI, generateKeyPair, type JWK } from 'jose';

// ─── Public types ───────────────────────────────────────────────────────────────────────────

export interface FakeOAuthClient {
  clientId: string;
  clientSecret: string;
  /** The Cloud project that owns the client: Gmail only watches topics in this project. */
  projectId: string;
  projectNumber: string;
  /** Exact redirect URIs (a "Web application" client). Omitted: any loopback http URI (a "Desktop app" client). */
  redirectUris?: string[];
}

export interface FakeGoogleOptions {
  /** Known OAuth clients. Default: [FAKE_CLIENT]. */
  clients?: FakeOAuthClient[];
  /** The Google account that signs in at the authorize endpoint. Default 'alice@example.com'. */
  account?: string;
  /** Lifetime of issued access tokens (Google: 3599 s). */
  accessTokenTtlSeconds?: number;
  /** Lifetime of authorization codes. Default 600 s. */
  authorizationCodeTtlSeconds?: number;
  /** Initial values of `fake.timing`. */
  timing?: Partial<FakeGoogleTiming>;
}

/** Knobs that make Google's slow clocks test-sized; mutable at any time. */
export interface FakeGoogleTiming {
  /** Overrides every subscription's ackDeadlineSeconds for redelivery and push timeouts. */
  ackDeadlineMs: number | undefined;
  /** Push retry backoff: min(min · 2^(attempt-1), max). Google's defaults are 10 s and 600 s. */
  pushMinBackoffMs: number;
  pushMaxBackoffMs: number;
  /** Push attempts per message before the fake gives up (Google retries until retention ends). */
  pushMaxAttempts: number;
  /** Lifetime of a Gmail watch (Google: 7 days). */
  watchTtlMs: number;
}

export interface RecordedCall {
  method: string;
  /** Percent-decoded path without the query, e.g. '/v1/projects/p/topics/t:getIamPolicy'. */
  path: string;
  query: Record<string, string | string[]>;
  /** Parsed JSON or form body; undefined when empty. */
  body: unknown;
  /** The status the fake answered with. */
  status?: number;
}

export interface FailureMatcher {
  method?: string;
  /** A string matches the path exactly; a RegExp is tested against it. */
  path: RegExp | string;
}

export interface InjectedFailure {
  status: number;
  message: string;
  /** Gmail: errors[0].reason; Pub/Sub: an ErrorInfo detail; /token: the OAuth `error`. */
  reason?: string;
  /** Canonical status; derived from the HTTP status when omitted. */
  errorStatus?: string;
  /** How many matching requests fail. Default 1. */
  times?: number;
}

export interface NewEmail {
  /** Mailbox to deliver to. Default: the consenting account. */
  account?: string;
  from: string;
  to?: string;
  subject: string;
  text: string;
  html?: string;
  labels?: string[];
  date?: Date;
  threadId?: string;
}

export interface StoredEmail {
  id: string;
  threadId: string;
  labelIds: string[];
  historyId: string;
  internalDate: string;
  from: string;
  to: string;
  subject: string;
  text: string;
  html: string | undefined;
  messageIdHeader: string;
}

export interface Mailbox {
  emailAddress: string;
  historyId: number;
  messages: StoredEmail[];
  history: { id: number; message: StoredEmail; labelIds: string[] }[];
  /** history.list with a startHistoryId below this answers 404. */
  retainedFrom: number;
}

export interface GmailWatch {
  topicName: string;
  labelIds: string[];
  labelFilterBehavior: 'include' | 'exclude';
  historyId: string;
  /** Epoch milliseconds, as a string like Gmail returns it. */
  expiration: string;
}

export interface IamPolicy {
  version?: number;
  etag: string;
  bindings?: { role: string; members: string[] }[];
}

export interface Topic {
  name: string;
  labels?: Record<string, string>;
}

export interface PushConfig {
  pushEndpoint?: string;
  oidcToken?: { serviceAccountEmail?: string; audience?: string };
  attributes?: Record<string, string>;
}

export interface Subscription {
  name: string;
  topic: string;
  pushConfig: PushConfig;
  ackDeadlineSeconds: number;
  messageRetentionDuration: string;
  labels?: Record<string, string>;
}

export interface PubsubMessage {
  data: string;
  messageId: string;
  publishTime: string;
  attributes?: Record<string, string>;
}

export interface PushAttempt {
  subscription: string;
  messageId: string;
  attempt: number;
  endpoint: string;
  /** The endpoint's status; undefined when the request failed (see `error`). */
  status?: number;
  error?: string;
  /** The Authorization header sent, if any. */
  authorization?: string;
  at: Date;
}

export interface GmailNotification {
  account: string;
  topicName: string;
  historyId: number;
  /** False when Gmail could not publish (topic gone, publisher role revoked). */
  published: boolean;
}

export interface OidcSignOptions {
  /** 'stranger' signs with a key the JWKS does not hold (same kid unless `kid` is given). */
  signer?: 'fake' | 'stranger';
  kid?: string;
}

export interface FakeGoogle {
  /** 'http://127.0.0.1:PORT/': googleapis `rootUrl`; Pub/Sub is at `${url}v1/…`. */
  url: string;
  /** Spread into `new OAuth2Client({ …, endpoints: fake.endpoints })`. */
  endpoints: {
    oauth2AuthBaseUrl: string;
    oauth2TokenUrl: string;
    oauth2FederatedSignonPemCertsUrl: string;
    oauth2FederatedSignonJwkCertsUrl: string;
  };
  /** JWKS of the key that signs push OIDC tokens (Google's https://www.googleapis.com/oauth2/v3/certs). */
  jwksUrl: string;
  /** The first configured OAuth client. */
  client: FakeOAuthClient;
  calls: RecordedCall[];
  pushAttempts: PushAttempt[];
  gmailNotifications: GmailNotification[];
  timing: FakeGoogleTiming;
  state: {
    topics: ReadonlyMap<string, Topic>;
    iamPolicies: ReadonlyMap<string, IamPolicy>;
    subscriptions: ReadonlyMap<string, Subscription>;
    /** By account; an expired watch stays here until replaced or stopped. */
    watches: Map<string, GmailWatch>;
    mailboxes: ReadonlyMap<string, Mailbox>;
  };
  /** What the next visit to the authorize endpoint answers: consent as `account`, or access_denied. */
  setConsent(consent: { account?: string; deny?: boolean }): void;
  /** Delivers a message (new id, history record) and notifies a matching watch. */
  addEmail(email: NewEmail): StoredEmail;
  /** Publishes to a topic (fan-out) or straight to one subscription; returns the messageId. */
  publishRaw(name: string, data: string | Buffer | object, attributes?: Record<string, string>): string;
  /** A Google-style OIDC token; `claims` override the defaults (an undefined value removes a claim). */
  signOidcToken(claims?: Record<string, unknown>, options?: OidcSignOptions): Promise<string>;
  /** history.list with a startHistoryId below `historyId` answers 404 from now on. */
  expireHistoryBefore(historyId: number | string, account?: string): void;
  /** The next matching calls (checked before authentication) answer this error instead. */
  failNext(matcher: FailureMatcher, failure: InjectedFailure): void;
  /** Answer every call to the API with Google's 403 SERVICE_DISABLED. */
  disableApi(api: 'gmail' | 'pubsub', disabled?: boolean): void;
  /** Every access token answers 401 from now on (refresh tokens still work). */
  expireAccessTokens(): void;
  /** Every refresh token answers invalid_grant from now on ("Token has been expired or revoked."). */
  revokeRefreshTokens(): void;
  /** Resolves when no push is in flight or waiting for a retry. */
  pushIdle(): Promise<void>;
  close(): Promise<void>;
}

export const GMAIL_PUSH_SERVICE_ACCOUNT = 'gmail-api-push@system.gserviceaccount.com';

export const SCOPES = {
  gmailReadonly: 'https://www.googleapis.com/auth/gmail.readonly',
  gmailMetadata: 'https://www.googleapis.com/auth/gmail.metadata',
  gmailModify: 'https://www.googleapis.com/auth/gmail.modify',
  mail: 'https://mail.google.com/',
  pubsub: 'https://www.googleapis.com/auth/pubsub',
  cloudPlatform: 'https://www.googleapis.com/auth/cloud-platform',
} as const;

export const FAKE_CLIENT: FakeOAuthClient = {
  clientId: '123456789012-fakeclient.apps.googleusercontent.com',
  clientSecret: 'GOCSPX-fake-client-secret',
  projectId: 'gatehouse-test',
  projectNumber: '123456789012',
};

/** Starts the fake on 127.0.0.1, port 0. */
export async function startFakeGoogle(options: FakeGoogleOptions = {}): Promise<FakeGoogle> {
  const keys = await generateKeyPair('RS256', { extractable: true });
  const fake = new FakeGoogleServer(options, keys);
  await fake.listen();
  return fake;
}

// ─── Errors ─────────────────────────────────────────────────────────────────────────────────

/** Which error envelope a path uses. */
type Flavour = 'oauth' | 'page' | 'gmail' | 'pubsub' | 'other';

const CANONICAL: Record<number, string> = {
  400: 'INVALID_ARGUMENT', 401: 'UNAUTHENTICATED', 403: 'PERMISSION_DENIED', 404: 'NOT_FOUND',
  409: 'ALREADY_EXISTS', 429: 'RESOURCE_EXHAUSTED', 499: 'CANCELLED', 500: 'INTERNAL',
  501: 'UNIMPLEMENTED', 503: 'UNAVAILABLE', 504: 'DEADLINE_EXCEEDED',
};

/** Gmail's legacy `errors[].reason` for a status. */
const GMAIL_REASON: Record<number, string> = {
  400: 'invalidArgument', 401: 'authError', 403: 'forbidden', 404: 'notFound', 409: 'conflict',
  429: 'rateLimitExceeded', 500: 'backendError', 503: 'backendError',
};

class GoogleError extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly extra: {
      status?: string;
      /** Gmail errors[0].reason / OAuth `error`. */
      reason?: string;
      /** Gmail errors[0].message when it differs from the top-level one. */
      legacyMessage?: string;
      location?: string;
      /** google.rpc.ErrorInfo reason. */
      infoReason?: string;
      infoMetadata?: Record<string, string>;
      headers?: Record<string, string>;
    } = {},
  ) {
    super(message);
  }
}

const notFound = (resource: string) => new GoogleError(404, `Resource not found (resource=${resource}).`);
const invalid = (message: string) => new GoogleError(400, message);

// ─── Server ─────────────────────────────────────────────────────────────────────────────────

interface Exchange {
  method: string;
  path: string;
  url: URL;
  headers: http.IncomingHttpHeaders;
  body: unknown;
}

interface Reply {
  status: number;
  body?: unknown;
  headers?: Record<string, string>;
}

interface Grant {
  clientId: string;
  account: string;
  scopes: string[];
  expiresAt: number;
  revoked: boolean;
}

interface PendingCode {
  client: FakeOAuthClient;
  redirectUri: string;
  scope: string;
  account: string;
  offline: boolean;
  challenge?: string;
  challengeMethod?: string;
  expiresAt: number;
  used: boolean;
}

/** A message's life in one subscription: visible when visibleAt <= now and not acked. */
interface Delivery {
  message: PubsubMessage;
  visibleAt: number;
  ackId?: string;
  acked: boolean;
  pushAttempts: number;
  pushing: boolean;
  timer?: NodeJS.Timeout;
}

type Keys = Awaited<ReturnType<typeof generateKeyPair>>;

class FakeGoogleServer implements FakeGoogle {
  url = '';
  endpoints = { oauth2AuthBaseUrl: '', oauth2TokenUrl: '', oauth2FederatedSignonPemCertsUrl: '', oauth2FederatedSignonJwkCertsUrl: '' };
  jwksUrl = '';
  client: FakeOAuthClient;
  calls: RecordedCall[] = [];
  pushAttempts: PushAttempt[] = [];
  gmailNotifications: GmailNotification[] = [];
  timing: FakeGoogleTiming;

  private readonly server = http.createServer((req, res) => void this.handle(req, res).catch(() => res.destroy()));
  private readonly clients = new Map<string, FakeOAuthClient>();
  private readonly accessTokenTtl: number;
  private readonly codeTtl: number;
  private consent: { account: string; deny: boolean };
  private readonly codes = new Map<string, PendingCode>();
  private readonly accessTokens = new Map<string, Grant>();
  private readonly refreshTokens = new Map<string, Grant>();
  private readonly failures: { matcher: FailureMatcher; failure: InjectedFailure; left: number }[] = [];
  private readonly disabledApis = new Set<'gmail' | 'pubsub'>();

  private readonly topics = new Map<string, Topic>();
  private readonly iamPolicies = new Map<string, IamPolicy>();
  private readonly subscriptions = new Map<string, Subscription>();
  private readonly deliveries = new Map<string, Delivery[]>();
  private readonly ackIds = new Map<string, { subscription: string; delivery: Delivery }>();
  private readonly watches = new Map<string, GmailWatch>();
  private readonly mailboxes = new Map<string, Mailbox>();
  state: FakeGoogle['state'];

  private readonly kid = `fake-${randomBytes(8).toString('hex')}`;
  private stranger: Keys | undefined;
  private nextMessageId = 1n;
  private nextPubsubId = 4_000_000_000_000_000n;
  private pendingPushes = 0;
  private readonly inflight = new Set<http.ClientRequest>();
  private idleWaiters: (() => void)[] = [];
  private closed = false;

  constructor(options: FakeGoogleOptions, private readonly keys: Keys) {
    const clients = options.clients ?? [FAKE_CLIENT];
    for (const c of clients) this.clients.set(c.clientId, c);
    this.client = clients[0]!;
    this.consent = { account: options.account ?? 'alice@example.com', deny: false };
    this.accessTokenTtl = options.accessTokenTtlSeconds ?? 3599;
    this.codeTtl = options.authorizationCodeTtlSeconds ?? 600;
    this.timing = {
      ackDeadlineMs: undefined,
      pushMinBackoffMs: 50,
      pushMaxBackoffMs: 1_000,
      pushMaxAttempts: 20,
      watchTtlMs: 7 * 24 * 3600 * 1000,
      ...options.timing,
    };
    this.state = {
      topics: this.topics as ReadonlyMap<string, Topic>,
      iamPolicies: this.iamPolicies as ReadonlyMap<string, IamPolicy>,
      subscriptions: this.subscriptions as ReadonlyMap<string, Subscription>,
      watches: this.watches,
      mailboxes: this.mailboxes as ReadonlyMap<string, Mailbox>,
    };
  }

  async listen(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    const { port } = this.server.address() as AddressInfo;
    this.url = `http://127.0.0.1:${port}/`;
    this.endpoints = {
      oauth2AuthBaseUrl: `${this.url}o/oauth2/v2/auth`,
      oauth2TokenUrl: `${this.url}token`,
      oauth2FederatedSignonPemCertsUrl: `${this.url}oauth2/v1/certs`,
      oauth2FederatedSignonJwkCertsUrl: `${this.url}oauth2/v3/certs`,
    };
    this.jwksUrl = this.endpoints.oauth2FederatedSignonJwkCertsUrl;
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const list of this.deliveries.values()) for (const d of list) clearTimeout(d.timer);
    for (const req of this.inflight) req.destroy();
    this.pendingPushes = 0;
    this.settleIdle();
    await new Promise<void>((resolve) => {
      this.server.closeAllConnections();
      this.server.close(() => resolve());
    });
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const raw = Buffer.concat(chunks).toString('utf8');
    const url = new URL(req.url ?? '/', 'http://fake.invalid');
    let path: string;
    try {
      path = decodeURIComponent(url.pathname);
    } catch {
      path = url.pathname;
    }
    const method = req.method ?? 'GET';
    const call: RecordedCall = { method, path, query: queryObject(url.searchParams), body: undefined };
    this.calls.push(call);
    const flavour = flavourOf(path);
    let reply: Reply;
    try {
      call.body = parseBody(raw, req.headers['content-type']);
      const x: Exchange = { method, path, url, headers: req.headers, body: call.body };
      reply = this.injectedFailure(x, flavour) ?? (await this.route(x));
    } catch (err) {
      reply = errorReply(err instanceof GoogleError ? err : new GoogleError(500, `fake-google: ${(err as Error).message}`), flavour);
    }
    call.status = reply.status;
    const headers: Record<string, string> = { ...reply.headers };
    let text = '';
    if (reply.body !== undefined) {
      text = typeof reply.body === 'string' ? reply.body : JSON.stringify(reply.body);
      headers['content-type'] ??= 'application/json; charset=UTF-8';
    }
    res.writeHead(reply.status, headers);
    res.end(text);
  }

  private route(x: Exchange): Reply | Promise<Reply> {
    const { method, path } = x;
    // OAuth and key sets.
    if (method === 'GET' && path === '/o/oauth2/v2/auth') return this.authorize(x);
    if (method === 'POST' && path === '/token') return this.token(x);
    if (method === 'GET' && path === '/oauth2/v3/certs') return this.jwks();
    if (method === 'GET' && path === '/oauth2/v1/certs') return this.pemCerts();
    // Pub/Sub: /v1/projects/{p}/{topics|subscriptions}/{name}[:verb]
    const ps = /^\/v1\/projects\/([^/]+)\/(topics|subscriptions)\/([^/:]+)(?::(\w+))?$/.exec(path);
    if (ps) return this.pubsub(x, `projects/${ps[1]}/${ps[2]}/${ps[3]}`, ps[2] as 'topics' | 'subscriptions', ps[3]!, ps[4]);
    // Gmail: /gmail/v1/users/{userId}/{resource}[/{id}]
    const gm = /^\/gmail\/v1\/users\/([^/]+)\/(profile|watch|stop|history|messages)(?:\/([^/]+))?$/.exec(path);
    if (gm) return this.gmail(x, gm[1]!, gm[2]!, gm[3]);
    throw new GoogleError(404, `fake-google: no route for ${method} ${path}`);
  }

  private injectedFailure(x: Exchange, flavour: Flavour): Reply | undefined {
    const i = this.failures.findIndex(({ matcher: m }) =>
      (!m.method || m.method.toUpperCase() === x.method) && (typeof m.path === 'string' ? m.path === x.path : m.path.test(x.path)));
    if (i < 0) return undefined;
    const entry = this.failures[i]!;
    if (--entry.left <= 0) this.failures.splice(i, 1);
    const f = entry.failure;
    return errorReply(new GoogleError(f.status, f.message, { status: f.errorStatus, reason: f.reason, infoReason: f.reason }), flavour);
  }

  // ─── OAuth 2.0 (accounts.google.com / oauth2.googleapis.com) ────────────────────────────

  /** The consent screen, already clicked: 302 back to the client with a code or an error. */
  private authorize(x: Exchange): Reply {
    const q = x.url.searchParams;
    const page = (status: number, error: string, description: string) =>
      new GoogleError(status, description, { reason: error });
    const client = this.clients.get(q.get('client_id') ?? '');
    if (!client) throw page(401, 'invalid_client', 'The OAuth client was not found.');
    const redirectUri = q.get('redirect_uri') ?? '';
    // Like Google, an unregistered redirect_uri gets an error page, never a redirect.
    if (!redirectAllowed(client, redirectUri)) throw page(400, 'redirect_uri_mismatch', `You can't sign in to this app because it doesn't comply with Google's OAuth 2.0 policy. redirect_uri=${redirectUri}`);
    if (q.get('response_type') !== 'code') throw page(400, 'invalid_request', `Invalid response_type: ${q.get('response_type') ?? ''}`);
    const scope = q.get('scope');
    if (!scope) throw page(400, 'invalid_request', 'Missing required parameter: scope');
    const challenge = q.get('code_challenge') ?? undefined;
    const challengeMethod = challenge ? (q.get('code_challenge_method') ?? 'plain') : undefined;
    if (challengeMethod && challengeMethod !== 'S256' && challengeMethod !== 'plain') throw page(400, 'invalid_request', `Invalid code_challenge_method: ${challengeMethod}`);
    if (challenge && !/^[A-Za-z0-9\-._~]{43,128}$/.test(challenge)) throw page(400, 'invalid_request', 'Invalid code_challenge.');

    const back = new URL(redirectUri);
    const state = q.get('state');
    if (state !== null) back.searchParams.set('state', state);
    if (this.consent.deny) {
      back.searchParams.set('error', 'access_denied');
    } else {
      const code = `4/0A${randomBytes(32).toString('base64url')}`;
      this.codes.set(code, {
        client, redirectUri, scope, account: this.consent.account, offline: q.get('access_type') === 'offline',
        challenge, challengeMethod, expiresAt: Date.now() + this.codeTtl * 1000, used: false,
      });
      back.searchParams.set('code', code);
      back.searchParams.set('scope', scope);
    }
    return { status: 302, headers: { location: back.toString() } };
  }

  /** POST /token, form-encoded, client authenticated by client_secret_post or HTTP Basic. */
  private token(x: Exchange): Reply {
    const form = (x.body ?? {}) as Record<string, string>;
    const oauthError = (status: number, error: string, description: string) => new GoogleError(status, description, { reason: error });
    let clientId = form.client_id;
    let clientSecret = form.client_secret;
    const basic = /^Basic (.+)$/i.exec(x.headers.authorization ?? '');
    if (basic) [clientId, clientSecret] = Buffer.from(basic[1]!, 'base64').toString('utf8').split(':');
    const client = this.clients.get(clientId ?? '');
    if (!client) throw oauthError(401, 'invalid_client', 'The OAuth client was not found.');
    if (clientSecret !== client.clientSecret) throw oauthError(401, 'invalid_client', 'Unauthorized');
    const headers = { 'cache-control': 'no-cache, no-store, max-age=0, must-revalidate', pragma: 'no-cache' };

    if (form.grant_type === 'authorization_code') {
      if (!form.code) throw oauthError(400, 'invalid_request', 'Missing required parameter: code');
      const pending = this.codes.get(form.code);
      if (!pending || pending.used || pending.expiresAt <= Date.now() || pending.client !== client) throw oauthError(400, 'invalid_grant', 'Bad Request');
      // A code is single-use (RFC 6749 §4.1.2): even a failed redemption burns it.
      pending.used = true;
      if (form.redirect_uri !== pending.redirectUri) throw oauthError(400, 'redirect_uri_mismatch', 'Bad Request');
      if (pending.challenge) {
        const verifier = form.code_verifier;
        if (!verifier) throw oauthError(400, 'invalid_grant', 'Missing code verifier.');
        const derived = pending.challengeMethod === 'S256' ? createHash('sha256').update(verifier).digest('base64url') : verifier;
        if (!/^[A-Za-z0-9\-._~]{43,128}$/.test(verifier) || derived !== pending.challenge) throw oauthError(400, 'invalid_grant', 'Invalid code verifier.');
      }
      const grant = this.issueAccessToken(client, pending.account, pending.scope.split(' '));
      const body: Record<string, unknown> = { access_token: grant.token, expires_in: this.accessTokenTtl, scope: pending.scope, token_type: 'Bearer' };
      if (pending.offline) {
        const refreshToken = `1//0${randomBytes(48).toString('base64url')}`;
        this.refreshTokens.set(refreshToken, { ...grant.grant, expiresAt: Infinity });
        body.refresh_token = refreshToken;
      }
      return { status: 200, body, headers };
    }
    if (form.grant_type === 'refresh_token') {
      if (!form.refresh_token) throw oauthError(400, 'invalid_request', 'Missing required parameter: refresh_token');
      const stored = this.refreshTokens.get(form.refresh_token);
      if (!stored || stored.revoked) throw oauthError(400, 'invalid_grant', 'Token has been expired or revoked.');
      if (stored.clientId !== client.clientId) throw oauthError(400, 'unauthorized_client', 'Unauthorized');
      const grant = this.issueAccessToken(client, stored.account, stored.scopes);
      return { status: 200, body: { access_token: grant.token, expires_in: this.accessTokenTtl, scope: stored.scopes.join(' '), token_type: 'Bearer' }, headers };
    }
    throw oauthError(400, 'unsupported_grant_type', `Invalid grant_type: ${form.grant_type ?? ''}`);
  }

  private issueAccessToken(client: FakeOAuthClient, account: string, scopes: string[]): { token: string; grant: Grant } {
    const token = `ya29.${randomBytes(48).toString('base64url')}`;
    const grant = { clientId: client.clientId, account, scopes, expiresAt: Date.now() + this.accessTokenTtl * 1000, revoked: false };
    this.accessTokens.set(token, grant);
    return { token, grant };
  }

  /** The Authorization: Bearer check every API call passes, plus the scope check. */
  private authenticate(x: Exchange, acceptedScopes: readonly string[], service: string): Grant {
    const header = x.headers.authorization;
    const help = 'Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.';
    if (!header) {
      throw new GoogleError(401, `Request is missing required authentication credential. ${help}`, {
        reason: 'required', legacyMessage: 'Login Required.', location: 'Authorization', infoReason: 'CREDENTIALS_MISSING',
        infoMetadata: { service }, headers: { 'www-authenticate': 'Bearer realm="https://accounts.google.com/"' },
      });
    }
    const token = /^Bearer (.+)$/i.exec(header)?.[1];
    const grant = token ? this.accessTokens.get(token) : undefined;
    if (!grant || grant.revoked || grant.expiresAt <= Date.now()) {
      throw new GoogleError(401, `Request had invalid authentication credentials. ${help}`, {
        reason: 'authError', legacyMessage: 'Invalid Credentials', location: 'Authorization',
        infoReason: grant ? 'ACCESS_TOKEN_EXPIRED' : 'ACCESS_TOKEN_TYPE_UNSUPPORTED', infoMetadata: { service },
        headers: { 'www-authenticate': 'Bearer realm="https://accounts.google.com/", error="invalid_token"' },
      });
    }
    if (!grant.scopes.some((s) => acceptedScopes.includes(s))) {
      throw new GoogleError(403, 'Request had insufficient authentication scopes.', {
        reason: 'insufficientPermissions', legacyMessage: 'Insufficient Permission', infoReason: 'ACCESS_TOKEN_SCOPE_INSUFFICIENT', infoMetadata: { service },
      });
    }
    const api = service === 'gmail.googleapis.com' ? 'gmail' : 'pubsub';
    if (this.disabledApis.has(api)) {
      const client = [...this.clients.values()].find((c) => c.clientId === grant.clientId)!;
      const title = api === 'gmail' ? 'Gmail API' : 'Cloud Pub/Sub API';
      throw new GoogleError(403, `${title} has not been used in project ${client.projectNumber} before or it is disabled. Enable it by visiting https://console.developers.google.com/apis/api/${service}/overview?project=${client.projectNumber} then retry. If you enabled this API recently, wait a few minutes for the action to propagate to our systems and retry.`, {
        reason: 'accessNotConfigured', infoReason: 'SERVICE_DISABLED', infoMetadata: { service, consumer: `projects/${client.projectNumber}` },
      });
    }
    return grant;
  }

  // The JWKS that push OIDC tokens verify against (Google: https://www.googleapis.com/oauth2/v3/certs).
  private async jwks(): Promise<Reply> {
    const jwk: JWK = await exportJWK(this.keys.publicKey);
    return { status: 200, body: { keys: [{ ...jwk, kid: this.kid, alg: 'RS256', use: 'sig' }] }, headers: { 'cache-control': 'public, max-age=300' } };
  }

  // The PEM flavour OAuth2Client.verifyIdToken fetches in Node (Google serves X.509 certificates;
  // an SPKI public key verifies the same way with node:crypto).
  private async pemCerts(): Promise<Reply> {
    return { status: 200, body: { [this.kid]: await exportSPKI(this.keys.publicKey) }, headers: { 'cache-control': 'public, max-age=300' } };
  }

  async signOidcToken(claims: Record<string, unknown> = {}, options: OidcSignOptions = {}): Promise<string> {
    const now = Math.floor(Date.now() / 1000);
    const email = typeof claims.email === 'string' ? claims.email : `pubsub-push@${this.client.projectId}.iam.gserviceaccount.com`;
    const sub = numericId(email);
    const payload: Record<string, unknown> = {
      aud: this.url, azp: sub, email, email_verified: true, exp: now + 3600, iat: now, iss: 'https://accounts.google.com', sub, ...claims,
    };
    for (const [k, v] of Object.entries(payload)) if (v === undefined) delete payload[k];
    let key = this.keys.privateKey;
    if (options.signer === 'stranger') {
      this.stranger ??= await generateKeyPair('RS256');
      key = this.stranger.privateKey;
    }
    return new SignJWT(payload).setProtectedHeader({ alg: 'RS256', kid: options.kid ?? this.kid, typ: 'JWT' }).sign(key);
  }

  // ─── Cloud Pub/Sub v1 (pubsub.googleapis.com/v1/…) ──────────────────────────────────────

  private pubsub(x: Exchange, name: string, kind: 'topics' | 'subscriptions', shortName: string, verb: string | undefined): Reply {
    this.authenticate(x, [SCOPES.pubsub, SCOPES.cloudPlatform], 'pubsub.googleapis.com');
    const body = (x.body ?? {}) as Record<string, any>;
    const key = `${x.method} ${kind}${verb ? `:${verb}` : ''}`;
    switch (key) {
      case 'GET topics': {
        const topic = this.topics.get(name);
        if (!topic) throw notFound(shortName);
        return ok(topic);
      }
      case 'PUT topics': {
        if (!validResourceId(shortName)) throw invalid(`Invalid [topics] name: (name=${name})`);
        if (this.topics.has(name)) throw new GoogleError(409, `Resource already exists in the project (resource=${shortName}).`);
        const topic: Topic = { name, ...(body.labels ? { labels: body.labels } : {}) };
        this.topics.set(name, topic);
        this.iamPolicies.set(name, { etag: 'ACAB' });
        return ok(topic);
      }
      case 'POST topics:getIamPolicy': {
        const policy = this.iamPolicies.get(name);
        if (!policy) throw notFound(shortName);
        return ok(policy);
      }
      case 'POST topics:setIamPolicy': {
        const current = this.iamPolicies.get(name);
        if (!current) throw notFound(shortName);
        const policy = body.policy as IamPolicy | undefined;
        if (!policy || typeof policy !== 'object') throw invalid('Invalid JSON payload: policy is required.');
        // Read-modify-write: a stale etag is refused.
        if (policy.etag !== undefined && policy.etag !== current.etag) {
          throw new GoogleError(409, 'There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff.', { status: 'ABORTED' });
        }
        const bindings = (policy.bindings ?? []).filter((b) => b.members?.length);
        for (const b of bindings) {
          if (typeof b.role !== 'string' || !b.role.startsWith('roles/')) throw invalid(`Role (${String(b.role)}) does not exist in the resource's hierarchy.`);
          for (const m of b.members) if (!/^(user|serviceAccount|group|domain|principal|principalSet):.+|^allUsers$|^allAuthenticatedUsers$/.test(m)) throw invalid(`Invalid member: ${m}`);
        }
        const next: IamPolicy = bindings.length
          ? { version: 1, etag: randomBytes(8).toString('base64'), bindings: structuredClone(bindings) }
          : { etag: randomBytes(8).toString('base64') };
        this.iamPolicies.set(name, next);
        return ok(next);
      }
      case 'GET subscriptions': {
        const sub = this.subscriptions.get(name);
        if (!sub) throw notFound(shortName);
        return ok(sub);
      }
      case 'PUT subscriptions': {
        if (!validResourceId(shortName)) throw invalid(`Invalid [subscriptions] name: (name=${name})`);
        if (this.subscriptions.has(name)) throw new GoogleError(409, `Resource already exists in the project (resource=${shortName}).`);
        if (typeof body.topic !== 'string' || !body.topic) throw invalid('Invalid resource name given (name=). Refer to https://cloud.google.com/pubsub/docs/pubsub-basics#resource_names for more information.');
        if (!this.topics.has(body.topic)) throw notFound(body.topic.split('/').pop()!);
        const sub: Subscription = {
          name,
          topic: body.topic,
          pushConfig: validPushConfig(body.pushConfig),
          ackDeadlineSeconds: validAckDeadline(body.ackDeadlineSeconds ?? 10),
          messageRetentionDuration: body.messageRetentionDuration ?? '604800s',
          ...(body.labels ? { labels: body.labels } : {}),
        };
        this.subscriptions.set(name, sub);
        this.deliveries.set(name, []);
        return ok(sub);
      }
      case 'PATCH subscriptions': {
        const sub = this.subscriptions.get(name);
        if (!sub) throw notFound(shortName);
        const mask = typeof body.updateMask === 'string' ? body.updateMask.split(',').map((s: string) => s.trim()).filter(Boolean) : [];
        if (!mask.length) throw invalid('Invalid update_mask provided in the UpdateSubscriptionRequest: the update_mask must not be empty.');
        const patch = (body.subscription ?? {}) as Record<string, any>;
        const next = { ...sub };
        for (const field of mask) {
          if (field === 'pushConfig') next.pushConfig = validPushConfig(patch.pushConfig);
          else if (field === 'ackDeadlineSeconds') next.ackDeadlineSeconds = validAckDeadline(patch.ackDeadlineSeconds ?? 10);
          else if (field === 'messageRetentionDuration') next.messageRetentionDuration = patch.messageRetentionDuration ?? '604800s';
          else if (field === 'labels') next.labels = patch.labels;
          else throw invalid(`Invalid update_mask provided in the UpdateSubscriptionRequest: the '${field}' field cannot be updated.`);
        }
        this.subscriptions.set(name, next);
        this.pump(name);
        return ok(next);
      }
      case 'POST subscriptions:pull': {
        if (!this.subscriptions.has(name)) throw notFound(shortName);
        const max = Number(body.maxMessages);
        if (!Number.isInteger(max) || max <= 0) throw invalid('max_messages must be a positive integer.');
        const now = Date.now();
        const receivedMessages = [];
        for (const d of this.deliveries.get(name)!) {
          if (receivedMessages.length >= max) break;
          if (d.acked || d.pushing || d.visibleAt > now) continue;
          receivedMessages.push({ ackId: this.lease(name, d), message: d.message });
        }
        // proto3 JSON: an empty repeated field is omitted, so "no messages" is `{}`.
        return ok(receivedMessages.length ? { receivedMessages } : {});
      }
      case 'POST subscriptions:acknowledge': {
        if (!this.subscriptions.has(name)) throw notFound(shortName);
        const ids: unknown = body.ackIds;
        if (!Array.isArray(ids) || !ids.length) throw invalid('No ack ids specified.');
        for (const id of ids) {
          const lease = this.ackIds.get(String(id));
          if (!lease || lease.subscription !== name) throw invalid(`You have passed an invalid ack ID to the service (ack_id=${String(id)}).`);
        }
        // An ack for a lease that has since been redelivered (stale ackId) is silently ignored.
        for (const id of ids) {
          const { delivery } = this.ackIds.get(String(id))!;
          if (delivery.ackId === id) this.settle(name, delivery);
        }
        return ok({});
      }
    }
    throw new GoogleError(404, `fake-google: no route for ${x.method} ${x.path}`);
  }

  private ackDeadlineMs(subscription: string): number {
    return this.timing.ackDeadlineMs ?? this.subscriptions.get(subscription)!.ackDeadlineSeconds * 1000;
  }

  /** Hands a delivery out (pull): a fresh ackId, invisible until the ack deadline passes. */
  private lease(subscription: string, d: Delivery): string {
    const ackId = randomBytes(36).toString('base64url');
    d.ackId = ackId;
    d.visibleAt = Date.now() + this.ackDeadlineMs(subscription);
    this.ackIds.set(ackId, { subscription, delivery: d });
    return ackId;
  }

  private settle(subscription: string, d: Delivery): void {
    d.acked = true;
    clearTimeout(d.timer);
    const list = this.deliveries.get(subscription);
    if (list) this.deliveries.set(subscription, list.filter((e) => e !== d));
  }

  /** Publishes to a topic: each of its subscriptions gets its own copy. */
  private publish(topic: string, message: PubsubMessage): void {
    for (const sub of this.subscriptions.values()) if (sub.topic === topic) this.enqueue(sub.name, message);
  }

  private enqueue(subscription: string, message: PubsubMessage): void {
    this.deliveries.get(subscription)!.push({ message, visibleAt: 0, acked: false, pushAttempts: 0, pushing: false });
    this.pump(subscription);
  }

  publishRaw(name: string, data: string | Buffer | object, attributes?: Record<string, string>): string {
    const bytes = Buffer.isBuffer(data) ? data : Buffer.from(typeof data === 'string' ? data : JSON.stringify(data));
    const message = this.newMessage(bytes, attributes);
    if (this.subscriptions.has(name)) this.enqueue(name, message);
    else if (this.topics.has(name)) this.publish(name, message);
    else throw new Error(`fake-google: no topic or subscription named ${name}`);
    return message.messageId;
  }

  private newMessage(data: Buffer, attributes?: Record<string, string>): PubsubMessage {
    const message: PubsubMessage = { data: data.toString('base64'), messageId: String(this.nextPubsubId++), publishTime: new Date().toISOString() };
    if (attributes && Object.keys(attributes).length) message.attributes = attributes;
    return message;
  }

  // ─── Pub/Sub push delivery ──────────────────────────────────────────────────────────────

  /** Starts a push for every visible delivery of a push subscription. */
  private pump(subscription: string): void {
    const sub = this.subscriptions.get(subscription);
    if (!sub?.pushConfig.pushEndpoint || this.closed) return;
    const now = Date.now();
    for (const d of this.deliveries.get(subscription)!) {
      if (!d.acked && !d.pushing && !d.timer && d.visibleAt <= now && d.pushAttempts < this.timing.pushMaxAttempts) void this.push(sub, d);
    }
  }

  private async push(sub: Subscription, d: Delivery): Promise<void> {
    const endpoint = sub.pushConfig.pushEndpoint!;
    d.pushing = true;
    d.pushAttempts++;
    this.pendingPushes++;
    const timeoutMs = this.ackDeadlineMs(sub.name);
    const attempt: PushAttempt = { subscription: sub.name, messageId: d.message.messageId, attempt: d.pushAttempts, endpoint, at: new Date() };
    try {
      const headers: Record<string, string> = {
        'content-type': 'application/json',
        'user-agent': 'APIs-Google; (+https://developers.google.com/webmasters/APIs-Google.html)',
      };
      const oidc = sub.pushConfig.oidcToken;
      if (oidc?.serviceAccountEmail) {
        // When no audience is configured, Pub/Sub uses the push endpoint URL.
        headers.authorization = `Bearer ${await this.signOidcToken({ aud: oidc.audience || endpoint, email: oidc.serviceAccountEmail })}`;
        attempt.authorization = headers.authorization;
      }
      // Google sends both spellings of the id and time fields.
      const m = d.message;
      const body = JSON.stringify({
        message: { ...(m.attributes ? { attributes: m.attributes } : {}), data: m.data, messageId: m.messageId, message_id: m.messageId, publishTime: m.publishTime, publish_time: m.publishTime },
        subscription: sub.name,
      });
      attempt.status = await postJson(endpoint, headers, body, timeoutMs, this.inflight);
    } catch (err) {
      attempt.error = (err as Error).message;
    }
    this.pushAttempts.push(attempt);
    d.pushing = false;
    if (this.closed) return;
    const status = attempt.status;
    // Pub/Sub counts 102, 200, 201, 202 and 204 as an ack.
    if (status !== undefined && (status === 102 || (status >= 200 && status < 300))) {
      this.settle(sub.name, d);
    } else if (d.pushAttempts < this.timing.pushMaxAttempts) {
      const backoff = Math.min(this.timing.pushMinBackoffMs * 2 ** (d.pushAttempts - 1), this.timing.pushMaxBackoffMs);
      d.visibleAt = Date.now() + backoff;
      this.pendingPushes++;
      d.timer = setTimeout(() => {
        d.timer = undefined;
        d.visibleAt = 0;
        this.pendingPushes--;
        this.pump(sub.name);
        this.settleIdle();
      }, backoff);
      d.timer.unref();
    } else {
      d.visibleAt = 0; // Given up on push: a later PATCH to pull can still receive it.
    }
    this.pendingPushes--;
    this.settleIdle();
  }

  pushIdle(): Promise<void> {
    if (this.pendingPushes <= 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private settleIdle(): void {
    if (this.pendingPushes > 0) return;
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const w of waiters) w();
  }

  // ─── Gmail v1 (gmail.googleapis.com/gmail/v1/users/{userId}/…) ──────────────────────────

  private gmail(x: Exchange, userId: string, resource: string, id: string | undefined): Reply {
    const grant = this.authenticate(x, [SCOPES.mail, SCOPES.gmailModify, SCOPES.gmailReadonly, SCOPES.gmailMetadata], 'gmail.googleapis.com');
    if (userId !== 'me' && userId.toLowerCase() !== grant.account.toLowerCase()) {
      throw new GoogleError(403, `Delegation denied for ${grant.account}`, { reason: 'forbidden' });
    }
    const box = this.mailbox(grant.account);
    const q = x.url.searchParams;
    const fullScopes: string[] = [SCOPES.mail, SCOPES.gmailModify, SCOPES.gmailReadonly];
    const metadataOnly = !grant.scopes.some((s) => fullScopes.includes(s));
    const route = `${x.method} ${resource}${id ? '/:id' : ''}`;
    switch (route) {
      case 'GET profile':
        return ok({ emailAddress: box.emailAddress, messagesTotal: box.messages.length, threadsTotal: new Set(box.messages.map((m) => m.threadId)).size, historyId: String(box.historyId) });
      case 'POST watch':
        return ok(this.watch(grant, box, (x.body ?? {}) as Record<string, any>));
      case 'POST stop':
        this.watches.delete(box.emailAddress);
        return { status: 204 };
      case 'GET history':
        return ok(listHistory(box, q));
      case 'GET messages': {
        if (q.get('q') && metadataOnly) throw new GoogleError(403, "Metadata scope does not support 'q' parameter", { reason: 'forbidden' });
        return ok(listMessages(box, q));
      }
      case 'GET messages/:id': {
        const message = box.messages.find((m) => m.id === id);
        if (!message) {
          if (!/^[0-9a-f]{16}$/.test(id!)) throw new GoogleError(400, 'Invalid id value', { reason: 'invalidArgument' });
          throw new GoogleError(404, 'Requested entity was not found.', { reason: 'notFound' });
        }
        const format = q.get('format') ?? 'full';
        if (format === 'full' && metadataOnly) throw new GoogleError(403, "Metadata scope doesn't allow format FULL", { reason: 'forbidden' });
        if (format !== 'full' && format !== 'metadata' && format !== 'minimal') throw new GoogleError(400, `fake-google: format=${format} is not implemented`, { reason: 'invalidArgument' });
        return ok(renderMessage(message, format, q.getAll('metadataHeaders')));
      }
    }
    throw new GoogleError(404, `fake-google: no route for ${x.method} ${x.path}`);
  }

  private mailbox(account: string): Mailbox {
    const key = account.toLowerCase();
    let box = this.mailboxes.get(key);
    if (!box) {
      box = { emailAddress: key, historyId: 1000, messages: [], history: [], retainedFrom: 1000 };
      this.mailboxes.set(key, box);
    }
    return box;
  }

  /** users.watch: checks the topic the way Gmail does (same project, exists, Gmail may publish). */
  private watch(grant: Grant, box: Mailbox, body: Record<string, any>): { historyId: string; expiration: string } {
    const client = this.clients.get(grant.clientId)!;
    const topicName = body.topicName;
    if (typeof topicName !== 'string' || !topicName.startsWith(`projects/${client.projectId}/topics/`)) {
      throw new GoogleError(400, `Invalid topicName does not match projects/${client.projectId}/topics/*`, { reason: 'invalidArgument' });
    }
    if (!this.topics.has(topicName)) {
      throw new GoogleError(404, `Error sending test message to Cloud PubSub ${topicName} : Resource not found (resource=${topicName.split('/').pop()}).`, { reason: 'notFound' });
    }
    if (!this.gmailMayPublish(topicName)) {
      throw new GoogleError(403, `Error sending test message to Cloud PubSub ${topicName} : User not authorized to perform this action.`, { reason: 'forbidden' });
    }
    const behavior = String(body.labelFilterBehavior ?? body.labelFilterAction ?? 'include').toLowerCase();
    if (behavior !== 'include' && behavior !== 'exclude') throw new GoogleError(400, `Invalid value for labelFilterBehavior: ${behavior}`, { reason: 'invalidArgument' });
    const watch: GmailWatch = {
      topicName,
      labelIds: Array.isArray(body.labelIds) ? body.labelIds.map(String) : [],
      labelFilterBehavior: behavior,
      historyId: String(box.historyId),
      expiration: String(Date.now() + this.timing.watchTtlMs),
    };
    this.watches.set(box.emailAddress, watch);
    return { historyId: watch.historyId, expiration: watch.expiration };
  }

  private gmailMayPublish(topic: string): boolean {
    const member = `serviceAccount:${GMAIL_PUSH_SERVICE_ACCOUNT}`;
    return (this.iamPolicies.get(topic)?.bindings ?? []).some((b) =>
      ['roles/pubsub.publisher', 'roles/pubsub.editor', 'roles/pubsub.admin', 'roles/editor', 'roles/owner'].includes(b.role) && b.members.includes(member));
  }

  addEmail(email: NewEmail): StoredEmail {
    const box = this.mailbox(email.account ?? this.consent.account);
    // Gmail history ids only ever increase; they are not contiguous.
    box.historyId += 3;
    const id = (0x190000000000000n + this.nextMessageId++ * 0x1000n).toString(16).padStart(16, '0');
    const date = email.date ?? new Date();
    const stored: StoredEmail = {
      id,
      threadId: email.threadId ?? id,
      labelIds: [...(email.labels ?? ['INBOX'])],
      historyId: String(box.historyId),
      internalDate: String(date.getTime()),
      from: email.from,
      to: email.to ?? box.emailAddress,
      subject: email.subject,
      text: email.text,
      html: email.html,
      messageIdHeader: `<${randomBytes(12).toString('hex')}@mail.example.com>`,
    };
    box.messages.push(stored);
    box.history.push({ id: box.historyId, message: stored, labelIds: [...stored.labelIds] });
    this.notifyWatch(box, stored.labelIds);
    return stored;
  }

  /** Gmail's push: `{ emailAddress, historyId }` JSON (historyId a number, as Gmail sends it) to the watched topic. */
  private notifyWatch(box: Mailbox, labels: string[]): void {
    const watch = this.watches.get(box.emailAddress);
    if (!watch || Number(watch.expiration) <= Date.now()) return;
    const hit = watch.labelIds.some((l) => labels.includes(l));
    if (watch.labelIds.length && (watch.labelFilterBehavior === 'include' ? !hit : hit)) return;
    const published = this.topics.has(watch.topicName) && this.gmailMayPublish(watch.topicName);
    this.gmailNotifications.push({ account: box.emailAddress, topicName: watch.topicName, historyId: box.historyId, published });
    if (!published) return;
    const data = Buffer.from(JSON.stringify({ emailAddress: box.emailAddress, historyId: box.historyId }));
    this.publish(watch.topicName, this.newMessage(data));
  }

  expireHistoryBefore(historyId: number | string, account?: string): void {
    const box = this.mailbox(account ?? this.consent.account);
    box.retainedFrom = Number(historyId);
    box.history = box.history.filter((h) => h.id >= box.retainedFrom);
  }

  // ─── Test controls ──────────────────────────────────────────────────────────────────────

  setConsent(consent: { account?: string; deny?: boolean }): void {
    this.consent = { account: consent.account ?? this.consent.account, deny: consent.deny ?? false };
  }

  failNext(matcher: FailureMatcher, failure: InjectedFailure): void {
    this.failures.push({ matcher, failure, left: failure.times ?? 1 });
  }

  disableApi(api: 'gmail' | 'pubsub', disabled = true): void {
    if (disabled) this.disabledApis.add(api);
    else this.disabledApis.delete(api);
  }

  expireAccessTokens(): void {
    for (const g of this.accessTokens.values()) g.revoked = true;
  }

  revokeRefreshTokens(): void {
    for (const g of this.refreshTokens.values()) g.revoked = true;
  }
}

// ─── Gmail rendering ──────────────────────────────────────────────────────────────────────

function listHistory(box: Mailbox, q: URLSearchParams): object {
  const start = Number(q.get('startHistoryId'));
  if (!q.get('startHistoryId') || !Number.isSafeInteger(start) || start < 0) throw new GoogleError(400, 'Invalid startHistoryId', { reason: 'invalidArgument' });
  // Google: "A historyId is typically valid for at least a week"; older ones answer 404.
  if (start < box.retainedFrom) throw new GoogleError(404, 'Requested entity was not found.', { reason: 'notFound' });
  const types = q.getAll('historyTypes');
  const labelId = q.get('labelId');
  const records = box.history.filter((h) => h.id > start && (!types.length || types.includes('messageAdded')) && (!labelId || h.labelIds.includes(labelId)));
  const { page, nextPageToken } = paginate(records, q, 100);
  const out: Record<string, unknown> = {};
  if (page.length) {
    out.history = page.map((h) => ({
      id: String(h.id),
      messages: [{ id: h.message.id, threadId: h.message.threadId }],
      messagesAdded: [{ message: { id: h.message.id, threadId: h.message.threadId, labelIds: h.labelIds } }],
    }));
  }
  if (nextPageToken) out.nextPageToken = nextPageToken;
  out.historyId = String(box.historyId);
  return out;
}

function listMessages(box: Mailbox, q: URLSearchParams): object {
  const labelIds = q.getAll('labelIds');
  const includeSpamTrash = q.get('includeSpamTrash') === 'true';
  const matches = searchQuery(q.get('q') ?? '');
  const found = box.messages
    .filter((m) => labelIds.every((l) => m.labelIds.includes(l)))
    .filter((m) => includeSpamTrash || !m.labelIds.some((l) => l === 'SPAM' || l === 'TRASH'))
    .filter(matches)
    .sort((a, b) => Number(b.internalDate) - Number(a.internalDate) || (b.id < a.id ? -1 : 1));
  const { page, nextPageToken } = paginate(found, q, 100);
  const out: Record<string, unknown> = {};
  if (page.length) out.messages = page.map((m) => ({ id: m.id, threadId: m.threadId }));
  if (nextPageToken) out.nextPageToken = nextPageToken;
  out.resultSizeEstimate = found.length;
  return out;
}

function paginate<T>(items: T[], q: URLSearchParams, defaultMax: number): { page: T[]; nextPageToken?: string } {
  const max = Math.min(Number(q.get('maxResults') ?? defaultMax) || defaultMax, 500);
  const offset = Number(q.get('pageToken') ?? 0) || 0;
  const page = items.slice(offset, offset + max);
  return { page, nextPageToken: offset + max < items.length ? String(offset + max).padStart(20, '0') : undefined };
}

/** A small subset of Gmail search: from:, to:, subject:, label:, in:, is:unread, after:, before:, bare words. */
function searchQuery(q: string): (m: StoredEmail) => boolean {
  const terms = q.match(/(?:[^\s"]+:)?(?:"[^"]*"|\S+)/g) ?? [];
  const tests = terms.map((term) => {
    const [, op, rawValue] = /^(?:(\w+):)?(.*)$/.exec(term)!;
    const value = rawValue!.replace(/^"|"$/g, '').toLowerCase();
    const has = (s: string) => s.toLowerCase().includes(value);
    const day = (v: string) => (/^\d+$/.test(v) ? Number(v) * 1000 : Date.parse(v.replace(/\//g, '-')));
    switch (op) {
      case 'from': return (m: StoredEmail) => has(m.from);
      case 'to': return (m: StoredEmail) => has(m.to);
      case 'subject': return (m: StoredEmail) => has(m.subject);
      case 'label': case 'in': return (m: StoredEmail) => m.labelIds.some((l) => l.toLowerCase() === value);
      case 'is': return (m: StoredEmail) => m.labelIds.some((l) => l.toLowerCase() === value);
      case 'after': return (m: StoredEmail) => Number(m.internalDate) >= day(value);
      case 'before': return (m: StoredEmail) => Number(m.internalDate) < day(value);
      default: return (m: StoredEmail) => [m.from, m.to, m.subject, m.text].some(has);
    }
  });
  return (m) => tests.every((t) => t(m));
}

interface MessagePart {
  partId: string;
  mimeType: string;
  filename: string;
  headers: { name: string; value: string }[];
  body: { size: number; data?: string };
  parts?: MessagePart[];
}

/** Gmail's Message resource for format=full | metadata | minimal. */
function renderMessage(m: StoredEmail, format: string, metadataHeaders: string[]): object {
  const textPart = leafPart(m.html === undefined ? '' : '0', 'text/plain', m.text);
  const htmlPart = m.html === undefined ? undefined : leafPart('1', 'text/html', m.html);
  const boundary = `000000000000${createHash('sha256').update(m.id).digest('hex').slice(0, 16)}`;
  const headers = [
    { name: 'MIME-Version', value: '1.0' },
    { name: 'Date', value: new Date(Number(m.internalDate)).toUTCString().replace('GMT', '+0000') },
    { name: 'Message-ID', value: m.messageIdHeader },
    { name: 'Subject', value: m.subject },
    { name: 'From', value: m.from },
    { name: 'To', value: m.to },
    { name: 'Content-Type', value: htmlPart ? `multipart/alternative; boundary="${boundary}"` : 'text/plain; charset="UTF-8"' },
  ];
  const payload: MessagePart = htmlPart
    ? { partId: '', mimeType: 'multipart/alternative', filename: '', headers, body: { size: 0 }, parts: [textPart, htmlPart] }
    : { ...textPart, headers: [...headers, ...textPart.headers.slice(1)] };
  const sizeEstimate = headers.reduce((n, h) => n + h.name.length + h.value.length + 4, 0) + textPart.body.size + (htmlPart?.body.size ?? 0) + 200;
  const base = {
    id: m.id, threadId: m.threadId, labelIds: m.labelIds, snippet: snippetOf(m.text), sizeEstimate, historyId: m.historyId, internalDate: m.internalDate,
  };
  if (format === 'minimal') return base;
  if (format === 'metadata') {
    const wanted = metadataHeaders.map((h) => h.toLowerCase());
    return { ...base, payload: { mimeType: payload.mimeType, headers: wanted.length ? headers.filter((h) => wanted.includes(h.name.toLowerCase())) : headers } };
  }
  return { ...base, payload };
}

function leafPart(partId: string, mimeType: string, content: string): MessagePart {
  const bytes = Buffer.from(content, 'utf8');
  return {
    partId,
    mimeType,
    filename: '',
    headers: [
      { name: 'Content-Type', value: `${mimeType}; charset="UTF-8"` },
      // The original transfer encoding is reported, but body.data is always the decoded bytes.
      { name: 'Content-Transfer-Encoding', value: 'quoted-printable' },
    ],
    body: { size: bytes.length, data: base64UrlPadded(bytes) },
  };
}

/** Gmail's body.data: the URL-safe base64 alphabet, with '=' padding. */
function base64UrlPadded(bytes: Buffer): string {
  const s = bytes.toString('base64url');
  return s + '='.repeat((4 - (s.length % 4)) % 4);
}

/** Gmail's snippet: whitespace collapsed, about 200 characters, HTML-escaped. */
function snippetOf(text: string): string {
  const plain = text.replace(/\s+/g, ' ').trim().slice(0, 200);
  return plain.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&#39;');
}

// ─── Plumbing ─────────────────────────────────────────────────────────────────────────────

function ok(body: unknown): Reply {
  return { status: 200, body };
}

function flavourOf(path: string): Flavour {
  if (path === '/token') return 'oauth';
  if (path.startsWith('/o/oauth2/')) return 'page';
  if (path.startsWith('/gmail/')) return 'gmail';
  if (path.startsWith('/v1/')) return 'pubsub';
  return 'other';
}

/** Renders an error the way the matching Google front end does. */
function errorReply(err: GoogleError, flavour: Flavour): Reply {
  const e = err.extra;
  if (flavour === 'oauth') {
    return { status: err.code, body: { error: e.reason ?? (err.code >= 500 ? 'server_error' : 'invalid_request'), error_description: err.message } };
  }
  if (flavour === 'page') {
    return { status: err.code, body: `<!doctype html><title>Error ${err.code}: ${e.reason ?? 'error'}</title><p>Error ${err.code}: ${e.reason ?? 'error'}</p><p>${err.message}</p>`, headers: { 'content-type': 'text/html; charset=utf-8' } };
  }
  const error: Record<string, unknown> = { code: err.code, message: err.message };
  if (flavour === 'gmail') {
    const legacy: Record<string, string> = { message: e.legacyMessage ?? err.message, domain: e.reason === 'accessNotConfigured' ? 'usageLimits' : 'global', reason: e.reason ?? GMAIL_REASON[err.code] ?? 'backendError' };
    if (e.location) Object.assign(legacy, { location: e.location, locationType: 'header' });
    error.errors = [legacy];
  }
  error.status = e.status ?? CANONICAL[err.code] ?? (err.code >= 500 ? 'INTERNAL' : 'FAILED_PRECONDITION');
  if (e.infoReason) {
    error.details = [{ '@type': 'type.googleapis.com/google.rpc.ErrorInfo', reason: e.infoReason, domain: 'googleapis.com', ...(e.infoMetadata ? { metadata: e.infoMetadata } : {}) }];
  }
  return { status: err.code, body: { error }, headers: e.headers };
}

function parseBody(raw: string, contentType: string | undefined): unknown {
  if (!raw) return undefined;
  if (contentType?.startsWith('application/x-www-form-urlencoded')) return Object.fromEntries(new URLSearchParams(raw));
  try {
    return JSON.parse(raw);
  } catch {
    throw new GoogleError(400, `Invalid JSON payload received. Unexpected token.\n${raw.slice(0, 40)}`);
  }
}

function queryObject(params: URLSearchParams): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const key of new Set(params.keys())) {
    const all = params.getAll(key);
    out[key] = all.length === 1 ? all[0]! : all;
  }
  return out;
}

/** Desktop-app clients accept any loopback redirect; web clients only their registered URIs. */
function redirectAllowed(client: FakeOAuthClient, uri: string): boolean {
  if (client.redirectUris) return client.redirectUris.includes(uri);
  try {
    const u = new URL(uri);
    return u.protocol === 'http:' && ['127.0.0.1', 'localhost', '[::1]'].includes(u.hostname);
  } catch {
    return false;
  }
}

/** Pub/Sub resource ids: 3–255 chars, start with a letter, no "goog" prefix. */
function validResourceId(id: string): boolean {
  return /^[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}$/.test(id) && !id.toLowerCase().startsWith('goog');
}

function validAckDeadline(seconds: unknown): number {
  const n = Number(seconds);
  if (!Number.isInteger(n) || n < 10 || n > 600) throw invalid(`Invalid ack deadline given: ${String(seconds)}. The minimum deadline you can specify is 10 seconds and the maximum is 600 seconds.`);
  return n;
}

function validPushConfig(config: unknown): PushConfig {
  if (config === undefined || config === null) return {};
  const c = config as PushConfig;
  if (c.pushEndpoint !== undefined) {
    try {
      new URL(c.pushEndpoint);
    } catch {
      throw invalid(`Invalid push endpoint given (endpoint=${c.pushEndpoint}). Refer to https://cloud.google.com/pubsub/docs/push#configure_push_endpoint for more information.`);
    }
  }
  if (c.oidcToken && !c.oidcToken.serviceAccountEmail) throw invalid('Invalid push config: oidc_token.service_account_email is required.');
  if (!c.pushEndpoint && c.oidcToken) throw invalid('Invalid push config: push_endpoint is required.');
  return structuredClone(c);
}

/** A stable 21-digit numeric id, like a service account's `sub`. */
function numericId(seed: string): string {
  const n = BigInt(`0x${createHash('sha256').update(seed).digest('hex').slice(0, 16)}`);
  return `1${(n % 10n ** 20n).toString().padStart(20, '0')}`;
}

/** One POST on a fresh connection; resolves with the status, rejects on network error or timeout. */
function postJson(endpoint: string, headers: Record<string, string>, body: string, timeoutMs: number, inflight: Set<http.ClientRequest>): Promise<number> {
  const url = new URL(endpoint);
  const transport = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = transport.request(url, { method: 'POST', headers: { ...headers, 'content-length': String(Buffer.byteLength(body)) }, agent: false, timeout: timeoutMs }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode!));
      res.on('error', reject);
    });
    inflight.add(req);
    req.on('close', () => inflight.delete(req));
    req.on('timeout', () => req.destroy(new Error(`push timed out after ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end(body);
  });
}
