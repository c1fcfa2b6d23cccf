import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { compileAddressMatcher, isValidAddressRange, parseAddress } from '../../src/http/ip-ranges.js';

describe('ip allow-list: parseAddress accepts only canonical address forms', () => {
  it('parses IPv4 dotted quads', () => {
    const address = parseAddress('192.168.1.20');
    assert.equal(address?.kind(), 'ipv4');
    assert.equal(address?.toString(), '192.168.1.20');
  });

  it('parses IPv6 and prints its canonical (compressed) form', () => {
    assert.equal(parseAddress('::1')?.toString(), '::1');
    assert.equal(parseAddress('2001:DB8:0:0:0:0:0:1')?.toString(), '2001:db8::1');
    assert.equal(parseAddress('2001:db8::1')?.kind(), 'ipv6');
  });

  it('turns IPv4-mapped IPv6 into IPv4, so one client has one identity', () => {
    for (const mapped of ['::ffff:127.0.0.1', '::FFFF:127.0.0.1', '::ffff:7f00:1']) {
      const address = parseAddress(mapped);
      assert.equal(address?.kind(), 'ipv4', mapped);
      assert.equal(address?.toString(), '127.0.0.1', mapped);
    }
  });

  it('rejects hex, octal, shortened and padded IPv4 forms that some parsers read as other addresses', () => {
    for (const value of [
      '0x7f.0.0.1',
      '0177.0.0.1',
      '127.0.0.01',
      '127.1',
      '2130706433',
      '127.0.0.1.',
      ' 127.0.0.1',
      '127.0.0.1 ',
      '256.0.0.1',
    ]) {
      assert.equal(parseAddress(value), undefined, value);
    }
  });

  it('rejects non-addresses, CIDR ranges and host:port', () => {
    for (const value of ['foo', '', '10.0.0.0/8', '::1/128', '127.0.0.1:8080', '[::1]', 'localhost']) {
      assert.equal(parseAddress(value), undefined, value);
    }
  });
});

describe('ip allow-list: isValidAddressRange (config validation)', () => {
  const valid = [
    '10.0.0.0/8',
    '10.0.0.0/32',
    '0.0.0.0/0',
    '192.168.1.1',
    '::1',
    'fe80::/10',
    '::/0',
    '2001:db8::/128',
    '::ffff:10.0.0.0/104',
    '::ffff:10.0.0.1',
  ];
  for (const value of valid) {
    it(`accepts ${value}`, () => assert.equal(isValidAddressRange(value), true));
  }
  const invalid = [
    '10.0.0.0/33',
    '::/129',
    '10.0.0.0/',
    '10.0.0.0/-1',
    '10.0.0.0/8/8',
    '10.0.0.0/x',
    '10.0.0.0/1000',
    '::ffff:10.0.0.0/95',
    '::ffff:10.0.0.0/129',
    '127.1',
    '0x7f.0.0.1/8',
    'foo',
    '',
  ];
  for (const value of invalid) {
    it(`rejects ${JSON.stringify(value)}`, () => assert.equal(isValidAddressRange(value), false));
  }
});

describe('ip allow-list: compileAddressMatcher', () => {
  function matches(entries: string[], address: string): boolean {
    const parsed = parseAddress(address);
    assert.ok(parsed, `test address ${address} must parse`);
    return compileAddressMatcher(entries).matches(parsed);
  }

  it('matches IPv4 addresses inside a CIDR and not outside it', () => {
    const list = ['10.0.0.0/8', '192.168.1.0/24'];
    assert.equal(matches(list, '10.0.0.1'), true);
    assert.equal(matches(list, '10.255.255.255'), true);
    assert.equal(matches(list, '192.168.1.77'), true);
    assert.equal(matches(list, '11.0.0.0'), false);
    assert.equal(matches(list, '9.255.255.255'), false);
    assert.equal(matches(list, '192.168.2.1'), false);
  });

  it('a bare address matches only itself', () => {
    assert.equal(matches(['203.0.113.7'], '203.0.113.7'), true);
    assert.equal(matches(['203.0.113.7'], '203.0.113.8'), false);
    assert.equal(matches(['::1'], '::1'), true);
    assert.equal(matches(['::1'], '::2'), false);
  });

  it('matches IPv6 addresses against IPv6 ranges', () => {
    const list = ['fe80::/10', '2001:db8::/32'];
    assert.equal(matches(list, 'fe80::1'), true);
    assert.equal(matches(list, 'febf:ffff::1'), true);
    assert.equal(matches(list, 'fec0::1'), false);
    assert.equal(matches(list, '2001:db8:1234::5'), true);
    assert.equal(matches(list, '2001:db9::1'), false);
  });

  it('an IPv4-mapped client matches an IPv4 range, and an IPv4-mapped range matches an IPv4 client', () => {
    assert.equal(matches(['127.0.0.0/8'], '::ffff:127.0.0.1'), true);
    assert.equal(matches(['::ffff:10.0.0.0/104'], '10.20.30.40'), true);
    assert.equal(matches(['::ffff:10.0.0.0/104'], '::ffff:10.20.30.40'), true);
    assert.equal(matches(['::ffff:10.0.0.0/104'], '11.0.0.1'), false);
    assert.equal(matches(['::ffff:10.0.0.1'], '10.0.0.1'), true);
  });

  it('IPv4 ranges never match IPv6 clients and vice versa', () => {
    assert.equal(matches(['0.0.0.0/0'], '::1'), false);
    assert.equal(matches(['::1'], '127.0.0.1'), false);
  });

  it('an empty list matches nothing', () => {
    assert.equal(matches([], '127.0.0.1'), false);
    assert.equal(matches([], '::1'), false);
  });

  it('throws when built with an invalid entry (config mistakes fail at build time)', () => {
    assert.throws(() => compileAddressMatcher(['10.0.0.0/8', '10.0.0.0/33']));
    assert.throws(() => compileAddressMatcher(['not-an-ip']));
  });
});

describe('parseAddress: zone ids', () => {
  it('refuses an IPv6 address with a zone id (one client must have one identity for the lockout)', () => {
    assert.equal(parseAddress('fe80::1%eth0'), undefined);
    assert.equal(parseAddress('2001:db8::1%x'), undefined);
    assert.equal(parseAddress('2001:db8::1')?.toString(), '2001:db8::1');
  });
});
