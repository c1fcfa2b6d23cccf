import { createHash, createHmac, timingSafeEqual } from 'node:crypto';

/** HMAC-SHA256 of the parts, as raw bytes. */
export function hmacSha256(key: string | Buffer, ...parts: (string | Buffer)[]): Buffer {
  const mac = createHmac('sha256', key);
  for (const part of parts) mac.update(part);
  return mac.digest();
}

/** Constant-time equality of a presented digest (any length) and the expected one. */
export function digestEquals(presented: Buffer, expected: Buffer): boolean {
  return presented.length === expected.length && timingSafeEqual(presented, expected);
}

/** Constant-time equality of two secrets of any length: both are hashed to 32 bytes first. */
export function secretEquals(presented: string | undefined, expectedDigest: Buffer): boolean {
  const value = presented ?? '';
  return timingSafeEqual(sha256(value), expectedDigest) && value !== '';
}

export function sha256(value: string): Buffer {
  return createHash('sha256').update(value, 'utf8').digest();
}

/** Hex (either case) for exactly `bytes` bytes, decoded; undefined otherwise. */
export function fromHex(value: string | undefined, bytes: number): Buffer | undefined {
  return value !== undefined && value.length === bytes * 2 && /^[0-9a-fA-F]+$/.test(value)
    ? Buffer.from(value, 'hex')
    : undefined;
}
