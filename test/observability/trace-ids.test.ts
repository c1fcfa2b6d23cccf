import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ROOT_CONTEXT } from '@opentelemetry/api';
import { parseTraceParent } from '@opentelemetry/core';
import { SamplingDecision, TraceIdRatioBasedSampler } from '@opentelemetry/sdk-trace-base';
import { newSpanId, newTraceId, ratioSampler, unsampledTraceparent } from '../../src/observability/trace-ids.js';

describe('trace ids and the sampling decision made without the SDK', () => {
  it('ids are W3C-valid: 32 and 16 lowercase hex digits, never all zeros, not repeated', () => {
    const traces = new Set<string>();
    // More than the 4 KB random pool holds, so it is refilled on the way.
    for (let i = 0; i < 1000; i++) {
      const traceId = newTraceId();
      assert.match(traceId, /^(?!0{32})[0-9a-f]{32}$/);
      assert.match(newSpanId(), /^(?!0{16})[0-9a-f]{16}$/);
      traces.add(traceId);
    }
    assert.equal(traces.size, 1000);
  });

  it("the ratio decision is the SDK's TraceIdRatioBasedSampler's for the same trace id", () => {
    for (const ratio of [0, 0.001, 0.1, 0.5, 0.999, 1]) {
      const ours = ratioSampler(ratio);
      const sdk = new TraceIdRatioBasedSampler(ratio);
      let sampled = 0;
      const ids = [
        ...Array.from({ length: 5000 }, newTraceId),
        'ffffffffffffffffffffffffffffffff',
        '00000000000000000000000000000001',
      ];
      for (const id of ids) {
        const expected = sdk.shouldSample(ROOT_CONTEXT, id).decision;
        assert.equal(ours(id), expected === SamplingDecision.RECORD_AND_SAMPLED, `ratio ${ratio}, trace ${id}`);
        if (ours(id)) sampled++;
      }
      if (ratio === 0.5) assert.ok(sampled > 2000 && sampled < 3000, `about half sampled (${sampled})`);
    }
  });

  it('the unsampled traceparent parses as W3C version 00, flags 00', () => {
    const [traceId, spanId] = [newTraceId(), newSpanId()];
    assert.deepEqual(parseTraceParent(unsampledTraceparent(traceId, spanId)), { traceId, spanId, traceFlags: 0 });
  });
});
