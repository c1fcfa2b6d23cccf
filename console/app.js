// The console's entry: the sign-in, the section links, and a router over the location's hash
// (`#/deliveries?status=dead`, `#/events/<id>`, `#/lockouts`, …), so every view has an address,
// Back works, and the server serves one page.
import { ApiError, currentSession, signIn, signOut, whenSignedOut } from './api.js';
import { clearNotice, h, notify, replace } from './dom.js';
import { deliveriesView } from './deliveries.js';
import { eventView } from './event.js';
import { keysView } from './keys.js';
import { lockoutsView } from './lockouts.js';
import { statusView } from './status.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const signOutButton = document.getElementById('sign-out');
let signedIn = false;
/** What the current view returned to stop it (timers, pending work) before the next one. */
let dispose;

const VIEWS = {
  deliveries: (params) => deliveriesView(main, params),
  events: (params, id) => eventView(main, id),
  lockouts: () => lockoutsView(main),
  keys: () => keysView(main),
  status: () => statusView(main),
};

/** The hash as a route: the view's name, what follows it (an event id), and the query. */
function route() {
  const hash = location.hash.startsWith('#/') ? location.hash.slice(2) : 'deliveries';
  const at = hash.indexOf('?');
  const path = at === -1 ? hash : hash.slice(0, at);
  const params = new URLSearchParams(at === -1 ? '' : hash.slice(at + 1));
  const slash = path.indexOf('/');
  const name = slash === -1 ? path : path.slice(0, slash);
  const rest = slash === -1 ? '' : decodeURIComponent(path.slice(slash + 1));
  return VIEWS[name] ? { name, rest, params } : { name: 'deliveries', rest: '', params: new URLSearchParams() };
}

function markSection({ name, params }) {
  const section = name === 'deliveries' && params.get('status') === 'dead' ? 'dead' : name === 'events' ? '' : name;
  for (const link of nav.querySelectorAll('a')) {
    if (link.dataset.section === section) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
}

function show(moveFocus) {
  dispose?.();
  dispose = undefined;
  if (!signedIn) return;
  const current = route();
  markSection(current);
  dispose = VIEWS[current.name](current.params, current.rest);
  // A new view: its heading takes the focus, so a keyboard or screen reader starts there.
  if (moveFocus) {
    clearNotice();
    main.querySelector('h1')?.focus();
  }
}

function showSignIn(why) {
  dispose?.();
  dispose = undefined;
  signedIn = false;
  nav.hidden = true;
  signOutButton.hidden = true;
  const error = h('p', { id: 'sign-in-error', class: 'error', role: 'alert' }, why ?? '');
  const input = h('input', {
    id: 'token',
    name: 'token',
    type: 'password',
    autocomplete: 'current-password',
    spellcheck: 'false',
    required: true,
    'aria-describedby': 'sign-in-help sign-in-error',
  });
  const button = h('button', { type: 'submit', class: 'primary' }, 'Sign in');
  const form = h(
    'form',
    { class: 'sign-in', 'aria-labelledby': 'sign-in-title' },
    h('h1', { id: 'sign-in-title', tabindex: '-1' }, 'Sign in'),
    h(
      'p',
      { id: 'sign-in-help' },
      'Sign in with the admin token of this gatehouse (admin.token). A session ends when you sign out, after ' +
        'two idle hours or twelve in all, and when the token changes.',
    ),
    h('label', { for: 'token' }, 'Admin token'),
    input,
    button,
    error,
  );
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    button.disabled = true;
    error.textContent = '';
    try {
      await signIn(input.value);
      input.value = '';
      enter(true);
    } catch (err) {
      error.textContent =
        err instanceof ApiError && err.status === 401
          ? 'That is not the admin token.'
          : err instanceof ApiError && err.code === 'admin_api_disabled'
            ? 'The console is off: admin.token is not set in the configuration.'
            : err.message;
      button.disabled = false;
      input.focus();
    }
  });
  replace(main, form);
  input.focus();
}

function enter(moveFocus) {
  signedIn = true;
  nav.hidden = false;
  signOutButton.hidden = false;
  show(moveFocus);
}

signOutButton.addEventListener('click', async () => {
  try {
    await signOut();
  } catch (err) {
    notify(`Sign-out failed: ${err.message}`, 'error');
    return;
  }
  showSignIn('Signed out.');
});

whenSignedOut(() => {
  if (signedIn) showSignIn('The session has ended (expired, signed out, or the admin token changed): sign in again.');
});

window.addEventListener('hashchange', () => show(true));

try {
  if (await currentSession()) enter(false);
  else showSignIn();
} catch (err) {
  if (err instanceof ApiError && err.code === 'admin_api_disabled')
    showSignIn('The console is off: admin.token is not set in the configuration.');
  else showSignIn(err.message);
}
