/**
 * The webhook event store, as the receiver, the deliverer and the integrations import it: the
 * contract lives in src/storage/contracts/events.ts, one driver per engine under src/storage/.
 */
export * from '../storage/contracts/events.js';
export { SqliteEventStore } from '../storage/sqlite/events.js';
