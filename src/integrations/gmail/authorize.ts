import type { OAuth2Client } from 'google-auth-library';
import { UsageError } from '../../errors.js';
import { receiveAuthorizationCode } from '../oauth-loopback.js';

/**
 * Google's installed-app flow: the loopback leg (state, PKCE) from oauth-loopback.ts, the
 * consent URL and the code exchange from google-auth-library. Resolves with the refresh token.
 */
export async function authorizeWithLoopback(
  auth: OAuth2Client,
  request: { scopes: string[]; loginHint?: string; showUrl: (url: string) => void; timeoutMs?: number },
): Promise<{ refreshToken: string }> {
  // Already loaded by the time there is an OAuth2Client (createOAuthClient); imported here, not at
  // the top, so that loading this module does not load the library.
  const { CodeChallengeMethod } = await import('google-auth-library');
  const response = await receiveAuthorizationCode({
    platform: 'Google',
    authorizeUrl: ({ redirectUri, state, codeChallenge }) =>
      auth.generateAuthUrl({
        access_type: 'offline',
        // Always show the consent screen: only then does Google hand out a refresh token again.
        prompt: 'consent',
        scope: request.scopes,
        state,
        code_challenge_method: CodeChallengeMethod.S256,
        code_challenge: codeChallenge,
        login_hint: request.loginHint,
        redirect_uri: redirectUri,
      }),
    showUrl: request.showUrl,
    timeoutMs: request.timeoutMs,
  });
  const { tokens } = await auth.getToken({
    code: response.code,
    codeVerifier: response.codeVerifier,
    redirect_uri: response.redirectUri,
  });
  if (!tokens.refresh_token) {
    throw new UsageError(
      "Google returned no refresh token: remove the app's access at https://myaccount.google.com/permissions and run setup again",
    );
  }
  auth.setCredentials(tokens);
  return { refreshToken: tokens.refresh_token };
}
