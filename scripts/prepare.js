// npm's `prepare` (after `npm install` / `npm ci` in a clone, and for a git dependency): builds dist/.
// `npm pack` runs `prepare` as well, right after `prepack` has built a clean dist/: nothing to do then.
// TypeScript is a devDependency, so an install that omits them (`npm ci --omit=dev`) cannot build;
// it stops here with what to run instead of tsc's bare "not found" (exit 127).
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';

if (process.env.npm_command === 'pack' || process.env.npm_command === 'publish') process.exit(0);

try {
  createRequire(import.meta.url).resolve('typescript/package.json');
} catch {
  process.stderr.write(
    'gatehouse: cannot build dist/: TypeScript is a devDependency and this install left devDependencies out (--omit=dev).\n' +
      '  From a clone, install everything, build, then drop the devDependencies:\n' +
      '    npm ci && npm run build && npm prune --omit=dev\n' +
      '  or install a release tarball, which has dist/ prebuilt (see "Production" in README.md):\n' +
      '    npm install -g ./gatehouse-<version>.tgz --omit=dev\n',
  );
  process.exit(1);
}

const build = spawnSync('npm', ['run', 'build'], { stdio: 'inherit', shell: process.platform === 'win32' });
process.exit(build.status ?? 1);
