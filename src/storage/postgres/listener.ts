import pg from 'pg';
import type { Logger } from 'pino';
import { connectionOptions } from './pool.js';

const RECONNECT_MIN_MS = 250;
const RECONNECT_MAX_MS = 10_000;

/**
 * One dedicated connection that LISTENs on `channel` and reconnects itself (with capped
 * backoff) whenever it is lost. `onNotify` is also called after every (re)connection: a
 * notification sent while it was down is lost, and the caller should look for work then.
 */
export class PostgresListener {
  private client: pg.Client | undefined;
  private timer: NodeJS.Timeout | undefined;
  private failures = 0;
  private closed = false;

  constructor(
    private readonly url: string,
    private readonly channel: string,
    /** A notification's payload; undefined after a (re)connection. */
    private readonly onNotify: (payload?: string) => void,
    private readonly logger?: Pick<Logger, 'warn' | 'info'>,
  ) {
    if (!/^[a-z_][a-z0-9_]*$/.test(channel)) throw new Error(`invalid LISTEN channel ${channel}`);
    void this.connect();
  }

  private async connect(): Promise<void> {
    if (this.closed) return;
    const client = new pg.Client(connectionOptions(this.url));
    this.client = client;
    let lost = false;
    const onLost = (err?: Error) => {
      if (lost) return;
      lost = true;
      client.removeAllListeners('notification');
      void client.end().catch(() => {});
      if (this.closed) return;
      if (this.failures++ === 0)
        this.logger?.warn(
          { err: err?.message },
          'postgres: the LISTEN connection was lost; reconnecting (polling meanwhile)',
        );
      this.retry();
    };
    client.on('error', onLost);
    client.on('end', () => onLost());
    client.on('notification', (message) => this.onNotify(message.payload));
    try {
      await client.connect();
      // A channel name cannot be a bound parameter; it is a constant checked above.
      await client.query(`LISTEN ${this.channel}`);
    } catch (err) {
      onLost(err as Error);
      return;
    }
    if (this.closed) {
      void client.end().catch(() => {});
      return;
    }
    if (this.failures > 0) this.logger?.info('postgres: LISTEN connection restored');
    this.failures = 0;
    this.onNotify();
  }

  private retry(): void {
    const delay = Math.min(RECONNECT_MIN_MS * 2 ** Math.min(this.failures - 1, 10), RECONNECT_MAX_MS);
    this.timer = setTimeout(() => void this.connect(), delay);
    this.timer.unref();
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.timer);
    const client = this.client;
    this.client = undefined;
    if (client) {
      client.removeAllListeners('end');
      // end() waits for the server's goodbye: bounded, so a half-dead connection cannot hold up shutdown.
      await Promise.race([client.end().catch(() => {}), new Promise((r) => setTimeout(r, 1_000).unref())]);
    }
  }
}
