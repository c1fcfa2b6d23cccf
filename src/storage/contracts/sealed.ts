/**
 * A stored secret sealed again under the current GATEHOUSE_SECRET_KEY (`gatehouse storage
 * reseal`, src/cli/storage.ts): `key` is the account or channel it belongs to, and the row is
 * changed only while it still holds `from` (a running server may have sealed it anew meanwhile).
 */
export interface SealedChange {
  key: string;
  from: string;
  to: string;
}
