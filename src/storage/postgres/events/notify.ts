import type pg from 'pg';
import type { Logger } from 'pino';
import { PostgresListener } from '../listener.js';

/** NOTIFY channel: "an event may be due" (accepted, requeued). The payload is the sending store's owner id. */
export const DUE_CHANNEL = 'gatehouse_events_due';

/**
 * "Something may be due": said to the other instances (NOTIFY after COMMIT, coalesced), heard
 * from them (LISTEN on a connection of its own, servers only), and passed to this process's
 * deliverers (onDue). A lost notification is covered by the deliverers' polling.
 */
export class DueNotifier {
  private listener: PostgresListener | undefined;
  private readonly wakers = new Set<() => void>();
  private notifying = false;
  private notifyAgain = false;

  constructor(
    private readonly pool: pg.Pool,
    /** This store's id: the payload of its notifications, so its own are not heard again. */
    private readonly owner: string,
    private readonly isClosed: () => boolean,
    /** Called before the deliverers are woken (the claims then ask the database again). */
    private readonly beforeWake: () => void,
  ) {}

  /** LISTENs for other processes' notifications; its own accepts woke this process's deliverer already. */
  listen(url: string, logger?: Pick<Logger, 'warn' | 'info'>): void {
    this.listener = new PostgresListener(url, DUE_CHANNEL, (sender) => sender !== this.owner && this.wake(), logger);
  }

  onDue(wake: () => void): () => void {
    this.wakers.add(wake);
    return () => this.wakers.delete(wake);
  }

  /** Something may be claimable in the database (another instance's accept, a requeue): the claims ask it again. */
  wake(): void {
    this.beforeWake();
    for (const wake of this.wakers) wake();
  }

  /** Requeued by this process: its own deliverer (the NOTIFY skips it) and the others'. */
  requeued(): void {
    this.wake();
    this.notifyDue();
  }

  /** Sent after COMMIT; one at a time, and commits meanwhile share the next one. Lost ones are covered by polling. */
  notifyDue(): void {
    if (this.notifying) {
      this.notifyAgain = true;
      return;
    }
    this.notifying = true;
    void this.pool
      .query('SELECT pg_notify($1, $2)', [DUE_CHANNEL, this.owner])
      .catch(() => {})
      .finally(() => {
        this.notifying = false;
        if (this.notifyAgain && !this.isClosed()) {
          this.notifyAgain = false;
          this.notifyDue();
        }
      });
  }

  /** One notification with no sender, so every listener wakes, this process's included; rejects as the query does. */
  announce(): Promise<unknown> {
    return this.pool.query("SELECT pg_notify($1, '')", [DUE_CHANNEL]);
  }

  async close(): Promise<void> {
    await this.listener?.close();
  }
}
