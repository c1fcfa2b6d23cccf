import type { IncomingMessage } from 'node:http';
import proxyaddr from 'proxy-addr';
import { compileAddressMatcher, parseAddress } from './ip-ranges.js';

/** Where a request came from: the client address and the hops it crossed to reach us. Read-only (it may be shared). */
export interface ClientOrigin {
  /** Canonical client address (IPv4-mapped IPv6 normalised to IPv4), or undefined when unusable. */
  ip: string | undefined;
  /** Addresses from the client to our peer, in X-Forwarded-For order (client first). */
  readonly chain: readonly string[];
  /** The peer is a trusted proxy, so its X-Forwarded-Proto/-Host may be believed too. */
  viaTrustedProxy: boolean;
}

export type ClientIpResolver = (req: IncomingMessage) => ClientOrigin;

/**
 * Builds the client-address strategy once per config.
 * With no trusted proxies, the socket address is the client and forwarded headers are ignored.
 * With trusted proxies, X-Forwarded-For is walked from the right while the hop is trusted
 * (proxy-addr), so a client can only ever prepend addresses we do not believe.
 */
export function createClientIpResolver(trustProxy: readonly string[]): ClientIpResolver {
  if (trustProxy.length === 0) {
    // One answer per connection: keep-alive clients send many requests over one socket.
    const bySocket = new WeakMap<object, ClientOrigin>();
    return function socketAddress(req) {
      let origin = bySocket.get(req.socket);
      if (origin === undefined) {
        const ip = canonical(req.socket.remoteAddress);
        origin = Object.freeze({ ip, chain: ip ? [ip] : [], viaTrustedProxy: false });
        if (ip !== undefined) bySocket.set(req.socket, origin);
      }
      return origin;
    };
  }
  const trusted = compileAddressMatcher(trustProxy);
  const trust = (addr: string) => {
    const address = parseAddress(addr);
    return address !== undefined && trusted.matches(address);
  };
  return function forwardedAddress(req) {
    const peer = req.socket.remoteAddress;
    if (peer === undefined) return { ip: undefined, chain: [], viaTrustedProxy: false };
    // proxyaddr.all: [socket, ...X-Forwarded-For right to left], up to and including the first untrusted hop.
    const hops = proxyaddr.all(req, trust);
    const ip = canonical(hops[hops.length - 1]);
    const chain = hops.map((hop) => canonical(hop) ?? hop).reverse();
    return { ip, chain, viaTrustedProxy: trust(peer) };
  };
}

function canonical(value: string | undefined): string | undefined {
  return value === undefined ? undefined : parseAddress(value)?.toString();
}
