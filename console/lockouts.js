// Lockouts: the clients refused for too many bad credentials, until when, and Lift.
import { admin, ApiError } from './api.js';
import { h, notify, replace, time } from './dom.js';

export function lockoutsView(main) {
  let stopped = false;
  const body = h('tbody');
  const summary = h('p', { class: 'summary', id: 'lockouts-summary' }, 'Loading…');
  const refresh = h('button', { type: 'button' }, 'Refresh');
  const heading = h('h1', { tabindex: '-1' }, 'Lockouts');
  replace(
    main,
    heading,
    h(
      'p',
      { class: 'muted' },
      'Clients refused (429 too_many_failures) after too many bad credentials: on /api/ (gateway) or on a ' +
        "webhook endpoint's secret (webhooks). Lifting a client lifts both and forgets its failures.",
    ),
    h('div', { class: 'toolbar' }, refresh),
    summary,
    h(
      'div',
      { class: 'table-wrap' },
      h(
        'table',
        { class: 'cards-on-phone', 'aria-describedby': 'lockouts-summary' },
        h('caption', { class: 'visually-hidden' }, 'Locked-out clients'),
        h(
          'thead',
          {},
          h(
            'tr',
            {},
            h('th', { scope: 'col' }, 'Client'),
            h('th', { scope: 'col' }, 'Where'),
            h('th', { scope: 'col' }, 'Locked until'),
            h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, 'Actions')),
          ),
        ),
        body,
      ),
    ),
  );

  async function load() {
    try {
      const answer = await admin('lockouts');
      if (stopped) return;
      const clients = byClient(answer.lockouts);
      summary.textContent =
        clients.length === 0
          ? 'No client is locked out.'
          : `${clients.length} client${clients.length === 1 ? '' : 's'} locked out` +
            (answer.total > answer.lockouts.length ? ` (the ${answer.lockouts.length} latest locks shown).` : '.');
      replace(body, clients.map(row));
    } catch (err) {
      if (stopped || (err instanceof ApiError && err.status === 401)) return;
      summary.textContent = `The lockouts could not be read: ${err.message}`;
    }
  }

  async function lift(client, button) {
    button.disabled = true;
    try {
      await admin(`lockouts/${encodeURIComponent(client)}`, { method: 'DELETE' });
      notify(`Lifted the lockout of ${client}.`, 'ok');
    } catch (err) {
      if (err.code === 'lockout_not_found') notify(`${client} was no longer locked out.`, 'info');
      else notify(`Not lifted everywhere: ${err.message}`, 'error');
    }
    await load();
    heading.focus();
  }

  function row({ client, areas, until }) {
    const button = h('button', { type: 'button', 'aria-label': `Lift the lockout of ${client}` }, 'Lift');
    button.addEventListener('click', () => lift(client, button));
    return h(
      'tr',
      {},
      h('td', { 'data-label': 'Client', class: 'mono' }, client),
      h('td', { 'data-label': 'Where' }, areas.join(', ')),
      h('td', { 'data-label': 'Locked until' }, time(until)),
      h('td', { 'data-label': 'Actions' }, button),
    );
  }

  refresh.addEventListener('click', load);
  void load();
  return () => {
    stopped = true;
  };
}

/** One row a client: a client locked on both listeners is lifted with one click. */
function byClient(lockouts) {
  const clients = new Map();
  for (const { client, area, until } of lockouts) {
    const seen = clients.get(client);
    if (!seen) clients.set(client, { client, areas: [area], until });
    else {
      seen.areas.push(area);
      if (until > seen.until) seen.until = until;
    }
  }
  return [...clients.values()];
}
