import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { parseConfig } from '../../src/config/load.js';
import { configWarnings } from '../../src/config/warnings.js';

const fixtures = fileURLToPath(new URL('../fixtures/tls/', import.meta.url));

describe('config warnings: client certificates', () => {
  const config = (trustProxy: string[]) =>
    parseConfig({
      gateway: {
        upstream: { target: 'http://127.0.0.1:9' },
        trustProxy,
        tls: {
          cert: `${fixtures}cert.pem`,
          key: `${fixtures}key.pem`,
          clientCertificates: { ca: `${fixtures}cert.pem`, mode: 'optional' },
        },
        auth: { clientCertificate: { identities: [{ cn: 'reports', subject: 'reports' }] } },
      },
    });

  it('trustProxy beside clientCertificates is warned about (gatehouse ends TLS: a trusted X-Forwarded-For is the client’s claim); without it, nothing', () => {
    const warned = configWarnings(config(['127.0.0.1'])).filter((w) => w.startsWith('gateway.trustProxy'));
    assert.equal(warned.length, 1);
    assert.match(warned[0]!, /client's own claim/);
    assert.deepEqual(
      configWarnings(config([])).filter((w) => w.startsWith('gateway.trustProxy')),
      [],
    );
  });
});
