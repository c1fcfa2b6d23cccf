// One event: its facts, the attempt timeline (status, error, duration, the start of the target's
// answer), the envelope as the target gets it, the headers it came with, and Retry (or, once delivered, Send again, after a confirmation).
import { admin, ApiError } from './api.js';
import { badge, lastListHash } from './deliveries.js';
import { h, notify, outcome, replace, time } from './dom.js';

/** While the event is queued (just retried), its page is read again this often. */
const WATCH_MS = 2000;

export function eventView(main, id) {
  let stopped = false;
  let timer;
  let shown = '';
  const heading = h('h1', { tabindex: '-1' }, 'Event ', h('span', { class: 'mono' }, id));
  const content = h('div', { class: 'event' }, h('p', { class: 'muted' }, 'Loading…'));
  const dialog = h('dialog', { class: 'confirm', 'aria-labelledby': 'resend-title' });
  replace(main, h('p', {}, h('a', { href: lastListHash }, '← Back to the list')), heading, content, dialog);

  async function load() {
    clearTimeout(timer);
    let event;
    try {
      event = await admin(`events/${encodeURIComponent(id)}`);
    } catch (err) {
      if (stopped || (err instanceof ApiError && err.status === 401)) return;
      replace(
        content,
        h('p', { class: 'error' }, err.code === 'event_not_found' ? 'No such event.' : `Not read: ${err.message}`),
      );
      return;
    }
    if (stopped) return;
    const fingerprint = JSON.stringify(event);
    if (fingerprint !== shown) {
      shown = fingerprint;
      render(event);
    }
    if (event.status === 'queued') timer = setTimeout(load, WATCH_MS);
  }

  function render(event) {
    const retry = h(
      'button',
      { type: 'button', class: 'primary' },
      event.status === 'delivered' ? 'Send again' : 'Retry this event',
    );
    retry.addEventListener('click', () => retryOne(event, retry));
    replace(
      content,
      h(
        'dl',
        { class: 'facts' },
        fact('Status', badge(event.status)),
        fact('Endpoint', h('span', { class: 'mono' }, event.endpoint)),
        fact('Action', event.action),
        fact('Received', time(event.receivedAt)),
        fact('Attempts', String(event.attempts.length)),
        event.deliveryId ? fact("Sender's delivery id", h('span', { class: 'mono' }, event.deliveryId)) : null,
        event.nextAttemptAt ? fact('Next attempt', time(event.nextAttemptAt)) : null,
        event.deliveredAt ? fact('Delivered', time(event.deliveredAt)) : null,
      ),
      h('div', { class: 'actions' }, event.status === 'queued' ? null : retry),
      h('h2', {}, 'Attempts'),
      event.attempts.length === 0
        ? h('p', { class: 'muted' }, 'No attempt yet.')
        : h('ol', { class: 'timeline' }, event.attempts.map(attempt)),
      h('h2', {}, 'Envelope'),
      h('p', { class: 'muted' }, 'The JSON the target is sent.'),
      h(
        'pre',
        { class: 'json', tabindex: '0', 'aria-label': 'Envelope (JSON)' },
        JSON.stringify(event.envelope, null, 2),
      ),
      h('h2', {}, 'Headers'),
      headersTable(event.headers),
    );
  }

  async function retryOne(event, button) {
    const includeDelivered = event.status === 'delivered';
    if (includeDelivered && !(await confirmResend())) return;
    button.disabled = true;
    try {
      const answer = await admin('events/retry', {
        method: 'POST',
        body: { ids: [event.id], ...(includeDelivered && { includeDelivered: true }) },
        headers: { 'idempotency-key': crypto.randomUUID() },
      });
      notify(
        answer.requeued === 1 ? 'Requeued: it is sent again now.' : 'Not requeued: it is already due.',
        answer.requeued === 1 ? 'ok' : 'info',
      );
    } catch (err) {
      notify(`The retry failed: ${err.message}`, 'error');
    }
    button.disabled = false;
    await load();
  }

  function confirmResend() {
    replace(
      dialog,
      h('h2', { id: 'resend-title' }, 'Send this event again?'),
      h('p', {}, 'It was delivered: its target gets it a second time.'),
      h(
        'form',
        { method: 'dialog', class: 'dialog-buttons' },
        h('button', { type: 'submit', value: 'cancel', autofocus: true }, 'Cancel'),
        h('button', { type: 'submit', value: 'confirm', class: 'primary' }, 'Send again'),
      ),
    );
    dialog.returnValue = '';
    dialog.showModal();
    return new Promise((resolve) =>
      dialog.addEventListener('close', () => resolve(dialog.returnValue === 'confirm'), { once: true }),
    );
  }

  void load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

function fact(term, value) {
  return [h('dt', {}, term), h('dd', {}, value)];
}

function attempt(a) {
  const ok = a.status !== null && a.status >= 200 && a.status < 300;
  return h(
    'li',
    { class: ok ? 'ok' : 'failed' },
    h(
      'p',
      { class: 'attempt-head' },
      h('strong', {}, `Attempt ${a.attempt}`),
      ' ',
      time(a.at),
      ' ',
      h('span', { class: 'duration' }, `${a.durationMs} ms`),
    ),
    h('p', { class: `outcome ${ok ? 'ok' : 'failed'}` }, outcome(a.status, a.error)),
    a.status !== null && a.error ? h('p', { class: 'error' }, a.error) : null,
    a.responseSnippet === null || a.responseSnippet === undefined
      ? null
      : h(
          'pre',
          { class: 'snippet', tabindex: '0', 'aria-label': `Answer of attempt ${a.attempt} (first 512 bytes)` },
          a.responseSnippet,
        ),
  );
}

/** The received headers, as stored: values that may be credentials show as [redacted]. */
function headersTable(headers) {
  if (!headers) return h('p', { class: 'muted' }, 'Not recorded: this event was stored before headers were kept.');
  return [
    h(
      'p',
      { class: 'muted' },
      'As received; only the values of standard and event headers are kept, the rest show as [redacted].',
    ),
    h(
      'table',
      { class: 'headers', 'aria-label': 'Received headers' },
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Name'), h('th', { scope: 'col' }, 'Value'))),
      h(
        'tbody',
        {},
        Object.entries(headers).map(([name, value]) =>
          h(
            'tr',
            {},
            h('th', { scope: 'row', class: 'mono' }, name),
            h(
              'td',
              { class: value === '[redacted]' ? 'mono muted' : 'mono' },
              Array.isArray(value) ? value.join('\n') : value,
            ),
          ),
        ),
      ),
    ),
  ];
}
