// Small DOM helpers for the console. Every text from the server goes in as text (textContent,
// attribute values), never as HTML: event bodies, endpoints and errors come from outside.

/**
 * Makes an element: `h('a', { href: '#/x', class: 'link' }, 'text', child)`. Attributes whose
 * value is false, null or undefined are left out; `true` sets an empty one; `on<event>` adds a
 * listener. Children may be strings, numbers, nodes, arrays of them, or null (skipped).
 */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === false || value === null || value === undefined) continue;
    if (name.startsWith('on') && typeof value === 'function') element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? '' : String(value));
  }
  append(element, children);
  return element;
}

function append(parent, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(parent, child);
    else parent.append(child instanceof Node ? child : String(child));
  }
}

/** Replaces the children of `element`. */
export function replace(element, ...children) {
  element.replaceChildren();
  append(element, children);
  return element;
}

const timeFormat = new Intl.DateTimeFormat(undefined, {
  year: 'numeric',
  month: 'short',
  day: 'numeric',
  hour: '2-digit',
  minute: '2-digit',
  second: '2-digit',
});

/** An ISO time as a <time> element in the reader's time zone, the exact UTC time as its title. */
export function time(iso) {
  if (!iso) return h('span', { class: 'muted' }, '—');
  return h('time', { datetime: iso, title: iso }, timeFormat.format(new Date(iso)));
}

/** `2026-11-23T10:00:00.000Z` → the value of an <input type="datetime-local"> in local time. */
export function toLocalInput(iso) {
  if (!iso) return '';
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return '';
  const local = new Date(at.getTime() - at.getTimezoneOffset() * 60_000);
  return local.toISOString().slice(0, 16);
}

/** An <input type="datetime-local"> value (local time) → ISO 8601 UTC, or '' when empty or invalid. */
export function fromLocalInput(value) {
  if (!value) return '';
  const at = new Date(value);
  return Number.isNaN(at.getTime()) ? '' : at.toISOString();
}

const REASONS = {
  200: 'OK',
  201: 'Created',
  202: 'Accepted',
  204: 'No Content',
  400: 'Bad Request',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'Not Found',
  408: 'Request Timeout',
  409: 'Conflict',
  410: 'Gone',
  413: 'Payload Too Large',
  422: 'Unprocessable Content',
  429: 'Too Many Requests',
  500: 'Internal Server Error',
  502: 'Bad Gateway',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
};

/** What an attempt came to, in words: `HTTP 503 Service Unavailable`, the error text, or `—`. */
export function outcome(status, error) {
  if (status !== null && status !== undefined) {
    const reason = REASONS[status];
    return `HTTP ${status}${reason ? ` ${reason}` : ''}`;
  }
  return error || '—';
}

/** A number with the reader's separators: 12,345. */
export function count(n) {
  return new Intl.NumberFormat().format(n);
}

/** `1 event`, `2 events`. */
export function plural(n, word) {
  return `${count(n)} ${word}${n === 1 ? '' : 's'}`;
}

/** Empties the live region (a new view: what it said was about the last one). */
export function clearNotice() {
  clearTimeout(notify.timer);
  const notice = document.getElementById('notice');
  notice.textContent = '';
  notice.className = 'notice';
}

/** Says `text` in the page's live region (screen readers announce it) for a while. */
export function notify(text, kind = 'info') {
  const notice = document.getElementById('notice');
  notice.className = `notice ${kind}`;
  notice.textContent = text;
  clearTimeout(notify.timer);
  notify.timer = setTimeout(() => {
    notice.textContent = '';
    notice.className = 'notice';
  }, 8000);
}
