import { randomBytes } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { CodeChallengeMethod, type OAuth2Client } from 'google-auth-library';
import { UsageError } from '../../errors.js';

/** How long setup waits for the browser to come back. */
const CONSENT_TIMEOUT_MS = 5 * 60_000;

/**
 * The OAuth installed-app flow (RFC 8252): a loopback listener on 127.0.0.1 and a random port
 * is the redirect URI, PKCE (S256) binds the code to this process, and `state` is checked
 * before the code is used. Resolves with the refresh token.
 */
export async function authorizeWithLoopback(
  auth: OAuth2Client,
  request: { scopes: string[]; loginHint?: string; showUrl: (url: string) => void; timeoutMs?: number },
): Promise<{ refreshToken: string }> {
  const state = randomBytes(16).toString('base64url');
  const { codeVerifier, codeChallenge } = await auth.generateCodeVerifierAsync();
  let settle!: { resolve: (code: string) => void; reject: (err: Error) => void };
  const codeArrived = new Promise<string>((resolve, reject) => (settle = { resolve, reject }));

  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://127.0.0.1');
    if (url.pathname !== '/') {
      res.writeHead(404).end();
      return;
    }
    const page = (status: number, text: string) => {
      res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' });
      res.end(`${text}\n`);
    };
    // A request without our state is not the answer to our request (another tab, a forged link): ignored.
    if (url.searchParams.get('state') !== state) return page(400, 'gatehouse: this response does not belong to the running setup (state mismatch).');
    const error = url.searchParams.get('error');
    if (error) {
      page(200, `gatehouse: authorisation refused (${error}). You can close this tab.`);
      return settle.reject(new UsageError(`Google answered "${error}": the consent was not given. Run setup again and approve the requested access.`));
    }
    const code = url.searchParams.get('code');
    if (!code) return page(400, 'gatehouse: no authorisation code in this response.');
    page(200, 'gatehouse: authorised. You can close this tab and return to the terminal.');
    settle.resolve(code);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const redirectUri = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
  const timer = setTimeout(() => settle.reject(new UsageError(`no answer from the browser within ${(request.timeoutMs ?? CONSENT_TIMEOUT_MS) / 60_000} minutes`)), request.timeoutMs ?? CONSENT_TIMEOUT_MS);

  try {
    request.showUrl(auth.generateAuthUrl({
      access_type: 'offline',
      // Always show the consent screen: only then does Google hand out a refresh token again.
      prompt: 'consent',
      scope: request.scopes,
      state,
      code_challenge_method: CodeChallengeMethod.S256,
      code_challenge: codeChallenge,
      login_hint: request.loginHint,
      redirect_uri: redirectUri,
    }));
    const code = await codeArrived;
    const { tokens } = await auth.getToken({ code, codeVerifier, redirect_uri: redirectUri });
    if (!tokens.refresh_token) {
      throw new UsageError('Google returned no refresh token: remove the app\'s access at https://myaccount.google.com/permissions and run setup again');
    }
    auth.setCredentials(tokens);
    return { refreshToken: tokens.refresh_token };
  } finally {
    clearTimeout(timer);
    server.closeAllConnections();
    server.close();
  }
}
