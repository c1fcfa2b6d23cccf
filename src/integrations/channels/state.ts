/**
 * Channel state, as the channels import it: the contract lives in src/storage/contracts/channels.ts, one
 * driver per engine under src/storage/ (opened by openChannelStore in src/storage/open.ts).
 */
export type {
  ChannelGrant,
  ChannelStore,
  Device,
  OutboxMessage,
  PairingOutcome,
} from '../../storage/contracts/channels.js';
