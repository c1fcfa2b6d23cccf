// Deliveries: the events table with status tabs, filters, paging by key, auto-refresh, and
// "Retry all matching" (the count stated before anything is sent).
import { admin, ApiError, query } from './api.js';
import { count, fromLocalInput, h, notify, outcome, plural, replace, time, toLocalInput } from './dom.js';
import { queueCounts } from './status.js';

/** The schema's webhookActions (src/config/sections/webhooks.ts); test/e2e/console-security.test.ts compares them. */
export const ACTIONS = ['system-event', 'message', 'agent'];
const TABS = [
  ['', 'All'],
  ['queued', 'Queued'],
  ['delivered', 'Delivered'],
  ['dead', 'Dead'],
];
const FILTER_FIELDS = ['status', 'endpoint', 'action', 'since', 'until', 'q'];
const PAGE = 50;
const REFRESH_MS = 5000;
/** "Retry all matching" counts the matching events page by page, up to this many. */
const COUNT_LIMIT = 5000;
const AUTO_REFRESH_KEY = 'gatehouse-console.autoRefresh';

/** The list's filter from the route's query: only known fields, only non-empty values. */
function filterOf(params) {
  const filter = {};
  for (const name of FILTER_FIELDS) if (params.get(name)) filter[name] = params.get(name);
  return filter;
}

/** The address of a list: `#/deliveries?status=dead&cursor=…`. */
export function listHash(filter, cursor) {
  return `#/deliveries${query({ ...filter, cursor })}`;
}

/** Remembered so an event's page can link back to the list it was opened from. */
export let lastListHash = '#/deliveries';

export function deliveriesView(main, params) {
  const filter = filterOf(params);
  const cursor = params.get('cursor') || undefined;
  lastListHash = listHash(filter, cursor);
  let stopped = false;
  let timer;
  let shown = '';

  const tabs = h(
    'ul',
    { class: 'tabs' },
    TABS.map(([status, label]) =>
      h(
        'li',
        {},
        h(
          'a',
          {
            href: listHash({ ...filter, status: status || undefined }),
            'aria-current': (filter.status ?? '') === status ? 'page' : null,
            'data-status': status || 'all',
          },
          label,
          status === 'queued' || status === 'dead' ? h('span', { class: 'count', 'data-count': status }) : null,
        ),
      ),
    ),
  );

  const form = filtersForm(filter);
  const autoRefresh = h('input', {
    type: 'checkbox',
    id: 'auto-refresh',
    checked: sessionStorage.getItem(AUTO_REFRESH_KEY) === '1',
  });
  const retryAll = h('button', { type: 'button', class: 'primary' }, 'Retry all matching');
  const refresh = h('button', { type: 'button' }, 'Refresh');
  const summary = h('p', { class: 'summary', id: 'list-summary' });
  const lastRetry = h('p', { class: 'last-retry', role: 'status' });
  const body = h('tbody');
  const table = h(
    'table',
    { class: 'events', 'aria-describedby': 'list-summary' },
    h('caption', { class: 'visually-hidden' }, 'Events, newest first'),
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        ['Received', 'Event', 'Endpoint', 'Action', 'Status', 'Attempts', 'Last attempt'].map((name) =>
          h('th', { scope: 'col' }, name),
        ),
      ),
    ),
    body,
  );
  const pager = h('nav', { class: 'pager', 'aria-label': 'Pages' });
  const dialog = h('dialog', { class: 'confirm', 'aria-labelledby': 'retry-title' });

  replace(
    main,
    h('h1', { tabindex: '-1' }, filter.status === 'dead' ? 'Dead letters' : 'Deliveries'),
    h('nav', { 'aria-label': 'Delivery status' }, tabs),
    form,
    h(
      'div',
      { class: 'toolbar' },
      h('label', { class: 'toggle', for: 'auto-refresh' }, autoRefresh, ' Auto-refresh (5 s)'),
      refresh,
      retryAll,
    ),
    lastRetry,
    summary,
    h('div', { class: 'table-wrap' }, table),
    pager,
    dialog,
  );

  async function load() {
    clearTimeout(timer);
    try {
      const [page, counts] = await Promise.all([
        admin(`events${query({ ...filter, limit: PAGE, cursor })}`),
        Object.keys(filter).some((name) => name !== 'status') ? undefined : queueCounts(),
      ]);
      if (stopped) return;
      showPage(page);
      showCounts(counts);
    } catch (err) {
      if (stopped) return;
      if (err instanceof ApiError && err.status === 401) return;
      summary.textContent = `The events could not be read: ${err.message}`;
      summary.classList.add('error');
    }
    schedule();
  }

  function schedule() {
    clearTimeout(timer);
    if (!stopped && autoRefresh.checked) timer = setTimeout(load, REFRESH_MS);
  }

  function showPage(page) {
    summary.classList.remove('error');
    const what = filter.status ? `${filter.status} events` : 'events';
    summary.textContent =
      page.events.length === 0
        ? `No ${what} match.`
        : `${plural(page.events.length, cursor ? 'older event' : 'event')} shown, newest first` +
          (page.nextCursor ? '; older ones on the next page.' : '.');
    // Redrawn only when something changed: a refresh leaves focus and selection where they were.
    const fingerprint = JSON.stringify(page);
    if (fingerprint !== shown) {
      shown = fingerprint;
      replace(body, page.events.map(row));
    }
    replace(
      pager,
      cursor ? h('a', { class: 'button', href: listHash(filter) }, 'Newest') : null,
      page.nextCursor ? h('a', { class: 'button', href: listHash(filter, page.nextCursor) }, 'Older') : null,
    );
  }

  // Queued and dead only: they are counted at each call. The store recounts delivered events once a
  // minute (as /metrics shows them), which beside a list that just changed would read as wrong.
  function showCounts(counts) {
    for (const span of tabs.querySelectorAll('[data-count]')) {
      const n = counts?.[span.dataset.count];
      span.textContent = n === undefined ? '' : ` ${count(n)}`;
    }
  }

  refresh.addEventListener('click', load);
  autoRefresh.addEventListener('change', () => {
    sessionStorage.setItem(AUTO_REFRESH_KEY, autoRefresh.checked ? '1' : '0');
    if (autoRefresh.checked) void load();
    else clearTimeout(timer);
  });
  retryAll.addEventListener('click', () => retryMatching(filter, retryAll, dialog, lastRetry, load));

  void load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

