/**
 * Which Google endpoints the Gmail integration calls (src/integrations/gmail/google.ts) and which
 * key set the push route checks tokens against (run.ts): pure choices, tested as such.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { GOOGLE_ENDPOINTS, googleEndpoints } from '../../src/integrations/gmail/google.js';
import { gmailPushVerifier } from '../../src/integrations/gmail/run.js';

const push = {
  path: '/webhook/gmail',
  audience: 'https://hooks.example.com/webhook/gmail',
  serviceAccountEmail: 'push@p.iam.gserviceaccount.com',
};

describe("Google endpoints: googleApiUrl, else the client file's OAuth URIs, else Google's", () => {
  it("nothing configured: Google's own", () => {
    assert.deepEqual(googleEndpoints(), {
      gmailRoot: 'https://gmail.googleapis.com/',
      pubsubRoot: 'https://pubsub.googleapis.com/',
      authorizeUrl: 'https://accounts.google.com/o/oauth2/v2/auth',
      tokenUrl: 'https://oauth2.googleapis.com/token',
      jwksUri: 'https://www.googleapis.com/oauth2/v3/certs',
    });
  });

  it("the client file's auth_uri and token_uri replace the OAuth endpoints only", () => {
    const e = googleEndpoints({ authUri: 'https://a.example/o/oauth2/auth', tokenUri: 'https://a.example/token' });
    assert.deepEqual(e, {
      ...GOOGLE_ENDPOINTS,
      authorizeUrl: 'https://a.example/o/oauth2/auth',
      tokenUrl: 'https://a.example/token',
    });
  });

  it("googleApiUrl puts every endpoint under it, over the client file's", () => {
    const e = googleEndpoints({
      googleApiUrl: 'http://egress.internal:3128',
      authUri: 'https://a.example/auth',
      tokenUri: 'https://a.example/token',
    });
    assert.deepEqual(e, {
      gmailRoot: 'http://egress.internal:3128/',
      pubsubRoot: 'http://egress.internal:3128/',
      authorizeUrl: 'http://egress.internal:3128/o/oauth2/v2/auth',
      tokenUrl: 'http://egress.internal:3128/token',
      jwksUri: 'http://egress.internal:3128/oauth2/v3/certs',
    });
  });
});

describe('push tokens: the key set they are checked against', () => {
  it('an explicit push.jwksUri always, even with googleApiUrl', () => {
    const verify = gmailPushVerifier(
      { googleApiUrl: 'http://egress.internal:3128/' },
      { ...push, jwksUri: 'https://keys.example/jwks' },
    );
    assert.deepEqual(verify, {
      type: 'pubsub-oidc',
      audience: push.audience,
      serviceAccountEmail: push.serviceAccountEmail,
      jwksUri: 'https://keys.example/jwks',
    });
  });

  it("else the one under googleApiUrl, else Google's", () => {
    assert.equal(
      gmailPushVerifier({ googleApiUrl: 'http://egress.internal:3128/' }, push).jwksUri,
      'http://egress.internal:3128/oauth2/v3/certs',
    );
    assert.equal(gmailPushVerifier({}, push).jwksUri, 'https://www.googleapis.com/oauth2/v3/certs');
  });
});
