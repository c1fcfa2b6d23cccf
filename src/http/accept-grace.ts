import { AsyncLocalStorage } from 'node:async_hooks';

/**
 * The first part of a shutdown (`shutdown.acceptGrace`): the listeners keep accepting while a load
 * balancer learns from /readyz that this instance is going, and every answer says
 * `Connection: close` so keep-alive clients move on.
 *
 * It reaches the closers through the close itself (`withAcceptGrace` around it), not through their
 * arguments: every closer that stops accepting (`closeServer`, the WebSocket drain, the gateway
 * workers' shutdown) reads it where it starts, however many resource stacks lie between. A close
 * made outside one (a failed start, a test's `close(100)`) has no grace: it stops accepting at once.
 */
export interface AcceptGrace {
  /** When accepting stops (ms since the epoch): one moment for every listener of the close. */
  endsAt: number;
  /** Aborted: the rest of the grace is skipped (a second SIGTERM). */
  skip?: AbortSignal;
}

const current = new AsyncLocalStorage<AcceptGrace>();

/** Runs `close` with a grace of `ms` from now: the listeners it closes keep accepting that long first. */
export function withAcceptGrace<T>(grace: { ms: number; skip?: AbortSignal }, close: () => Promise<T>): Promise<T> {
  return current.run({ endsAt: Date.now() + grace.ms, skip: grace.skip }, close);
}

/** The grace of the close running now, while some of it is left. */
export function currentAcceptGrace(): AcceptGrace | undefined {
  const grace = current.getStore();
  return grace && graceLeftMs(grace) > 0 ? grace : undefined;
}

/** How much of `grace` is left (0 once over or skipped). */
export function graceLeftMs(grace: AcceptGrace | undefined): number {
  if (!grace || grace.skip?.aborted) return 0;
  return Math.max(0, grace.endsAt - Date.now());
}

/** Resolves when `grace` is over: its time has passed or it was skipped (at once without one). */
export function acceptGraceOver(grace: AcceptGrace | undefined): Promise<void> {
  const left = graceLeftMs(grace);
  if (left === 0) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(timer);
      grace!.skip?.removeEventListener('abort', done);
      resolve();
    };
    // Not unref'd: the grace is part of the shutdown, the process lives through it.
    const timer = setTimeout(done, left);
    grace!.skip?.addEventListener('abort', done, { once: true });
  });
}