function row(event) {
  return h(
    'tr',
    {},
    h('td', { 'data-label': 'Received' }, time(event.receivedAt)),
    h(
      'td',
      { 'data-label': 'Event' },
      h('a', { href: `#/events/${encodeURIComponent(event.id)}`, class: 'mono' }, event.id),
    ),
    h('td', { 'data-label': 'Endpoint', class: 'mono' }, event.endpoint),
    h('td', { 'data-label': 'Action' }, event.action),
    h('td', { 'data-label': 'Status' }, badge(event.status)),
    h('td', { 'data-label': 'Attempts', class: 'number' }, event.attempts),
    h(
      'td',
      { 'data-label': 'Last attempt' },
      event.lastAttemptAt
        ? [h('span', { class: 'outcome' }, outcome(event.lastStatus, event.lastError)), ' ', time(event.lastAttemptAt)]
        : h('span', { class: 'muted' }, 'not yet'),
    ),
  );
}

export function badge(status) {
  return h('span', { class: `badge ${status}` }, status);
}

function filtersForm(filter) {
  const field = (id, label, control) => h('div', { class: 'field' }, h('label', { for: id }, label), control);
  const endpoint = h('input', {
    id: 'filter-endpoint',
    name: 'endpoint',
    placeholder: '/webhook/…',
    value: filter.endpoint ?? '',
    spellcheck: 'false',
  });
  const action = h(
    'select',
    { id: 'filter-action', name: 'action' },
    h('option', { value: '' }, 'Any'),
    ACTIONS.map((a) => h('option', { value: a, selected: filter.action === a }, a)),
  );
  const since = h('input', {
    id: 'filter-since',
    name: 'since',
    type: 'datetime-local',
    value: toLocalInput(filter.since),
  });
  const until = h('input', {
    id: 'filter-until',
    name: 'until',
    type: 'datetime-local',
    value: toLocalInput(filter.until),
  });
  const q = h('input', {
    id: 'filter-q',
    name: 'q',
    type: 'search',
    placeholder: 'event id, delivery id or text',
    value: filter.q ?? '',
    spellcheck: 'false',
  });
  const form = h(
    'form',
    { class: 'filters', role: 'search', 'aria-label': 'Filter events' },
    field('filter-endpoint', 'Endpoint', endpoint),
    field('filter-action', 'Action', action),
    field('filter-since', 'Received since', since),
    field('filter-until', 'Received before', until),
    field('filter-q', 'Search', q),
    h(
      'div',
      { class: 'field buttons' },
      h('button', { type: 'submit' }, 'Apply filters'),
      h('a', { class: 'button quiet', href: listHash({ status: filter.status }) }, 'Clear'),
    ),
  );
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    location.hash = listHash({
      status: filter.status,
      endpoint: endpoint.value.trim(),
      action: action.value,
      since: fromLocalInput(since.value),
      until: fromLocalInput(until.value),
      q: q.value.trim(),
    });
  });
  return form;
}

