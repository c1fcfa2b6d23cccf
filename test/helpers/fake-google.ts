/**
 * A local stand-in for the slice of Google that the Gmail integration talks to: OAuth 2.0
 * (authorization code + PKCE, refresh), Cloud Pub/Sub v1 REST, Gmail v1 REST, and Pub/Sub's
 * push delivery with OIDC tokens. One node:http server on 127.0.0.1:0 serves every host, so the
 * official clients are pointed at it with `rootUrl` (googleapis) and `endpoints` (OAuth2Client).
 *
 * Sources, and what the fake refuses because the real service does:
 * - Gmail v1 and Pub/Sub v1 are routed by Google's discovery documents (extracts in
 *   test/fixtures/google/, each naming the document and revision it was taken from): a method
 *   and path that match no documented method get the HTML 404 page googleapis.com's front end
 *   serves; a query parameter or JSON field the method does not document, or a value outside a
 *   documented enum or type, gets 400 INVALID_ARGUMENT (Google's JSON error envelope, AIP-193);
 *   the scopes accepted are the method's own `scopes`.
 * - OAuth 2.0: Google's "OAuth 2.0 for Mobile & Desktop Apps" guide (authorization endpoint,
 *   PKCE, loopback redirect) and RFC 6749 §5.2 for the token endpoint's JSON errors
 *   (`{"error":"invalid_grant","error_description":"…"}`).
 * - Push: Pub/Sub's "Push subscriptions" and "Authentication for push" pages (body shape,
 *   OIDC token claims, which statuses count as an ack, backoff).
 * Only what the integration uses is implemented: a documented method the fake does not serve
 * answers 501 UNIMPLEMENTED, never a made-up success.
 */
import http from 'node:http';
import https from 'node:https';
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
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
  /** The discovery method the call matched, e.g. 'pubsub.projects.topics.getIamPolicy'; undefined for OAuth and key sets. */
  discoveryId?: string;
  /**
   * Set when Google's published contract refuses the call: 'not-found' (no documented method
   * for this HTTP method and path: Google's HTML 404), 'invalid' (a parameter, field or enum
   * value the method does not document: 400 INVALID_ARGUMENT). `problem` says which.
   */
  refused?: 'not-found' | 'invalid';
  problem?: string;
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
  /**
   * Answer with Google's front-end HTML error page (text/html) instead of a JSON error, as
   * googleapis.com does for an unknown URL (404) or an unavailable backend (502, 503).
   */
  html?: boolean;
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
  400: 'INVALID_ARGUMENT',
  401: 'UNAUTHENTICATED',
  403: 'PERMISSION_DENIED',
  404: 'NOT_FOUND',
  409: 'ALREADY_EXISTS',
  429: 'RESOURCE_EXHAUSTED',
  499: 'CANCELLED',
  500: 'INTERNAL',
  501: 'UNIMPLEMENTED',
  503: 'UNAVAILABLE',
  504: 'DEADLINE_EXCEEDED',
};

/** Gmail's legacy `errors[].reason` for a status. */
const GMAIL_REASON: Record<number, string> = {
  400: 'invalidArgument',
  401: 'authError',
  403: 'forbidden',
  404: 'notFound',
  409: 'conflict',
  429: 'rateLimitExceeded',
  500: 'backendError',
  503: 'backendError',
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
/** A documented method this fake does not serve: say so, rather than invent an answer. */
const unimplemented = (match: DiscoveryMatch) =>
  new GoogleError(501, `fake-google: ${match.method.id} is documented but not implemented by the fake`, {
    status: 'UNIMPLEMENTED',
  });

/**
 * The page googleapis.com's front end (GFE) serves, as text/html, when no API method matches the
 * URL (404: a wrong path, or a wrong HTTP method for it) or the backend is unreachable (502, 503).
 * Its wording is what the GFE sends; the inline stylesheet and logo are left out.
 */
function frontEndPage(status: number, path: string): Reply {
  const titles: Record<number, string> = { 404: 'Not Found', 502: 'Server Error', 503: 'Service Unavailable' };
  const said =
    status === 404
      ? `<p>The requested URL <code>${path.replace(/[<>&"]/g, '')}</code> was not found on this server.  <ins>That’s all we know.</ins>`
      : '<p>The server encountered a temporary error and could not complete your request.<p>Please try again in 30 seconds.  <ins>That’s all we know.</ins>';
  const body = `<!DOCTYPE html>\n<html lang=en>\n  <meta charset=utf-8>\n  <meta name=viewport content="initial-scale=1, minimum-scale=1, width=device-width">\n  <title>Error ${status} (${titles[status] ?? 'Error'})!!1</title>\n  <a href=//www.google.com/><span id=logo aria-label=Google></span></a>\n  <p><b>${status}.</b> <ins>That’s an error.</ins>\n  ${said}\n`;
  return { status, body, headers: { 'content-type': 'text/html; charset=UTF-8', 'referrer-policy': 'no-referrer' } };
}

// ─── Google's published contract: the discovery documents ─────────────────────────────────

interface DiscoveryParameter {
  location?: 'path' | 'query';
  type?: string;
  format?: string;
  pattern?: string;
  enum?: string[];
  repeated?: boolean;
  required?: boolean;
}

interface DiscoveryMethod {
  id: string;
  httpMethod: string;
  path: string;
  parameters?: Record<string, DiscoveryParameter>;
  request?: { $ref: string };
  scopes?: string[];
}

interface DiscoverySchema {
  type?: string;
  $ref?: string;
  format?: string;
  enum?: string[];
  properties?: Record<string, DiscoverySchema>;
  additionalProperties?: DiscoverySchema;
  items?: DiscoverySchema;
}

interface DiscoveryResource {
  methods?: Record<string, DiscoveryMethod>;
  resources?: Record<string, DiscoveryResource>;
}

interface DiscoveryDocument {
  name: string;
  revision: string;
  servicePath: string;
  parameters: Record<string, DiscoveryParameter>;
  resources: Record<string, DiscoveryResource>;
  schemas: Record<string, DiscoverySchema>;
}

/** A documented method matched by a request: its document, and its path parameters (decoded). */
export interface DiscoveryMatch {
  api: 'gmail' | 'pubsub';
  method: DiscoveryMethod;
  params: Record<string, string>;
}

interface CompiledMethod {
  api: 'gmail' | 'pubsub';
  doc: DiscoveryDocument;
  method: DiscoveryMethod;
  /** The template's custom verb (`…:getIamPolicy`), if any. */
  verb: string | undefined;
  regex: RegExp;
  names: string[];
}

function loadDiscovery(file: string): DiscoveryDocument {
  return JSON.parse(readFileSync(new URL(`../fixtures/google/${file}`, import.meta.url), 'utf8')) as DiscoveryDocument;
}

/** A path's last segment may end in a custom verb (`:getIamPolicy`), as in google.api.http templates. */
function splitVerb(path: string): { rest: string; verb: string | undefined } {
  const colon = path.indexOf(':', path.lastIndexOf('/') + 1);
  return colon < 0 ? { rest: path, verb: undefined } : { rest: path.slice(0, colon), verb: path.slice(colon + 1) };
}

function compileMethods(api: 'gmail' | 'pubsub', doc: DiscoveryDocument): CompiledMethod[] {
  const out: CompiledMethod[] = [];
  const walk = (resource: DiscoveryResource) => {
    for (const method of Object.values(resource.methods ?? {})) {
      const { rest, verb } = splitVerb(`/${doc.servicePath}${method.path}`);
      const names: string[] = [];
      // RFC 6570 as discovery uses it: {+name} may span segments, {name} is one segment.
      const source = rest
        .split(/(\{\+?[^}]+\})/)
        .map((part) => {
          const variable = /^\{(\+?)([^}]+)\}$/.exec(part);
          if (!variable) return part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
          names.push(variable[2]!);
          return variable[1] ? '(.+)' : '([^/]+)';
        })
        .join('');
      out.push({ api, doc, method, verb, regex: new RegExp(`^${source}$`), names });
    }
    for (const child of Object.values(resource.resources ?? {})) walk(child);
  };
  for (const resource of Object.values(doc.resources)) walk(resource);
  return out;
}

