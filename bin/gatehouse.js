#!/usr/bin/env node
// The CLI: runs the compiled dist/bin.js. A release tarball (`npm pack`) ships dist/ prebuilt; in a clone
// `npm install` builds it (the `prepare` script), as does `npm run build`.
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const entry = new URL('../dist/bin.js', import.meta.url);
// Checked up front rather than by catching ERR_MODULE_NOT_FOUND, which would also hide a missing dependency.
if (!existsSync(entry)) {
  process.stderr.write(
    `gatehouse: the compiled CLI is missing (${fileURLToPath(entry)}).\n` +
      '  In a clone of the repository, build it first: npm run build\n',
  );
  process.exit(1);
}
await import(entry.href);
