import type { LockoutControl } from '../admin/sources.js';
import { latestLocks, LiftNotShared, type LockoutStore } from '../http/lockout.js';
import type { RunningGateway } from './server.js';

/**
 * The lockouts as the admin API lists and lifts them: the store of this process (on PostgreSQL
 * with the locks it learned from the other instances) and, with `gateway.workers` > 1, each
 * worker's own view (its share of the budget can lock a client the shared count has not).
 */
export function lockoutControl(store: LockoutStore, gateway: Pick<RunningGateway, 'workerLockouts'>): LockoutControl {
  return {
    async list(now) {
      const inWorkers = (await gateway.workerLockouts?.list()) ?? [];
      return latestLocks([...(store.activeLocks?.(now) ?? []), ...inWorkers]);
    },
    async lift(keys, now) {
      const missed: string[] = [];
      let here: [string, number][];
      try {
        here = (await store.lift?.(keys, now)) ?? [];
      } catch (err) {
        if (!(err instanceof LiftNotShared)) throw err;
        here = err.locks;
        missed.push(`the shared store did not answer (${err.message}): other instances may still refuse the client`);
      }
      // The workers after the store: a lock the store told them of before the lift is lifted too.
      const inWorkers = await gateway.workerLockouts?.lift(keys);
      if (inWorkers?.unanswered)
        missed.push(`${inWorkers.unanswered} gateway worker(s) did not answer within 5 s: they may still refuse it`);
      return {
        locks: latestLocks([...here, ...(inWorkers?.locks ?? [])]),
        ...(missed.length > 0 && { incomplete: missed.join('; ') }),
      };
    },
  };
}
