import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { UsageError } from '../errors.js';
import type { Config } from '../config/schema.js';

/**
 * Tokens gatehouse obtains itself (OAuth refresh tokens, bot tokens) are stored sealed with
 * AES-256-GCM under `GATEHOUSE_SECRET_KEY` (32 bytes, base64). Each sealed value is bound to
 * what it belongs to (`context`, e.g. "gmail:ana@example.com"), so a sealed token copied onto
 * another row does not open. There is no plaintext fallback: without the key nothing is stored.
 */
export const SECRET_KEY_VARIABLE = 'GATEHOUSE_SECRET_KEY';
/** Keys from before a rotation (comma- or space-separated): they still open, never seal. */
export const PREVIOUS_SECRET_KEYS_VARIABLE = 'GATEHOUSE_SECRET_KEY_PREVIOUS';
const FORMAT = 'v1';
const IV_BYTES = 12;
const TAG_BYTES = 16;

export const HOW_TO_MAKE_A_SECRET_KEY =
  `${SECRET_KEY_VARIABLE} must be 32 random bytes in base64; gatehouse encrypts the tokens it stores with it. ` +
  `Make one with \`openssl rand -base64 32\` (or \`node -e "console.log(crypto.randomBytes(32).toString('base64'))"\`), ` +
  'keep it with your other secrets, and give the same key to every gatehouse using this storage. Losing it means authorising again.';

/**
 * The sealing keys: `current` seals everything; it and `previous` open. A rotation (README,
 * "Rotating GATEHOUSE_SECRET_KEY") runs with the old key in `previous` until `storage reseal`
 * has sealed every stored value again under the new one.
 */
export interface SecretKeys {
  current: Buffer;
  previous: readonly Buffer[];
}

/** Gmail and channels keep sealed tokens: they need GATEHOUSE_SECRET_KEY. */
export function needsSecretKey(config: Pick<Config, 'webhooks' | 'channels'>): boolean {
  return Boolean(config.webhooks.gmail) || Object.keys(config.channels).length > 0;
}

/** The sealing keys from the environment; a UsageError saying how to make one when a key is missing or malformed. */
export function secretKeysFromEnv(env: NodeJS.ProcessEnv = process.env): SecretKeys {
  const value = env[SECRET_KEY_VARIABLE];
  if (!value) throw new UsageError(`${SECRET_KEY_VARIABLE} is not set. ${HOW_TO_MAKE_A_SECRET_KEY}`);
  const current = parseKey(value, SECRET_KEY_VARIABLE, HOW_TO_MAKE_A_SECRET_KEY);
  // A previous key is the one values were sealed with: never a new one to make (found by a newcomer).
  const previous = (env[PREVIOUS_SECRET_KEYS_VARIABLE] ?? '')
    .split(/[\s,]+/)
    .filter((v) => v !== '')
    .map((v, i, all) =>
      parseKey(
        v,
        all.length === 1
          ? PREVIOUS_SECRET_KEYS_VARIABLE
          : `${PREVIOUS_SECRET_KEYS_VARIABLE} (key ${i + 1} of ${all.length})`,
        `It holds the keys ${SECRET_KEY_VARIABLE} had before a rotation, exactly as they were, comma-separated.`,
      ),
    );
  return { current, previous };
}

function parseKey(value: string, name: string, hint: string): Buffer {
  const key = /^[A-Za-z0-9+/]+={0,2}$/.test(value.trim()) ? Buffer.from(value.trim(), 'base64') : Buffer.alloc(0);
  if (key.length !== 32) throw new UsageError(`${name} is not 32 bytes of base64 (got ${key.length} bytes). ${hint}`);
  return key;
}

/**
 * What each sealed value is bound to (its `context`): the row it belongs to. In one place, so that
 * `storage reseal` opens every stored value under the names that sealed it.
 */
export const channelGrantContext = (name: string) => `channel:${name}`;
export const gmailGrantContext = (account: string) => `gmail:${account}`;
/** A channel login's OAuth redirect answer, sealed between the server's callback route and the waiting CLI. */
export const oauthAnswerContext = (name: string) => `oauth:${name}`;

/** `v1:<iv>:<tag>:<ciphertext>` (base64url parts). */
export function sealSecret(plaintext: string, keys: SecretKeys, context: string): string {
  const iv = randomBytes(IV_BYTES);
  const cipher = createCipheriv('aes-256-gcm', keys.current, iv);
  cipher.setAAD(Buffer.from(context, 'utf8'));
  const ciphertext = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
  return [
    FORMAT,
    iv.toString('base64url'),
    cipher.getAuthTag().toString('base64url'),
    ciphertext.toString('base64url'),
  ].join(':');
}

/** Opens a sealed value; a UsageError when none of the keys is the one it was sealed with (or the value was altered). */
export function openSecret(sealed: string, keys: SecretKeys, context: string): string {
  return openSealed(sealed, keys, context).plaintext;
}

/** Opens a sealed value, and says whether the current key opened it (`storage reseal` leaves those as they are). */
export function openSealed(
  sealed: string,
  keys: SecretKeys,
  context: string,
): { plaintext: string; underCurrentKey: boolean } {
  const [format, iv, tag, ciphertext] = sealed.split(':');
  if (format !== FORMAT || iv === undefined || tag === undefined || ciphertext === undefined) {
    throw new UsageError(`a stored secret for ${context} is not in a format this gatehouse reads`);
  }
  for (const key of [keys.current, ...keys.previous]) {
    const plaintext = openWith(key, iv, tag, ciphertext, context);
    if (plaintext !== undefined) return { plaintext, underCurrentKey: key === keys.current };
  }
  const tried =
    keys.previous.length > 0
      ? `neither ${SECRET_KEY_VARIABLE} nor a key in ${PREVIOUS_SECRET_KEYS_VARIABLE} is`
      : `${SECRET_KEY_VARIABLE} is not`;
  throw new UsageError(
    `cannot decrypt the stored secret for ${context}: ${tried} the key it was stored with (or the storage was altered)`,
  );
}

function openWith(key: Buffer, iv: string, tag: string, ciphertext: string, context: string): string | undefined {
  try {
    const authTag = Buffer.from(tag, 'base64url');
    // Node accepts shorter GCM tags (down to 4 bytes): only the full 16 bytes gatehouse writes are taken.
    if (authTag.length !== TAG_BYTES) return undefined;
    const decipher = createDecipheriv('aes-256-gcm', key, Buffer.from(iv, 'base64url'), { authTagLength: TAG_BYTES });
    decipher.setAAD(Buffer.from(context, 'utf8'));
    decipher.setAuthTag(authTag);
    return Buffer.concat([decipher.update(Buffer.from(ciphertext, 'base64url')), decipher.final()]).toString('utf8');
  } catch {
    return undefined;
  }
}
