// Keys: the configured API keys, read-only (never a key or its hash: the route does not have them).
import { admin, ApiError, query } from './api.js';
import { h, replace, time } from './dom.js';

export function keysView(main) {
  let stopped = false;
  let cursor;
  const body = h('tbody');
  const summary = h('p', { class: 'summary', id: 'keys-summary' }, 'Loading…');
  const more = h('button', { type: 'button', hidden: true }, 'More keys');
  replace(
    main,
    h('h1', { tabindex: '-1' }, 'API keys'),
    h(
      'p',
      { class: 'muted' },
      'The keys gateway.auth accepts on /api/, by id. Read-only: keys are added and revoked in the configuration ' +
        '(then a reload).',
    ),
    summary,
    h(
      'div',
      { class: 'table-wrap' },
      h(
        'table',
        { class: 'cards-on-phone', 'aria-describedby': 'keys-summary' },
        h('caption', { class: 'visually-hidden' }, 'API keys'),
        h(
          'thead',
          {},
          h(
            'tr',
            {},
            ['Id', 'Subject', 'Scopes', 'Expires', 'Rate limit', 'Configured as'].map((name) =>
              h('th', { scope: 'col' }, name),
            ),
          ),
        ),
        body,
      ),
    ),
    h('div', { class: 'pager' }, more),
  );

  async function load() {
    try {
      const answer = await admin(`keys${query({ cursor })}`);
      if (stopped) return;
      body.append(...answer.keys.map(row));
      const shown = body.rows.length;
      summary.textContent =
        answer.total === 0
          ? 'No API key is configured.'
          : `${answer.total} key${answer.total === 1 ? '' : 's'}` +
            (shown < answer.total ? `, the first ${shown} shown.` : '.');
      cursor = answer.nextCursor ?? undefined;
      more.hidden = cursor === undefined;
    } catch (err) {
      if (stopped || (err instanceof ApiError && err.status === 401)) return;
      summary.textContent = `The keys could not be read: ${err.message}`;
    }
  }

  more.addEventListener('click', load);
  void load();
  return () => {
    stopped = true;
  };
}

function row(key) {
  return h(
    'tr',
    {},
    h('td', { 'data-label': 'Id', class: 'mono' }, key.id),
    h('td', { 'data-label': 'Subject', class: 'mono' }, key.subject),
    h(
      'td',
      { 'data-label': 'Scopes' },
      key.scopes.length ? key.scopes.join(' ') : h('span', { class: 'muted' }, 'none'),
    ),
    h(
      'td',
      { 'data-label': 'Expires' },
      key.expiresAt
        ? [time(key.expiresAt), key.expired ? h('span', { class: 'badge dead' }, 'expired') : null]
        : 'never',
    ),
    h(
      'td',
      { 'data-label': 'Rate limit' },
      key.rateLimit
        ? `${key.rateLimit.requests} per ${key.rateLimit.perSeconds} s`
        : h('span', { class: 'muted' }, '—'),
    ),
    h('td', { 'data-label': 'Configured as', class: 'mono' }, key.source),
  );
}
