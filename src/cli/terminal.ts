import { spawn } from 'node:child_process';

/** `2026-11-22T10:00:00.000Z (3 min ago)`, `… (in 6 d)`, or `never`. */
export function describeTime(t: number | null, now: number = Date.now()): string {
  if (t === null) return 'never';
  const seconds = Math.round((now - t) / 1000);
  const abs = Math.abs(seconds);
  const text =
    abs < 120
      ? `${abs} s`
      : abs < 7200
        ? `${Math.round(abs / 60)} min`
        : abs < 172_800
          ? `${Math.round(abs / 3600)} h`
          : `${Math.round(abs / 86_400)} d`;
  return `${new Date(t).toISOString()} (${seconds >= 0 ? `${text} ago` : `in ${text}`})`;
}

/** Best effort: the platform's opener, detached; the URL is printed either way. */
export function openBrowser(url: string): void {
  const command = process.platform === 'darwin' ? 'open' : process.platform === 'win32' ? 'explorer' : 'xdg-open';
  try {
    const child = spawn(command, [url], { stdio: 'ignore', detached: true });
    child.on('error', () => undefined);
    child.unref();
  } catch {
    // no opener: the printed URL is enough
  }
}