const DISCOVERY = {
  gmail: loadDiscovery('gmail-v1.discovery.json'),
  pubsub: loadDiscovery('pubsub-v1.discovery.json'),
};
const METHODS = [...compileMethods('gmail', DISCOVERY.gmail), ...compileMethods('pubsub', DISCOVERY.pubsub)];

/** Every method in the discovery extracts the fake routes by, keyed by id (for contract tests). */
export const DISCOVERY_METHODS: ReadonlyMap<string, { api: 'gmail' | 'pubsub'; httpMethod: string; path: string }> =
  new Map(METHODS.map((m) => [m.method.id, { api: m.api, httpMethod: m.method.httpMethod, path: m.method.path }]));

/** The documented method for an HTTP method and a (percent-decoded) path, as Google's front end routes it. */
export function matchDiscovery(httpMethod: string, path: string): DiscoveryMatch | undefined {
  const { rest, verb } = splitVerb(path);
  for (const compiled of METHODS) {
    if (compiled.method.httpMethod !== httpMethod || compiled.verb !== verb) continue;
    const found = compiled.regex.exec(rest);
    if (!found) continue;
    const params: Record<string, string> = {};
    compiled.names.forEach((name, i) => (params[name] = found[i + 1]!));
    // A variable's documented pattern is part of the template (`{name=projects/*/topics/*}`).
    const fits = compiled.names.every((name) => {
      const pattern = compiled.method.parameters?.[name]?.pattern;
      return !pattern || new RegExp(pattern).test(params[name]!);
    });
    if (fits) return { api: compiled.api, method: compiled.method, params };
  }
  return undefined;
}

const snake = (name: string) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
const camel = (name: string) => name.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());

/** The proto type name Google's JSON parser reports for a discovery type (in "Invalid value at …"). */
function protoType(schema: DiscoverySchema): string {
  if (schema.enum) return 'TYPE_ENUM';
  if (schema.type === 'boolean') return 'TYPE_BOOL';
  if (schema.type === 'integer') return schema.format === 'uint32' ? 'TYPE_UINT32' : 'TYPE_INT32';
  if (schema.format === 'int64') return 'TYPE_INT64';
  if (schema.format === 'uint64') return 'TYPE_UINT64';
  return 'TYPE_STRING';
}

/**
 * Checks a matched call's query parameters and JSON body against its method, the way Google's
 * JSON/HTTP transcoding does (proto3 JSON: lowerCamel or original snake_case names, enums by
 * name, 64-bit integers as strings or numbers). Returns the INVALID_ARGUMENT message, or undefined.
 */
