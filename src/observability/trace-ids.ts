import { randomFillSync } from 'node:crypto';

/**
 * W3C trace and span ids, the ratio sampling decision and the `traceparent` of an unsampled
 * request, without the OpenTelemetry SDK: an unsampled /api/ request makes no Span, no context
 * and no attribute map, only the few strings here (issue 31: tracing at ratio 0 must be nearly free).
 */

/**
 * Random bytes drawn 4 KB at a time (one getrandom call per ~170 requests) and turned into hex
 * once: an id is a slice of that string (a Buffer.toString('hex') per id was 5 % of a sampled
 * request's tracing CPU in bench/tracing-spans.ts).
 */
const POOL = Buffer.allocUnsafe(4096);
let poolHex = '';
let used = POOL.length;

function randomHex(bytes: 8 | 16): string {
  if (used + bytes > POOL.length) {
    randomFillSync(POOL);
    poolHex = POOL.toString('hex');
    used = 0;
  }
  const start = used;
  used += bytes;
  // W3C Trace Context: an all-zero id is invalid (as the SDK's RandomIdGenerator, the last byte becomes 1).
  for (let i = start; i < used; i++) if (POOL[i] !== 0) return poolHex.slice(2 * start, 2 * used);
  return `${poolHex.slice(2 * start, 2 * used - 2)}01`;
}

/** A new 32-hex-digit trace id (random, never all zeros). */
export function newTraceId(): string {
  return randomHex(16);
}

/** A new 16-hex-digit span id (random, never all zeros). */
export function newSpanId(): string {
  return randomHex(8);
}

/**
 * The root sampling decision for a trace id, exactly the SDK's TraceIdRatioBasedSampler's (the
 * four 32-bit words of the id XORed, below `ratio × 0xffffffff`): the same trace id gets the same
 * decision here and in the SDK, which decides again for the spans of a sampled trace.
 */
export function ratioSampler(ratio: number): (traceId: string) => boolean {
  const normalized = Number.isNaN(ratio) ? 0 : Math.min(1, Math.max(0, ratio));
  if (normalized === 1) return () => true;
  if (normalized === 0) return () => false;
  const upperBound = Math.floor(normalized * 0xffffffff);
  return (traceId) => {
    let accumulation = 0;
    for (let i = 0; i < 32; i += 8) accumulation = (accumulation ^ parseInt(traceId.slice(i, i + 8), 16)) >>> 0;
    return accumulation < upperBound;
  };
}

/** The `traceparent` of a span that is not recorded (flags 00): the next hop follows the decision. */
export function unsampledTraceparent(traceId: string, spanId: string): string {
  return `00-${traceId}-${spanId}-00`;
}
