import { extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import type { Logger } from 'pino';
import type { WebhooksConfig } from '../config/schema.js';
import { createLogger } from '../log.js';
import { Deliverer } from './deliverer.js';
import type { EventStore } from './store.js';

/*
 * The deliverer on its own thread. Under load, posting events to targets took as much of the
 * event loop as receiving them, so deliveries fell behind ingest; on a thread of its own the
 * deliverer uses the second core. The store stays on the main thread (one SQLite writer, one
 * group commit): the worker reaches it through the four calls the deliverer makes.
 */

type StoreCall = 'claimDue' | 'recordAttempt' | 'nextDueAt' | 'releaseLeases';
type ToWorker =
  | { kind: 'result'; id: number; value?: unknown; error?: string }
  | { kind: 'notify' }
  | { kind: 'config'; config: WebhooksConfig }
  | { kind: 'stop'; graceMs: number };
type FromWorker =
  | { kind: 'call'; id: number; method: StoreCall; args: unknown[] }
  | { kind: 'started' }
  | { kind: 'stopped' };

/** The deliverer's interface as the server uses it, in-process or on a worker thread. */
export interface DeliveryRunner {
  start(): Promise<void>;
  notify(): void;
  reconfigure(config: WebhooksConfig): void;
  stop(graceMs?: number): Promise<void>;
}

/** Main-thread side: owns the worker and answers its store calls. */
export class DeliveryWorker implements DeliveryRunner {
  private worker: Worker | undefined;
  private notifyScheduled = false;
  private stopping = false;
  private config: WebhooksConfig;

  constructor(
    private readonly store: EventStore,
    config: WebhooksConfig,
    private readonly logger: Logger,
    private readonly logLevel: string,
  ) {
    this.config = config;
  }

  async start(): Promise<void> {
    const worker = spawnWorker({ config: this.config, logLevel: this.logLevel });
    this.worker = worker;
    worker.on('message', (message: FromWorker) => {
      if (message.kind === 'call') void this.answer(worker, message);
    });
    worker.on('error', (err) => this.logger.error({ err: err.message }, 'delivery worker failed'));
    let started = false;
    worker.on('exit', (code) => {
      if (this.stopping || !started) return;
      // Deliveries are leased, not lost: a new worker picks up what the old one left.
      this.logger.error({ code }, 'delivery worker exited; starting a new one');
      setTimeout(() => void this.start(), 1_000).unref();
    });
    await this.waitFor(worker, 'started');
    started = true;
  }

  notify(): void {
    if (this.notifyScheduled || !this.worker) return;
    this.notifyScheduled = true;
    setImmediate(() => {
      this.notifyScheduled = false;
      this.worker?.postMessage({ kind: 'notify' } satisfies ToWorker);
    });
  }

  reconfigure(config: WebhooksConfig): void {
    this.config = config;
    this.worker?.postMessage({ kind: 'config', config } satisfies ToWorker);
  }

  async stop(graceMs = 10_000): Promise<void> {
    const worker = this.worker;
    if (!worker) return;
    this.stopping = true;
    worker.postMessage({ kind: 'stop', graceMs } satisfies ToWorker);
    await Promise.race([this.waitFor(worker, 'stopped'), new Promise((r) => setTimeout(r, graceMs + 1_000).unref())]);
    await worker.terminate();
    this.worker = undefined;
  }

  private async answer(worker: Worker, call: Extract<FromWorker, { kind: 'call' }>): Promise<void> {
    let reply: ToWorker;
    try {
      const value = await (this.store[call.method] as (...args: unknown[]) => Promise<unknown>)(...call.args);
      reply = { kind: 'result', id: call.id, value };
    } catch (err) {
      reply = { kind: 'result', id: call.id, error: (err as Error).message };
    }
    worker.postMessage(reply);
  }

  private waitFor(worker: Worker, kind: 'started' | 'stopped'): Promise<void> {
    return new Promise((resolve, reject) => {
      const onMessage = (message: FromWorker) => {
        if (message.kind !== kind) return;
        worker.off('message', onMessage);
        worker.off('exit', onExit);
        resolve();
      };
      const onExit = () => reject(new Error(`delivery worker exited before "${kind}"`));
      worker.on('message', onMessage);
      worker.once('exit', onExit);
    });
  }
}

/**
 * This file, on a new thread. Built, it is plain JavaScript; from source (tests, `tsx`), the
 * worker first registers tsx, which Node 20 does not carry over from `--import tsx` to workers.
 */
function spawnWorker(data: { config: WebhooksConfig; logLevel: string }): Worker {
  const self = fileURLToPath(import.meta.url);
  if (extname(self) === '.js') return new Worker(self, { workerData: data });
  const bootstrap = `import('tsx/esm/api').then(({ register }) => { register(); return import(${JSON.stringify(import.meta.url)}); })`;
  return new Worker(bootstrap, { eval: true, workerData: data });
}

/** Worker side: a Deliverer whose store calls go to the main thread. */
function runWorker(): void {
  const port = parentPort!;
  const { config, logLevel } = workerData as { config: WebhooksConfig; logLevel: string };
  const pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  let nextId = 0;
  const call = (method: StoreCall) => (...args: unknown[]) =>
    new Promise<unknown>((resolve, reject) => {
      const id = nextId++;
      pending.set(id, { resolve, reject });
      port.postMessage({ kind: 'call', id, method, args } satisfies FromWorker);
    });
  const store = {
    claimDue: call('claimDue'),
    recordAttempt: call('recordAttempt'),
    nextDueAt: call('nextDueAt'),
    releaseLeases: call('releaseLeases'),
  } as unknown as EventStore;
  const deliverer = new Deliverer(store, config, createLogger({ level: logLevel, pretty: false }));

  port.on('message', (message: ToWorker) => {
    switch (message.kind) {
      case 'result': {
        const waiting = pending.get(message.id);
        pending.delete(message.id);
        if (message.error !== undefined) waiting?.reject(new Error(message.error));
        else waiting?.resolve(message.value);
        break;
      }
      case 'notify':
        deliverer.notify();
        break;
      case 'config':
        deliverer.reconfigure(message.config);
        break;
      case 'stop':
        void deliverer.stop(message.graceMs).then(() => port.postMessage({ kind: 'stopped' } satisfies FromWorker));
        break;
    }
  });
  void deliverer.start().then(() => port.postMessage({ kind: 'started' } satisfies FromWorker));
}

if (!isMainThread && (workerData as { config?: unknown } | null)?.config !== undefined) runWorker();
