/**
 * Gmail state, as the integration imports it: the contract lives in src/storage/contracts/gmail.ts, one
 * driver per engine under src/storage/ (opened by openGmailStore in src/storage/open.ts).
 */
export { historyIdAfter, type GmailAccountState, type GmailStore } from '../../storage/contracts/gmail.js';
