import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  clearedSessionCookie,
  ConsoleSessions,
  csrfTokenMatches,
  SESSION_ABSOLUTE_MS,
  SESSION_IDLE_MS,
  sessionCookie,
  sessionCookieOf,
} from '../../src/admin/console/session.js';

// The console's sessions without a server: the expiries (two hours idle, twelve in all) on a
// clock the test moves, the bound on how many are kept, and the cookie's parsing. The e2e tests
// (test/e2e/console-security.test.ts) cover them through the admin listener.

function clock(start = 1_800_000_000_000) {
  let at = start;
  return { now: () => at, advance: (ms: number) => (at += ms) };
}

describe('console sessions', () => {
  it('a session used within the idle time lives until twelve hours after sign-in, not a moment more', () => {
    const time = clock();
    const sessions = new ConsoleSessions(time.now);
    const { id } = sessions.create();
    const hour = 3_600_000;
    assert.ok(SESSION_IDLE_MS > hour);
    for (let h = 1; h < SESSION_ABSOLUTE_MS / hour; h++) {
      time.advance(hour);
      assert.ok(sessions.use(id), `alive after ${h} h`);
    }
    time.advance(hour - 1);
    assert.ok(sessions.use(id), 'alive a moment before twelve hours');
    time.advance(1);
    assert.equal(sessions.use(id), undefined, 'ended at twelve hours however busy');
  });

  it('a session idle for two hours ends; one used a moment before does not', () => {
    const time = clock();
    const sessions = new ConsoleSessions(time.now);
    const idle = sessions.create();
    const busy = sessions.create();
    time.advance(SESSION_IDLE_MS - 1);
    assert.ok(sessions.use(busy.id));
    time.advance(1);
    assert.equal(sessions.use(idle.id), undefined);
    assert.ok(sessions.use(busy.id));
  });

  it('sign-out and endAll end sessions; ids are not guessable from each other or from the label', () => {
    const sessions = new ConsoleSessions();
    const a = sessions.create();
    const b = sessions.create();
    assert.notEqual(a.id, b.id);
    assert.notEqual(a.session.csrfToken, b.session.csrfToken);
    assert.ok(!a.id.startsWith(a.session.label) && !a.session.csrfToken.includes(a.session.label));
    assert.equal(sessions.end(a.id), true);
    assert.equal(sessions.use(a.id), undefined);
    assert.equal(sessions.end(a.id), false);
    assert.equal(sessions.endAll(), 1);
    assert.equal(sessions.use(b.id), undefined);
  });

  it('keeps at most 100: a sign-in past that ends the least recently used', () => {
    const sessions = new ConsoleSessions();
    const first = sessions.create();
    const second = sessions.create();
    for (let i = 0; i < 98; i++) sessions.create();
    assert.ok(sessions.use(first.id), 'used: now the most recent');
    sessions.create();
    assert.equal(sessions.size, 100);
    assert.equal(sessions.use(second.id), undefined, 'the least recently used went');
    assert.ok(sessions.use(first.id));
  });

  it('compares CSRF tokens whole; a malformed or missing one never matches', () => {
    const { session } = new ConsoleSessions().create();
    assert.equal(csrfTokenMatches(session, session.csrfToken), true);
    for (const given of [undefined, '', session.csrfToken.slice(1), `${session.csrfToken}x`, 'A'.repeat(43)])
      assert.equal(csrfTokenMatches(session, given), false, String(given));
  });

  it('reads the session cookie only when it is there exactly once', () => {
    assert.equal(sessionCookieOf('a=1; gatehouse_console=abc; b=2'), 'abc');
    assert.equal(sessionCookieOf('gatehouse_console=abc; gatehouse_console=def'), undefined);
    assert.equal(sessionCookieOf('other=1'), undefined);
    assert.equal(sessionCookieOf(undefined), undefined);
    assert.equal(sessionCookieOf('xgatehouse_console=abc'), undefined);
    assert.equal(
      sessionCookie('abc', false),
      'gatehouse_console=abc; Path=/; Max-Age=43200; HttpOnly; SameSite=Strict',
    );
    assert.match(sessionCookie('abc', true), /; Secure$/);
    assert.match(clearedSessionCookie(false), /^gatehouse_console=; Path=\/; Max-Age=0;/);
  });
});
