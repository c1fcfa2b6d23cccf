/** How to close one resource; `graceMs` is how long in-flight work may take (0 when a start is undone). */
export type Closer = (graceMs: number) => Promise<void> | void;

/**
 * The resources a start has opened, closed in reverse order (avvio/fastify's lifecycle): each
 * is registered with `defer` as soon as it is open, so a start that fails part-way closes
 * exactly what it opened, and a shutdown closes the rest in the same order. Every closer runs
 * even when an earlier one throws; the first error is thrown once all have run.
 */
export class ResourceStack {
  private readonly closers: Closer[] = [];

  /** Registers how to close what was just opened. */
  defer(close: Closer): void {
    this.closers.push(close);
  }

  /** Closes everything registered, the last opened first. A second call closes nothing more. */
  async close(graceMs: number): Promise<void> {
    let failure: { error: unknown } | undefined;
    for (let close = this.closers.pop(); close !== undefined; close = this.closers.pop()) {
      try {
        await close(graceMs);
      } catch (error) {
        failure ??= { error };
      }
    }
    if (failure) throw failure.error;
  }

  /**
   * Runs a start: `open` registers what it opens on this stack. When it throws, everything it
   * had opened is closed at once (grace 0, so nothing half-started keeps the process alive) and
   * its error is rethrown, whatever closing met.
   */
  async open<T>(open: (resources: ResourceStack) => Promise<T>): Promise<T> {
    try {
      return await open(this);
    } catch (err) {
      await this.close(0).catch(() => undefined);
      throw err;
    }
  }
}
