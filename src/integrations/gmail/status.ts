import type { GmailAccountState } from './state.js';

/** An account's state as `webhooks gmail status` and the admin API's status show it. */
export type GmailStatus = Omit<GmailAccountState, 'sealedGrant'> & {
  /** The watch has not expired: Gmail still sends notifications. */
  watchActive: boolean;
};

/** The state without its sealed grant (never shown), and whether the watch is in force at `now`. */
export function describeGmailAccount(state: GmailAccountState, now: number): GmailStatus {
  const { sealedGrant: _sealed, ...visible } = state;
  return { ...visible, watchActive: state.watchExpiration !== null && state.watchExpiration > now };
}
