// Status: what GET /admin/api/status answers (the process, listeners, store and queue, Gmail,
// channels, lockouts), a card a part; and the queue counts the Deliveries tabs show.
import { admin, ApiError } from './api.js';
import { count, h, replace, time } from './dom.js';

const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}/;

/**
 * Queued and dead events in the whole store ({queued, dead}), counted now as /metrics counts them;
 * undefined when the store cannot say.
 */
export async function queueCounts() {
  let status;
  try {
    status = await admin('status');
  } catch {
    return undefined;
  }
  const queue = status.store?.available ? status.store.queue : undefined;
  return queue && { queued: queue.queued, dead: queue.dead };
}

export function statusView(main) {
  let stopped = false;
  const content = h('div', { class: 'cards' }, h('p', { class: 'muted' }, 'Loading…'));
  const refresh = h('button', { type: 'button' }, 'Refresh');
  replace(main, h('h1', { tabindex: '-1' }, 'Status'), h('div', { class: 'toolbar' }, refresh), content);

  async function load() {
    try {
      const status = await admin('status');
      if (!stopped) replace(content, cards(status));
    } catch (err) {
      if (stopped || (err instanceof ApiError && err.status === 401)) return;
      replace(content, h('p', { class: 'error' }, `The status could not be read: ${err.message}`));
    }
  }
  refresh.addEventListener('click', load);
  void load();
  return () => {
    stopped = true;
  };
}

function cards(status) {
  const { store, gmail, channels, lockouts } = status;
  return [
    card('Gatehouse', {
      version: status.version,
      node: status.node,
      pid: status.pid,
      'started at': status.startedAt,
      uptime: duration(status.uptimeSeconds),
      'gateway workers': status.gatewayWorkers,
    }),
    card('Listeners', status.listeners),
    card(
      'Store',
      store === null
        ? 'No event store: webhooks are off.'
        : partOf(store, ({ driver, location, schemaVersion, queue }) => ({
            driver,
            location,
            'schema version': schemaVersion,
            queued: queue.queued,
            dead: queue.dead,
            delivered: queue.delivered ?? 'being counted',
            'oldest due since': queue.oldestDueAt,
          })),
    ),
    card(
      'Gmail',
      gmail === null
        ? 'Not configured.'
        : partOf(gmail, ({ account, mode, state }) =>
            state === null
              ? { account, mode, state: 'never set up' }
              : {
                  account,
                  mode,
                  'watch active': state.watchActive,
                  'watch expires': state.watchExpiration,
                  'last notification': state.lastNotificationAt,
                  'last error': state.lastError,
                  'last error at': state.lastErrorAt,
                },
          ),
    ),
    card(
      'Channels',
      partOf(channels, ({ list }) =>
        list.length === 0
          ? 'None configured.'
          : Object.fromEntries(
              list.map((c) => [
                `${c.name} (${c.platform})`,
                c.connected ? `connected${c.lastError ? `; last error: ${c.lastError}` : ''}` : 'not connected',
              ]),
            ),
      ),
    ),
    card(
      'Lockouts',
      partOf(lockouts, ({ active }) => ({ 'clients locked out': active })),
    ),
  ];
}

/** A part read from a store: its fields, or why it could not be read. */
function partOf(part, fields) {
  return part.available ? fields(part) : { error: `not available: ${part.error}` };
}

function card(title, fields) {
  const id = `status-${title.toLowerCase()}`;
  return h(
    'section',
    { class: 'card', 'aria-labelledby': id },
    h('h2', { id }, title),
    typeof fields === 'string'
      ? h('p', { class: 'muted' }, fields)
      : h(
          'dl',
          { class: 'facts' },
          Object.entries(fields).map(([name, value]) => [
            h('dt', {}, name),
            h('dd', { class: name === 'error' ? 'error' : null }, shown(value)),
          ]),
        ),
  );
}

function shown(value) {
  if (value === null || value === undefined) return h('span', { class: 'muted' }, '—');
  if (typeof value === 'string' && ISO.test(value)) return time(value);
  if (typeof value === 'number') return count(value);
  if (typeof value === 'boolean') return value ? 'yes' : 'no';
  if (typeof value === 'object') return JSON.stringify(value);
  return String(value);
}

function duration(seconds) {
  const d = Math.floor(seconds / 86400);
  const hours = Math.floor((seconds % 86400) / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  return d > 0 ? `${d} d ${hours} h` : hours > 0 ? `${hours} h ${m} min` : `${m} min ${seconds % 60} s`;
}
