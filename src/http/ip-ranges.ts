import ipaddr from 'ipaddr.js';

type Address = ipaddr.IPv4 | ipaddr.IPv6;
type Range = [Address, number];

/**
 * Parses an IP address (IPv4 dotted quad or IPv6) and returns its canonical form:
 * IPv4-mapped IPv6 (`::ffff:127.0.0.1`) becomes IPv4, so one client has one identity.
 * Returns undefined for anything that is not an address (hex/octal IPv4 forms included).
 */
export function parseAddress(value: string): Address | undefined {
  if (ipaddr.IPv4.isValidFourPartDecimal(value)) return ipaddr.IPv4.parse(value);
  // Zone ids (`fe80::1%eth0`) would make one client several identities (lockout keys).
  if (value.includes('%') || !ipaddr.IPv6.isValid(value)) return undefined;
  const v6 = ipaddr.IPv6.parse(value);
  return v6.isIPv4MappedAddress() ? v6.toIPv4Address() : v6;
}

/** Parses `addr` or `addr/prefix`; IPv4-mapped IPv6 ranges (`::ffff:10.0.0.0/104`) become IPv4 ranges. */
function parseRange(value: string): Range | undefined {
  const slash = value.indexOf('/');
  const address = parseAddress(slash === -1 ? value : value.slice(0, slash));
  if (!address) return undefined;
  const mappedV6 = address.kind() === 'ipv4' && value.includes(':');
  const maxPrefix = address.kind() === 'ipv4' ? 32 : 128;
  if (slash === -1) return [address, maxPrefix];
  const prefixText = value.slice(slash + 1);
  if (!/^\d{1,3}$/.test(prefixText)) return undefined;
  let prefix = Number(prefixText);
  if (mappedV6) {
    if (prefix < 96 || prefix > 128) return undefined;
    prefix -= 96;
  }
  return prefix <= maxPrefix ? [address, prefix] : undefined;
}

/** True when `value` is an IP address or CIDR range gatehouse accepts in config. */
export function isValidAddressRange(value: string): boolean {
  return parseRange(value) !== undefined;
}

/** A compiled list of addresses and ranges; `matches` takes an address from `parseAddress`. */
export interface AddressMatcher {
  matches(address: Address): boolean;
}

/** Compiles the ranges once (config load); throws on an invalid entry (the schema has already checked). */
export function compileAddressMatcher(entries: readonly string[]): AddressMatcher {
  const ranges = entries.map((entry) => {
    const range = parseRange(entry);
    if (!range) throw new Error(`invalid CIDR "${entry}"`);
    return range;
  });
  const v4 = ranges.filter(([a]) => a.kind() === 'ipv4') as [ipaddr.IPv4, number][];
  const v6 = ranges.filter(([a]) => a.kind() === 'ipv6') as [ipaddr.IPv6, number][];
  return {
    matches(address) {
      if (address.kind() === 'ipv4') {
        const a = address as ipaddr.IPv4;
        return v4.some((range) => a.match(range));
      }
      const a = address as ipaddr.IPv6;
      return v6.some((range) => a.match(range));
    },
  };
}
