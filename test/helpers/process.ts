import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

let entry: string[] | undefined;

/**
 * How the CLI is run: the built copy (bin/gatehouse.js → dist/) when every source file is older
 * than its build (`npm test` builds first), else from source through tsx. Measured: a spawn
 * under tsx costs about 0.4 s more, and the suite spawns the CLI a few hundred times (a CLI-heavy
 * file took 40 s under tsx, 20 s built). A source file edited since the build falls back to tsx,
 * so a test never runs stale code. GATEHOUSE_TEST_CLI=tsx|dist forces one.
 */
function cliEntry(): string[] {
  const fromSource = ['--import', 'tsx', `${ROOT}src/bin.ts`];
  const built = [`${ROOT}bin/gatehouse.js`];
  if (process.env.GATEHOUSE_TEST_CLI === 'tsx') return fromSource;
  if (process.env.GATEHOUSE_TEST_CLI === 'dist') return built;
  entry ??= distIsCurrent() ? built : fromSource;
  return entry;
}

function distIsCurrent(): boolean {
  const src = path.join(ROOT, 'src');
  for (const file of readdirSync(src, { recursive: true, encoding: 'utf8' })) {
    if (!file.endsWith('.ts') || file.endsWith('.d.ts')) continue;
    const built = path.join(ROOT, 'dist', file.replace(/\.ts$/, '.js'));
    if (!existsSync(built) || statSync(built).mtimeMs < statSync(path.join(src, file)).mtimeMs) return false;
  }
  return true;
}

/** Runs the CLI (built, or from source: see cliEntry) to completion. */
export async function runCli(
  args: string[],
  options: { env?: NodeJS.ProcessEnv; cwd?: string; timeoutMs?: number } = {},
): Promise<CliResult> {
  const child = spawnCli(args, options);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d) => (stdout += d));
  child.stderr!.on('data', (d) => (stderr += d));
  // Generous: a CLI under tsx on a loaded 2-core machine has taken over 20 s to start.
  const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 60_000);
  const [code] = (await once(child, 'exit')) as [number | null];
  clearTimeout(timer);
  return { code, stdout, stderr };
}

export function spawnCli(args: string[], options: { env?: NodeJS.ProcessEnv; cwd?: string } = {}): ChildProcess {
  return spawn(process.execPath, [...cliEntry(), ...args], {
    cwd: options.cwd ?? ROOT,
    env: { ...process.env, ...options.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

/** The line `gatehouse start` logs on its first SIGTERM/SIGINT (src/cli/start.ts). */
export const DRAIN_START = 'shutting down: /readyz fails, still accepting for shutdown.acceptGrace, then draining';
const isDrainStart = (line: Record<string, any>) => line.msg === DRAIN_START;

export interface ServerProcess {
  child: ChildProcess;
  /** JSON log lines seen so far. */
  lines: Record<string, any>[];
  /** Resolves with the first log line matching, waiting up to `timeoutMs`. */
  waitFor(match: (line: Record<string, any>) => boolean, timeoutMs?: number): Promise<Record<string, any>>;
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

/**
 * Starts `gatehouse start --config F` as a real child process and follows its JSON log;
 * `command` runs another long-lived command instead (e.g. ['webhooks', 'gmail', 'run']).
 */
export function startServerProcess(
  configFile: string,
  options: { env?: NodeJS.ProcessEnv; cwd?: string; command?: string[] } = {},
): ServerProcess {
  const child = spawnCli([...(options.command ?? ['start']), '--config', configFile], options);
  const lines: Record<string, any>[] = [];
  const waiters: { match: (l: Record<string, any>) => boolean; resolve: (l: Record<string, any>) => void }[] = [];
  let buffer = '';
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d));
  child.stdout!.on('data', (d: Buffer) => {
    buffer += d.toString();
    let nl: number;
    while ((nl = buffer.indexOf('\n')) !== -1) {
      const text = buffer.slice(0, nl);
      buffer = buffer.slice(nl + 1);
      let line: Record<string, any>;
      try {
        line = JSON.parse(text);
      } catch {
        continue;
      }
      lines.push(line);
      for (const w of [...waiters])
        if (w.match(line)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(line);
        }
    }
  });
  const exited = once(child, 'exit').then(([code]) => code as number | null);
  return {
    child,
    lines,
    waitFor(match, timeoutMs = 60_000) {
      // generous: a loaded CI machine starts tsx processes slowly
      const found = lines.find(match);
      if (found) return Promise.resolve(found);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(
          () =>
            reject(new Error(`timed out waiting for a log line; stderr: ${stderr}; lines: ${JSON.stringify(lines)}`)),
          timeoutMs,
        );
        waiters.push({
          match,
          resolve: (l) => {
            clearTimeout(timer);
            resolve(l);
          },
        });
        void exited.then((code) => {
          clearTimeout(timer);
          reject(new Error(`process exited (${code}) before the log line; stderr: ${stderr}`));
        });
      });
    },
    async stop(signal = 'SIGTERM') {
      const alive = () => child.exitCode === null && child.signalCode === null;
      if (alive()) child.kill(signal);
      // `gatehouse start` keeps accepting for shutdown.acceptGrace (5 s by default) after a first
      // SIGTERM/SIGINT; a second one skips the rest of it, as an operator would: no test waits it out.
      if ((signal === 'SIGTERM' || signal === 'SIGINT') && alive()) {
        const draining = new Promise<void>((resolve) => {
          if (lines.some(isDrainStart)) return resolve();
          waiters.push({ match: isDrainStart, resolve: () => resolve() });
        });
        if (await Promise.race([draining.then(() => true), exited.then(() => false)])) {
          if (alive()) child.kill(signal);
        }
      }
      return exited;
    },
  };
}