export function contractProblem(match: DiscoveryMatch, query: URLSearchParams, body: unknown): string | undefined {
  const doc = DISCOVERY[match.api];
  const { method } = match;
  for (const key of new Set(query.keys())) {
    const param = method.parameters?.[key]?.location === 'query' ? method.parameters[key] : doc.parameters[key];
    if (!param)
      return `Invalid JSON payload received. Unknown name "${key}": Cannot bind query parameter. Field '${key}' could not be found in request message.`;
    for (const value of query.getAll(key)) {
      if (!scalarFits(param, value, true)) return `Invalid value at '${snake(key)}' (${protoType(param)}), "${value}"`;
    }
  }
  for (const [name, param] of Object.entries(method.parameters ?? {})) {
    if (param.location === 'query' && param.required && !query.has(name))
      return `Invalid argument: required query parameter '${name}' is missing.`;
  }
  if (body === undefined) return undefined;
  if (!method.request) {
    const keys = body !== null && typeof body === 'object' && !Array.isArray(body) ? Object.keys(body) : [];
    return keys.length ? `Invalid JSON payload received. Unknown name "${keys[0]}": Cannot find field.` : undefined;
  }
  return valueProblem(doc, { $ref: method.request.$ref }, body, '');
}

function scalarFits(schema: DiscoverySchema, value: unknown, fromQuery: boolean): boolean {
  if (schema.enum) return typeof value === 'string' && schema.enum.includes(value);
  switch (schema.type) {
    case 'boolean':
      return fromQuery ? value === 'true' || value === 'false' : typeof value === 'boolean';
    case 'integer':
      return (
        (typeof value === 'number' && Number.isInteger(value)) || (typeof value === 'string' && /^-?\d+$/.test(value))
      );
    case 'string':
      // proto3 JSON: a 64-bit integer may come as a JSON number too.
      return (
        typeof value === 'string' ||
        ((schema.format === 'int64' || schema.format === 'uint64') &&
          typeof value === 'number' &&
          Number.isInteger(value))
      );
    default:
      return true;
  }
}

function valueProblem(doc: DiscoveryDocument, schema: DiscoverySchema, value: unknown, at: string): string | undefined {
  const resolved = schema.$ref ? doc.schemas[schema.$ref] : schema;
  // A schema this extract leaves out is not checked (see test/fixtures/google/README.md).
  if (!resolved || value === null) return undefined;
  const where = at ? ` at '${at}'` : '';
  if (resolved.type === 'object') {
    if (typeof value !== 'object' || Array.isArray(value))
      return `Invalid value${where} (TYPE_MESSAGE), ${JSON.stringify(value)}`;
    for (const [key, child] of Object.entries(value as Record<string, unknown>)) {
      const path = at ? `${at}.${snake(camel(key))}` : snake(camel(key));
      const property = resolved.properties?.[key] ?? resolved.properties?.[camel(key)];
      const next = property ?? resolved.additionalProperties;
      if (!next) return `Invalid JSON payload received. Unknown name "${key}"${where}: Cannot find field.`;
      const problem = valueProblem(
        doc,
        next,
        child,
        resolved.additionalProperties && !property ? `${at}[${key}]` : path,
      );
      if (problem) return problem;
    }
    return undefined;
  }
  if (resolved.type === 'array') {
    if (!Array.isArray(value)) return `Invalid value${where} (TYPE_STRING), ${JSON.stringify(value)}`;
    for (const [i, item] of value.entries()) {
      const problem = valueProblem(doc, resolved.items ?? {}, item, `${at}[${i}]`);
      if (problem) return problem;
    }
    return undefined;
  }
  return scalarFits(resolved, value, false)
    ? undefined
    : `Invalid value${where} (${protoType(resolved)}), ${JSON.stringify(value)}`;
}

// ─── Server ─────────────────────────────────────────────────────────────────────────────────

interface Exchange {
  method: string;
  path: string;
  url: URL;
  headers: http.IncomingHttpHeaders;
  body: unknown;
  /** The documented method this call matched (Gmail, Pub/Sub); undefined for OAuth. */
  match?: DiscoveryMatch;
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
  endpoints = {
    oauth2AuthBaseUrl: '',
    oauth2TokenUrl: '',
    oauth2FederatedSignonPemCertsUrl: '',
    oauth2FederatedSignonJwkCertsUrl: '',
  };
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