/**
 * Counts what a filter retry would touch, page by page (up to COUNT_LIMIT), says it in a dialog,
 * and retries only when confirmed. On the Delivered tab the retry sends delivered events again
 * (includeDelivered); elsewhere dead events and queued ones waiting for a retry become due now.
 */
async function retryMatching(filter, button, dialog, lastRetry, reload) {
  button.disabled = true;
  button.textContent = 'Counting…';
  let counted;
  try {
    counted = await countMatching(filter);
  } catch (err) {
    notify(`The matching events could not be counted: ${err.message}`, 'error');
    return;
  } finally {
    button.disabled = false;
    button.textContent = 'Retry all matching';
  }
  const includeDelivered = filter.status === 'delivered';
  const eligible = includeDelivered ? counted.delivered : counted.dead + counted.queued;
  const atLeast = counted.complete ? '' : 'at least ';
  const described = describeFilter(filter);
  const lines = [];
  if (eligible === 0) lines.push(`No event to retry matches ${described}.`);
  else if (includeDelivered)
    lines.push(
      `${atLeast}${plural(eligible, 'delivered event')} match ${described}.`,
      'Each is sent to its target again: the target gets it a second time.',
    );
  else {
    const parts = [];
    if (counted.dead) parts.push(`${count(counted.dead)} dead`);
    if (counted.queued) parts.push(`${count(counted.queued)} queued`);
    lines.push(
      `${atLeast}${plural(eligible, 'event')} (${parts.join(', ')}) match ${described}.`,
      'Dead ones, and queued ones waiting for a retry, become due now with a fresh attempt budget; ' +
        'queued ones already due are left as they are.',
    );
    if (counted.delivered) lines.push(`${plural(counted.delivered, 'delivered event')} match too: not sent again.`);
  }
  if (!counted.complete)
    lines.push(`Counting stopped at ${count(COUNT_LIMIT)} events: every matching event is retried, more than counted.`);
  lines.push('The count is of just now; the answer says how many were requeued.');

  const confirm = h(
    'button',
    { type: 'submit', value: 'confirm', class: 'primary' },
    `Retry ${atLeast}${plural(eligible, 'event')}`,
  );
  const cancel = h('button', { type: 'submit', value: 'cancel', autofocus: true }, 'Cancel');
  replace(
    dialog,
    h('h2', { id: 'retry-title' }, 'Retry all matching?'),
    lines.map((line) => h('p', {}, line)),
    h('form', { method: 'dialog', class: 'dialog-buttons' }, cancel, eligible > 0 ? confirm : null),
  );
  dialog.returnValue = '';
  dialog.showModal();
  const choice = await new Promise((resolve) =>
    dialog.addEventListener('close', () => resolve(dialog.returnValue), { once: true }),
  );
  if (choice !== 'confirm') return;
  try {
    const answer = await admin('events/retry', {
      method: 'POST',
      body: { filter, ...(includeDelivered && { includeDelivered: true }) },
      headers: { 'idempotency-key': crypto.randomUUID() },
    });
    const text = `Requeued ${plural(answer.requeued, 'event')}.`;
    lastRetry.textContent = `${text} (retry all matching ${described}, ${new Date().toLocaleTimeString()})`;
    notify(text, 'ok');
  } catch (err) {
    notify(`The retry failed: ${err.message}`, 'error');
  }
  await reload();
}

/** How many events match, by status, reading pages of 200 until the end or COUNT_LIMIT. */
async function countMatching(filter) {
  const counted = { dead: 0, queued: 0, delivered: 0, complete: true };
  let cursor;
  let seen = 0;
  do {
    const page = await admin(`events${query({ ...filter, limit: 200, cursor })}`);
    for (const event of page.events) counted[event.status]++;
    seen += page.events.length;
    cursor = page.nextCursor;
    if (cursor && seen >= COUNT_LIMIT) counted.complete = false;
  } while (cursor && counted.complete);
  return counted;
}

/** A filter in words, for the dialog: `endpoint /webhook/x, status dead`, or `every event`. */
function describeFilter(filter) {
  const parts = Object.entries(filter).map(([name, value]) => `${name} ${value}`);
  return parts.length === 0 ? 'no filter (every event)' : `the filter ${parts.join(', ')}`;
}
