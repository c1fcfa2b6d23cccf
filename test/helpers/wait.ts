import { setTimeout as sleep } from 'node:timers/promises';

export interface WaitForOptions {
  /** Give up after this long. Default 10 s: generous, since a loaded 2-core CI machine is slow. */
  timeoutMs?: number;
  /** What is awaited, for the timeout message; a function is called then (it may describe the state seen). */
  what?: string | (() => string | Promise<string>);
  /** Time between checks. Default 20 ms. */
  intervalMs?: number;
}

/** What a truthy check returned: its type without the falsy members. */
export type Truthy<T> = Exclude<T, undefined | null | false | 0 | ''>;

/**
 * Calls `check` (sync or async) until it returns a truthy value, and resolves with that value. After
 * `timeoutMs` it rejects with "timed out after N ms waiting for <what>" and the last value seen; a check
 * that throws rejects at once (a broken check is a failure, not something to wait out).
 * The one polling helper of the suite; ServerProcess.waitFor (test/helpers/process.ts) waits for log lines.
 */
export async function waitFor<T>(check: () => T | Promise<T>, options: WaitForOptions = {}): Promise<Truthy<T>> {
  const { timeoutMs = 10_000, intervalMs = 20 } = options;
  const started = Date.now();
  for (;;) {
    const value = await check();
    if (value) return value as Truthy<T>;
    if (Date.now() - started >= timeoutMs) {
      const what = typeof options.what === 'function' ? await options.what() : (options.what ?? 'a condition');
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last value: ${String(value)})`);
    }
    await sleep(intervalMs);
  }
}