  constructor(
    options: FakeGoogleOptions,
    private readonly keys: Keys,
  ) {
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
    const match = isOAuthPath(path) ? undefined : matchDiscovery(method, path);
    call.discoveryId = match?.method.id;
    const flavour = flavourOf(path, match);
    let reply: Reply;
    try {
      call.body = parseBody(raw, req.headers['content-type']);
      const x: Exchange = { method, path, url, headers: req.headers, body: call.body, match };
      if (match) {
        call.problem = contractProblem(match, url.searchParams, call.body);
        if (call.problem) call.refused = 'invalid';
      } else if (!this.oauthRoute(x)) {
        call.refused = 'not-found';
        call.problem = `no documented method for ${method} ${path}`;
      }
      reply = this.injectedFailure(x, flavour) ?? (await this.route(x, call.problem));
    } catch (err) {
      reply = errorReply(
        err instanceof GoogleError ? err : new GoogleError(500, `fake-google: ${(err as Error).message}`),
        flavour,
      );
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

  /** OAuth's endpoints and the key sets: not in any discovery document (see the header for their sources). */
  private oauthRoute(x: Exchange): (() => Reply | Promise<Reply>) | undefined {
    const { method, path } = x;
    // Google serves the consent screen at both /o/oauth2/auth (client_secret.json's auth_uri) and /o/oauth2/v2/auth.
    if (method === 'GET' && (path === '/o/oauth2/v2/auth' || path === '/o/oauth2/auth')) return () => this.authorize(x);
    if (method === 'POST' && path === '/token') return () => this.token(x);
    if (method === 'GET' && path === '/oauth2/v3/certs') return () => this.jwks();
    if (method === 'GET' && path === '/oauth2/v1/certs') return () => this.pemCerts();
    return undefined;
  }

  private route(x: Exchange, problem: string | undefined): Reply | Promise<Reply> {
    const oauth = this.oauthRoute(x);
    if (oauth) return oauth();
    const { match } = x;
    // No documented method: googleapis.com's front end answers its HTML 404, whatever the API.
    if (!match) return frontEndPage(404, x.path);
    const service = match.api === 'gmail' ? 'gmail.googleapis.com' : 'pubsub.googleapis.com';
    const grant = this.authenticate(x, match.method.scopes ?? [], service);
    if (problem) throw new GoogleError(400, problem, { reason: 'invalidArgument' });
    return match.api === 'gmail' ? this.gmail(x, grant, match) : this.pubsub(x, match);
  }

  private injectedFailure(x: Exchange, flavour: Flavour): Reply | undefined {
    const i = this.failures.findIndex(
      ({ matcher: m }) =>
        (!m.method || m.method.toUpperCase() === x.method) &&
        (typeof m.path === 'string' ? m.path === x.path : m.path.test(x.path)),
    );
    if (i < 0) return undefined;
    const entry = this.failures[i]!;
    if (--entry.left <= 0) this.failures.splice(i, 1);
    const f = entry.failure;
    if (f.html) return frontEndPage(f.status, x.path);
    return errorReply(
      new GoogleError(f.status, f.message, { status: f.errorStatus, reason: f.reason, infoReason: f.reason }),
      flavour,
    );
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
    if (!redirectAllowed(client, redirectUri))
      throw page(
        400,
        'redirect_uri_mismatch',
        `You can't sign in to this app because it doesn't comply with Google's OAuth 2.0 policy. redirect_uri=${redirectUri}`,
      );
    if (q.get('response_type') !== 'code')
      throw page(400, 'invalid_request', `Invalid response_type: ${q.get('response_type') ?? ''}`);
    const scope = q.get('scope');
    if (!scope) throw page(400, 'invalid_request', 'Missing required parameter: scope');
    const challenge = q.get('code_challenge') ?? undefined;
    const challengeMethod = challenge ? (q.get('code_challenge_method') ?? 'plain') : undefined;
    if (challengeMethod && challengeMethod !== 'S256' && challengeMethod !== 'plain')
      throw page(400, 'invalid_request', `Invalid code_challenge_method: ${challengeMethod}`);
    if (challenge && !/^[A-Za-z0-9\-._~]{43,128}$/.test(challenge))
      throw page(400, 'invalid_request', 'Invalid code_challenge.');

    const back = new URL(redirectUri);
    const state = q.get('state');
    if (state !== null) back.searchParams.set('state', state);
    if (this.consent.deny) {
      back.searchParams.set('error', 'access_denied');
    } else {
      const code = `4/0A${randomBytes(32).toString('base64url')}`;
      this.codes.set(code, {
        client,
        redirectUri,
        scope,
        account: this.consent.account,
        offline: q.get('access_type') === 'offline',
        challenge,
        challengeMethod,
        expiresAt: Date.now() + this.codeTtl * 1000,
        used: false,
      });
      back.searchParams.set('code', code);
      back.searchParams.set('scope', scope);
    }
    return { status: 302, headers: { location: back.toString() } };
  }

  /** POST /token, form-encoded, client authenticated by client_secret_post or HTTP Basic. */
  private token(x: Exchange): Reply {
    const form = (x.body ?? {}) as Record<string, string>;
    const oauthError = (status: number, error: string, description: string) =>
      new GoogleError(status, description, { reason: error });
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
      if (!pending || pending.used || pending.expiresAt <= Date.now() || pending.client !== client)
        throw oauthError(400, 'invalid_grant', 'Bad Request');
      // A code is single-use (RFC 6749 §4.1.2): even a failed redemption burns it.
      pending.used = true;
      if (form.redirect_uri !== pending.redirectUri) throw oauthError(400, 'redirect_uri_mismatch', 'Bad Request');
      if (pending.challenge) {
        const verifier = form.code_verifier;
        if (!verifier) throw oauthError(400, 'invalid_grant', 'Missing code verifier.');
        const derived =
          pending.challengeMethod === 'S256' ? createHash('sha256').update(verifier).digest('base64url') : verifier;
        if (!/^[A-Za-z0-9\-._~]{43,128}$/.test(verifier) || derived !== pending.challenge)
          throw oauthError(400, 'invalid_grant', 'Invalid code verifier.');
      }
      const grant = this.issueAccessToken(client, pending.account, pending.scope.split(' '));
      const body: Record<string, unknown> = {
        access_token: grant.token,
        expires_in: this.accessTokenTtl,
        scope: pending.scope,
        token_type: 'Bearer',
      };
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
      return {
        status: 200,
        body: {
          access_token: grant.token,
          expires_in: this.accessTokenTtl,
          scope: stored.scopes.join(' '),
          token_type: 'Bearer',
        },
        headers,
      };
    }
    throw oauthError(400, 'unsupported_grant_type', `Invalid grant_type: ${form.grant_type ?? ''}`);
  }

  private issueAccessToken(
    client: FakeOAuthClient,
    account: string,
    scopes: string[],
  ): { token: string; grant: Grant } {
    const token = `ya29.${randomBytes(48).toString('base64url')}`;
    const grant = {
      clientId: client.clientId,
      account,
      scopes,
      expiresAt: Date.now() + this.accessTokenTtl * 1000,
      revoked: false,
    };
    this.accessTokens.set(token, grant);
    return { token, grant };
  }

  /** The Authorization: Bearer check every API call passes, plus the scope check. */
  private authenticate(x: Exchange, acceptedScopes: readonly string[], service: string): Grant {
    const header = x.headers.authorization;
    const help =
      'Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.';
    if (!header) {
      throw new GoogleError(401, `Request is missing required authentication credential. ${help}`, {
        reason: 'required',
        legacyMessage: 'Login Required.',
        location: 'Authorization',
        infoReason: 'CREDENTIALS_MISSING',
        infoMetadata: { service },
        headers: { 'www-authenticate': 'Bearer realm="https://accounts.google.com/"' },
      });
    }
    const token = /^Bearer (.+)$/i.exec(header)?.[1];
    const grant = token ? this.accessTokens.get(token) : undefined;
    if (!grant || grant.revoked || grant.expiresAt <= Date.now()) {
      throw new GoogleError(401, `Request had invalid authentication credentials. ${help}`, {
        reason: 'authError',
        legacyMessage: 'Invalid Credentials',
        location: 'Authorization',
        infoReason: grant ? 'ACCESS_TOKEN_EXPIRED' : 'ACCESS_TOKEN_TYPE_UNSUPPORTED',
        infoMetadata: { service },
        headers: { 'www-authenticate': 'Bearer realm="https://accounts.google.com/", error="invalid_token"' },
      });
    }
    if (!grant.scopes.some((s) => acceptedScopes.includes(s))) {
      throw new GoogleError(403, 'Request had insufficient authentication scopes.', {
        reason: 'insufficientPermissions',
        legacyMessage: 'Insufficient Permission',
        infoReason: 'ACCESS_TOKEN_SCOPE_INSUFFICIENT',
        infoMetadata: { service },
      });
    }
    const api = service === 'gmail.googleapis.com' ? 'gmail' : 'pubsub';
    if (this.disabledApis.has(api)) {
      const client = [...this.clients.values()].find((c) => c.clientId === grant.clientId)!;
      const title = api === 'gmail' ? 'Gmail API' : 'Cloud Pub/Sub API';
      throw new GoogleError(
        403,
        `${title} has not been used in project ${client.projectNumber} before or it is disabled. Enable it by visiting https://console.developers.google.com/apis/api/${service}/overview?project=${client.projectNumber} then retry. If you enabled this API recently, wait a few minutes for the action to propagate to our systems and retry.`,
        {
          reason: 'accessNotConfigured',
          infoReason: 'SERVICE_DISABLED',
          infoMetadata: { service, consumer: `projects/${client.projectNumber}` },
        },
      );
    }
    return grant;
  }

  // The JWKS that push OIDC tokens verify against (Google: https://www.googleapis.com/oauth2/v3/certs).
  private async jwks(): Promise<Reply> {
    const jwk: JWK = await exportJWK(this.keys.publicKey);
    return {
      status: 200,
      body: { keys: [{ ...jwk, kid: this.kid, alg: 'RS256', use: 'sig' }] },
      headers: { 'cache-control': 'public, max-age=300' },
    };
  }

  // The PEM flavour OAuth2Client.verifyIdToken fetches in Node (Google serves X.509 certificates;
  // an SPKI public key verifies the same way with node:crypto).
  private async pemCerts(): Promise<Reply> {
    return {
      status: 200,
      body: { [this.kid]: await exportSPKI(this.keys.publicKey) },
      headers: { 'cache-control': 'public, max-age=300' },
    };
  }

  async signOidcToken(claims: Record<string, unknown> = {}, options: OidcSignOptions = {}): Promise<string> {
    const now = Math.floor(Date.now() / 1000);
    const email =
      typeof claims.email === 'string' ? claims.email : `pubsub-push@${this.client.projectId}.iam.gserviceaccount.com`;
    const sub = numericId(email);
    const payload: Record<string, unknown> = {
      aud: this.url,
      azp: sub,
      email,
      email_verified: true,
      exp: now + 3600,
      iat: now,
      iss: 'https://accounts.google.com',
      sub,
      ...claims,
    };
    for (const [k, v] of Object.entries(payload)) if (v === undefined) delete payload[k];
    let key = this.keys.privateKey;
    if (options.signer === 'stranger') {
      this.stranger ??= await generateKeyPair('RS256');
      key = this.stranger.privateKey;
    }
    return new SignJWT(payload)
      .setProtectedHeader({ alg: 'RS256', kid: options.kid ?? this.kid, typ: 'JWT' })
      .sign(key);
  }

  // ─── Cloud Pub/Sub v1 (pubsub.googleapis.com/v1/…) ──────────────────────────────────────

  private pubsub(x: Exchange, match: DiscoveryMatch): Reply {
    const body = (x.body ?? {}) as Record<string, any>;
    // Each method's one path parameter is the resource's full name (`projects/p/topics/t`).
    const name = Object.values(match.params)[0]!;
    const shortName = name.split('/').pop()!;
    const id = match.method.id.replace(/^pubsub\.projects\./, '');
    switch (id) {
      case 'topics.get': {
        const topic = this.topics.get(name);
        if (!topic) throw notFound(shortName);
        return ok(topic);
      }
      case 'topics.create': {
        if (!validResourceId(shortName)) throw invalid(`Invalid [topics] name: (name=${name})`);
        if (this.topics.has(name))
          throw new GoogleError(409, `Resource already exists in the project (resource=${shortName}).`);
        const topic: Topic = { name, ...(body.labels ? { labels: body.labels } : {}) };
        this.topics.set(name, topic);
        this.iamPolicies.set(name, { etag: 'ACAB' });
        return ok(topic);
      }
      case 'topics.getIamPolicy': {
        // "Valid values are 0, 1, and 3. Requests specifying an invalid value will be rejected."
        const version = x.url.searchParams.get('options.requestedPolicyVersion');
        if (version !== null && !['0', '1', '3'].includes(version))
          throw invalid(`Invalid requested policy version: ${version}. Valid values are 0, 1, and 3.`);
        const policy = this.iamPolicies.get(name);
        if (!policy) throw notFound(shortName);
        return ok(policy);
      }
      case 'topics.setIamPolicy': {
        const current = this.iamPolicies.get(name);
        if (!current) throw notFound(shortName);
        const policy = body.policy as IamPolicy | undefined;
        if (!policy || typeof policy !== 'object') throw invalid('Invalid JSON payload: policy is required.');
        // Read-modify-write: a stale etag is refused.
        if (policy.etag !== undefined && policy.etag !== current.etag) {
          throw new GoogleError(
            409,
            'There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff.',
            { status: 'ABORTED' },
          );
        }
        const bindings = (policy.bindings ?? []).filter((b) => b.members?.length);
        for (const b of bindings) {
          if (typeof b.role !== 'string' || !b.role.startsWith('roles/'))
            throw invalid(`Role (${String(b.role)}) does not exist in the resource's hierarchy.`);
          for (const m of b.members)
            if (
              !/^(user|serviceAccount|group|domain|principal|principalSet):.+|^allUsers$|^allAuthenticatedUsers$/.test(
                m,
              )
            )
              throw invalid(`Invalid member: ${m}`);
        }
        const next: IamPolicy = bindings.length
          ? { version: 1, etag: randomBytes(8).toString('base64'), bindings: structuredClone(bindings) }
          : { etag: randomBytes(8).toString('base64') };
        this.iamPolicies.set(name, next);
        return ok(next);
      }
      case 'subscriptions.get': {
        const sub = this.subscriptions.get(name);
        if (!sub) throw notFound(shortName);
        return ok(sub);
      }
      case 'subscriptions.create': {
        if (!validResourceId(shortName)) throw invalid(`Invalid [subscriptions] name: (name=${name})`);
        if (this.subscriptions.has(name))
          throw new GoogleError(409, `Resource already exists in the project (resource=${shortName}).`);
        if (typeof body.topic !== 'string' || !body.topic)
          throw invalid(
            'Invalid resource name given (name=). Refer to https://cloud.google.com/pubsub/docs/pubsub-basics#resource_names for more information.',
          );
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
      case 'subscriptions.patch': {
        const sub = this.subscriptions.get(name);
        if (!sub) throw notFound(shortName);
        const mask =
          typeof body.updateMask === 'string'
            ? body.updateMask
                .split(',')
                .map((s: string) => s.trim())
                .filter(Boolean)
            : [];
        if (!mask.length)
          throw invalid(
            'Invalid update_mask provided in the UpdateSubscriptionRequest: the update_mask must not be empty.',
          );
        const patch = (body.subscription ?? {}) as Record<string, any>;
        const next = { ...sub };
        for (const field of mask) {
          if (field === 'pushConfig') next.pushConfig = validPushConfig(patch.pushConfig);
          else if (field === 'ackDeadlineSeconds')
            next.ackDeadlineSeconds = validAckDeadline(patch.ackDeadlineSeconds ?? 10);
          else if (field === 'messageRetentionDuration')
            next.messageRetentionDuration = patch.messageRetentionDuration ?? '604800s';
          else if (field === 'labels') next.labels = patch.labels;
          else
            throw invalid(
              `Invalid update_mask provided in the UpdateSubscriptionRequest: the '${field}' field cannot be updated.`,
            );
        }
        this.subscriptions.set(name, next);
        this.pump(name);
        return ok(next);
      }
      case 'subscriptions.pull': {
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
      case 'subscriptions.acknowledge': {
        if (!this.subscriptions.has(name)) throw notFound(shortName);
        const ids: unknown = body.ackIds;
        if (!Array.isArray(ids) || !ids.length) throw invalid('No ack ids specified.');
        for (const id of ids) {
          const lease = this.ackIds.get(String(id));
          if (!lease || lease.subscription !== name)
            throw invalid(`You have passed an invalid ack ID to the service (ack_id=${String(id)}).`);
        }
        // An ack for a lease that has since been redelivered (stale ackId) is silently ignored.
        for (const id of ids) {
          const { delivery } = this.ackIds.get(String(id))!;
          if (delivery.ackId === id) this.settle(name, delivery);
        }
        return ok({});
      }
    }
    throw unimplemented(match);
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
    if (list)
      this.deliveries.set(
        subscription,
        list.filter((e) => e !== d),
      );
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
    const message: PubsubMessage = {
      data: data.toString('base64'),
      messageId: String(this.nextPubsubId++),
      publishTime: new Date().toISOString(),
    };
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
      if (!d.acked && !d.pushing && !d.timer && d.visibleAt <= now && d.pushAttempts < this.timing.pushMaxAttempts)
        void this.push(sub, d);
    }
  }

  private async push(sub: Subscription, d: Delivery): Promise<void> {
    const endpoint = sub.pushConfig.pushEndpoint!;
    d.pushing = true;
    d.pushAttempts++;
    this.pendingPushes++;
    const timeoutMs = this.ackDeadlineMs(sub.name);
    const attempt: PushAttempt = {
      subscription: sub.name,
      messageId: d.message.messageId,
      attempt: d.pushAttempts,
      endpoint,
      at: new Date(),
    };
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
        message: {
          ...(m.attributes ? { attributes: m.attributes } : {}),
          data: m.data,
          messageId: m.messageId,
          message_id: m.messageId,
          publishTime: m.publishTime,
          publish_time: m.publishTime,
        },
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

  private gmail(x: Exchange, grant: Grant, match: DiscoveryMatch): Reply {
    const { userId, id } = match.params as { userId: string; id?: string };
    if (userId !== 'me' && userId.toLowerCase() !== grant.account.toLowerCase()) {
      throw new GoogleError(403, `Delegation denied for ${grant.account}`, { reason: 'forbidden' });
    }
    const box = this.mailbox(grant.account);
    const q = x.url.searchParams;
    const fullScopes: string[] = [SCOPES.mail, SCOPES.gmailModify, SCOPES.gmailReadonly];
    const metadataOnly = !grant.scopes.some((s) => fullScopes.includes(s));
    switch (match.method.id) {
      case 'gmail.users.getProfile':
        return ok({
          emailAddress: box.emailAddress,
          messagesTotal: box.messages.length,
          threadsTotal: new Set(box.messages.map((m) => m.threadId)).size,
          historyId: String(box.historyId),
        });
      case 'gmail.users.watch':
        return ok(this.watch(grant, box, (x.body ?? {}) as Record<string, any>));
      case 'gmail.users.stop':
        this.watches.delete(box.emailAddress);
        return { status: 204 };
      case 'gmail.users.history.list':
        return ok(listHistory(box, q));
      case 'gmail.users.messages.list': {
        if (q.get('q') && metadataOnly)
          throw new GoogleError(403, "Metadata scope does not support 'q' parameter", { reason: 'forbidden' });
        return ok(listMessages(box, q));
      }
      case 'gmail.users.messages.get': {
        const message = box.messages.find((m) => m.id === id);
        if (!message) {
          if (!/^[0-9a-f]{16}$/.test(id!))
            throw new GoogleError(400, 'Invalid id value', { reason: 'invalidArgument' });
          throw new GoogleError(404, 'Requested entity was not found.', { reason: 'notFound' });
        }
        const format = q.get('format') ?? 'full';
        if (format === 'full' && metadataOnly)
          throw new GoogleError(403, "Metadata scope doesn't allow format FULL", { reason: 'forbidden' });
        if (format === 'raw') throw unimplemented(match);
        return ok(renderMessage(message, format, q.getAll('metadataHeaders')));
      }
    }
    throw unimplemented(match);
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
    const topicName = body.topicName ?? body.topic_name;
    if (typeof topicName !== 'string' || !topicName.startsWith(`projects/${client.projectId}/topics/`)) {
      throw new GoogleError(400, `Invalid topicName does not match projects/${client.projectId}/topics/*`, {
        reason: 'invalidArgument',
      });
    }
    if (!this.topics.has(topicName)) {
      throw new GoogleError(
        404,
        `Error sending test message to Cloud PubSub ${topicName} : Resource not found (resource=${topicName.split('/').pop()}).`,
        { reason: 'notFound' },
      );
    }
    if (!this.gmailMayPublish(topicName)) {
      throw new GoogleError(
        403,
        `Error sending test message to Cloud PubSub ${topicName} : User not authorized to perform this action.`,
        { reason: 'forbidden' },
      );
    }
    // The enum ("include" | "exclude") is checked against the discovery document before this
    // runs. labelFilterBehavior replaces the deprecated labelFilterAction: "if set,
    // label_filter_action is ignored". Either may come in proto3's snake_case spelling.
    const behavior: 'include' | 'exclude' =
      body.labelFilterBehavior ??
      body.label_filter_behavior ??
      body.labelFilterAction ??
      body.label_filter_action ??
      'include';
    const watch: GmailWatch = {
      topicName,
      labelIds: (body.labelIds ?? body.label_ids ?? []).map(String),
      labelFilterBehavior: behavior,
      historyId: String(box.historyId),
      expiration: String(Date.now() + this.timing.watchTtlMs),
    };
    this.watches.set(box.emailAddress, watch);
    return { historyId: watch.historyId, expiration: watch.expiration };
  }

  private gmailMayPublish(topic: string): boolean {
    const member = `serviceAccount:${GMAIL_PUSH_SERVICE_ACCOUNT}`;
    return (this.iamPolicies.get(topic)?.bindings ?? []).some(
      (b) =>
        ['roles/pubsub.publisher', 'roles/pubsub.editor', 'roles/pubsub.admin', 'roles/editor', 'roles/owner'].includes(
          b.role,
        ) && b.members.includes(member),
    );
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
    this.gmailNotifications.push({
      account: box.emailAddress,
      topicName: watch.topicName,
      historyId: box.historyId,
      published,
    });
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
  if (!q.get('startHistoryId') || !Number.isSafeInteger(start) || start < 0)
    throw new GoogleError(400, 'Invalid startHistoryId', { reason: 'invalidArgument' });
  // Google: "A historyId is typically valid for at least a week"; older ones answer 404.
  if (start < box.retainedFrom) throw new GoogleError(404, 'Requested entity was not found.', { reason: 'notFound' });
  const types = q.getAll('historyTypes');
  const labelId = q.get('labelId');
  const records = box.history.filter(
    (h) =>
      h.id > start && (!types.length || types.includes('messageAdded')) && (!labelId || h.labelIds.includes(labelId)),
  );
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
      case 'from':
        return (m: StoredEmail) => has(m.from);
      case 'to':
        return (m: StoredEmail) => has(m.to);
      case 'subject':
        return (m: StoredEmail) => has(m.subject);
      case 'label':
      case 'in':
        return (m: StoredEmail) => m.labelIds.some((l) => l.toLowerCase() === value);
      case 'is':
        return (m: StoredEmail) => m.labelIds.some((l) => l.toLowerCase() === value);
      case 'after':
        return (m: StoredEmail) => Number(m.internalDate) >= day(value);
      case 'before':
        return (m: StoredEmail) => Number(m.internalDate) < day(value);
      default:
        return (m: StoredEmail) => [m.from, m.to, m.subject, m.text].some(has);
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
    {
      name: 'Content-Type',
      value: htmlPart ? `multipart/alternative; boundary="${boundary}"` : 'text/plain; charset="UTF-8"',
    },
  ];
  const payload: MessagePart = htmlPart
    ? {
        partId: '',
        mimeType: 'multipart/alternative',
        filename: '',
        headers,
        body: { size: 0 },
        parts: [textPart, htmlPart],
      }
    : { ...textPart, headers: [...headers, ...textPart.headers.slice(1)] };
  const sizeEstimate =
    headers.reduce((n, h) => n + h.name.length + h.value.length + 4, 0) +
    textPart.body.size +
    (htmlPart?.body.size ?? 0) +
    200;
  const base = {
    id: m.id,
    threadId: m.threadId,
    labelIds: m.labelIds,
    snippet: snippetOf(m.text),
    sizeEstimate,
    historyId: m.historyId,
    internalDate: m.internalDate,
  };
  if (format === 'minimal') return base;
  if (format === 'metadata') {
    const wanted = metadataHeaders.map((h) => h.toLowerCase());
    return {
      ...base,
      payload: {
        mimeType: payload.mimeType,
        headers: wanted.length ? headers.filter((h) => wanted.includes(h.name.toLowerCase())) : headers,
      },
    };
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
  return plain
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;')
    .replace(/'/g, '&#39;');
}

// ─── Plumbing ─────────────────────────────────────────────────────────────────────────────

function ok(body: unknown): Reply {
  return { status: 200, body };
}

function flavourOf(path: string, match: DiscoveryMatch | undefined): Flavour {
  if (path === '/token') return 'oauth';
  if (path.startsWith('/o/oauth2/')) return 'page';
  return match?.api ?? 'other';
}

/** Paths served by OAuth (accounts.google.com, oauth2.googleapis.com) and the key sets (www.googleapis.com/oauth2). */
function isOAuthPath(path: string): boolean {
  return path === '/token' || path.startsWith('/o/oauth2/') || path.startsWith('/oauth2/');
}

/** Renders an error the way the matching Google front end does. */
function errorReply(err: GoogleError, flavour: Flavour): Reply {
  const e = err.extra;
  if (flavour === 'oauth') {
    return {
      status: err.code,
      body: {
        error: e.reason ?? (err.code >= 500 ? 'server_error' : 'invalid_request'),
        error_description: err.message,
      },
    };
  }
  if (flavour === 'page') {
    return {
      status: err.code,
      body: `<!doctype html><title>Error ${err.code}: ${e.reason ?? 'error'}</title><p>Error ${err.code}: ${e.reason ?? 'error'}</p><p>${err.message}</p>`,
      headers: { 'content-type': 'text/html; charset=utf-8' },
    };
  }
  const error: Record<string, unknown> = { code: err.code, message: err.message };
  if (flavour === 'gmail') {
    const legacy: Record<string, string> = {
      message: e.legacyMessage ?? err.message,
      domain: e.reason === 'accessNotConfigured' ? 'usageLimits' : 'global',
      reason: e.reason ?? GMAIL_REASON[err.code] ?? 'backendError',
    };
    if (e.location) Object.assign(legacy, { location: e.location, locationType: 'header' });
    error.errors = [legacy];
  }
  error.status = e.status ?? CANONICAL[err.code] ?? (err.code >= 500 ? 'INTERNAL' : 'FAILED_PRECONDITION');
  if (e.infoReason) {
    error.details = [
      {
        '@type': 'type.googleapis.com/google.rpc.ErrorInfo',
        reason: e.infoReason,
        domain: 'googleapis.com',
        ...(e.infoMetadata ? { metadata: e.infoMetadata } : {}),
      },
    ];
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
  if (!Number.isInteger(n) || n < 10 || n > 600)
    throw invalid(
      `Invalid ack deadline given: ${String(seconds)}. The minimum deadline you can specify is 10 seconds and the maximum is 600 seconds.`,
    );
  return n;
}

function validPushConfig(config: unknown): PushConfig {
  if (config === undefined || config === null) return {};
  const c = config as PushConfig;
  if (c.pushEndpoint !== undefined) {
    try {
      new URL(c.pushEndpoint);
    } catch {
      throw invalid(
        `Invalid push endpoint given (endpoint=${c.pushEndpoint}). Refer to https://cloud.google.com/pubsub/docs/push#configure_push_endpoint for more information.`,
      );
    }
  }
  if (c.oidcToken && !c.oidcToken.serviceAccountEmail)
    throw invalid('Invalid push config: oidc_token.service_account_email is required.');
  if (!c.pushEndpoint && c.oidcToken) throw invalid('Invalid push config: push_endpoint is required.');
  return structuredClone(c);
}

/** A stable 21-digit numeric id, like a service account's `sub`. */
function numericId(seed: string): string {
  const n = BigInt(`0x${createHash('sha256').update(seed).digest('hex').slice(0, 16)}`);
  return `1${(n % 10n ** 20n).toString().padStart(20, '0')}`;
}

/** One POST on a fresh connection; resolves with the status, rejects on network error or timeout. */
function postJson(
  endpoint: string,
  headers: Record<string, string>,
  body: string,
  timeoutMs: number,
  inflight: Set<http.ClientRequest>,
): Promise<number> {
  const url = new URL(endpoint);
  const transport = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = transport.request(
      url,
      {
        method: 'POST',
        headers: { ...headers, 'content-length': String(Buffer.byteLength(body)) },
        agent: false,
        timeout: timeoutMs,
      },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode!));
        res.on('error', reject);
      },
    );
    inflight.add(req);
    req.on('close', () => inflight.delete(req));
    req.on('timeout', () => req.destroy(new Error(`push timed out after ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end(body);
  });
}
