import assert from 'node:assert/strict';
import type { IncomingMessage } from 'node:http';
import { describe, it } from 'node:test';
import { createClientIpResolver } from '../../src/http/client-ip.js';

function fakeRequest(remoteAddress: string | undefined, forwardedFor?: string): IncomingMessage {
  const headers: Record<string, string> = {};
  if (forwardedFor !== undefined) headers['x-forwarded-for'] = forwardedFor;
  return { socket: { remoteAddress }, headers } as unknown as IncomingMessage;
}

describe('client ip: without trusted proxies the socket address is the client', () => {
  const resolve = createClientIpResolver([]);

  it('uses the socket address', () => {
    assert.deepEqual(resolve(fakeRequest('203.0.113.9')), {
      ip: '203.0.113.9',
      chain: ['203.0.113.9'],
      viaTrustedProxy: false,
    });
  });

  it('ignores X-Forwarded-For entirely', () => {
    const origin = resolve(fakeRequest('203.0.113.9', '10.0.0.1, 127.0.0.1'));
    assert.equal(origin.ip, '203.0.113.9');
    assert.deepEqual(origin.chain, ['203.0.113.9']);
    assert.equal(origin.viaTrustedProxy, false);
  });

  it('normalises IPv4-mapped IPv6 socket addresses to IPv4', () => {
    assert.equal(resolve(fakeRequest('::ffff:198.51.100.4')).ip, '198.51.100.4');
  });

  it('keeps IPv6 socket addresses in canonical form', () => {
    assert.equal(resolve(fakeRequest('2001:DB8:0::1')).ip, '2001:db8::1');
  });

  it('no socket address (closed socket): ip undefined, empty chain', () => {
    assert.deepEqual(resolve(fakeRequest(undefined)), { ip: undefined, chain: [], viaTrustedProxy: false });
  });
});

describe('client ip: with trusted proxies X-Forwarded-For is walked from the right', () => {
  const resolve = createClientIpResolver(['127.0.0.1']);

  it('a request from the trusted proxy: the rightmost untrusted XFF entry is the client', () => {
    const origin = resolve(fakeRequest('127.0.0.1', '198.51.100.7'));
    assert.equal(origin.ip, '198.51.100.7');
    assert.deepEqual(origin.chain, ['198.51.100.7', '127.0.0.1']);
    assert.equal(origin.viaTrustedProxy, true);
  });

  it('skips trusted hops in XFF (proxy chains)', () => {
    const origin = resolve(fakeRequest('127.0.0.1', '198.51.100.7, 127.0.0.1'));
    assert.equal(origin.ip, '198.51.100.7');
    assert.deepEqual(origin.chain, ['198.51.100.7', '127.0.0.1', '127.0.0.1']);
  });

  it('spoofed entries left of an untrusted hop are not believed', () => {
    // The client sent "X-Forwarded-For: 10.0.0.1, 127.0.0.1"; the trusted proxy appended the client's real address.
    const origin = resolve(fakeRequest('127.0.0.1', '10.0.0.1, 127.0.0.1, 203.0.113.50'));
    assert.equal(origin.ip, '203.0.113.50');
    assert.deepEqual(origin.chain, ['203.0.113.50', '127.0.0.1']);
    assert.ok(!origin.chain.includes('10.0.0.1'));
  });

  it('chain is in X-Forwarded-For order: client first, our peer last', () => {
    const resolveMany = createClientIpResolver(['10.0.0.0/8', '127.0.0.1']);
    const origin = resolveMany(fakeRequest('127.0.0.1', '198.51.100.7, 10.1.1.1, 10.2.2.2'));
    assert.equal(origin.ip, '198.51.100.7');
    assert.deepEqual(origin.chain, ['198.51.100.7', '10.1.1.1', '10.2.2.2', '127.0.0.1']);
  });

  it('XFF from an untrusted peer is ignored: the peer is the client', () => {
    const origin = resolve(fakeRequest('203.0.113.9', '127.0.0.1, 10.0.0.1'));
    assert.equal(origin.ip, '203.0.113.9');
    assert.deepEqual(origin.chain, ['203.0.113.9']);
    assert.equal(origin.viaTrustedProxy, false);
  });

  it('a trusted peer without XFF is itself the client', () => {
    const origin = resolve(fakeRequest('127.0.0.1'));
    assert.equal(origin.ip, '127.0.0.1');
    assert.deepEqual(origin.chain, ['127.0.0.1']);
    assert.equal(origin.viaTrustedProxy, true);
  });

  it('an IPv4-mapped peer is matched against IPv4 trusted proxies, and mapped XFF entries are normalised', () => {
    const origin = resolve(fakeRequest('::ffff:127.0.0.1', '::ffff:198.51.100.7'));
    assert.equal(origin.viaTrustedProxy, true);
    assert.equal(origin.ip, '198.51.100.7');
    assert.deepEqual(origin.chain, ['198.51.100.7', '127.0.0.1']);
  });

  it('a garbage XFF entry where the client should be: ip undefined', () => {
    for (const garbage of ['not-an-ip', '198.51.100.7:4711', '0x7f.0.0.1', '[::1]']) {
      const origin = resolve(fakeRequest('127.0.0.1', `10.0.0.1, ${garbage}`));
      assert.equal(origin.ip, undefined, garbage);
      assert.equal(origin.viaTrustedProxy, true, garbage);
    }
  });

  it('no socket address: ip undefined, empty chain, not via a trusted proxy', () => {
    assert.deepEqual(resolve(fakeRequest(undefined, '198.51.100.7')), {
      ip: undefined,
      chain: [],
      viaTrustedProxy: false,
    });
  });

  it('trusted proxies given as IPv6 and CIDR', () => {
    const resolveV6 = createClientIpResolver(['::1', 'fd00::/8']);
    const origin = resolveV6(fakeRequest('::1', '2001:db8::7, fd12::1'));
    assert.equal(origin.ip, '2001:db8::7');
    assert.deepEqual(origin.chain, ['2001:db8::7', 'fd12::1', '::1']);
    assert.equal(origin.viaTrustedProxy, true);
  });
});
