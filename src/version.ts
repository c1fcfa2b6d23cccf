import { readFileSync } from 'node:fs';

/** The package version, for --version and the User-Agent gatehouse sends. */
export const VERSION: string = (
  JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
).version;
