import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { describe, it } from 'node:test';
import { diag } from '@opentelemetry/api';
import { globalErrorHandler } from '@opentelemetry/core';
import pino from 'pino';
import { activeTracing, startTracing, stopTracing } from '../../src/observability/tracing.js';

function capturingLogger(): { logger: pino.Logger; lines: string[] } {
  const lines: string[] = [];
  const stream = new Writable({
    write(chunk, _encoding, done) {
      lines.push(String(chunk));
      done();
    },
  });
  return { logger: pino({ level: 'info' }, stream), lines };
}

describe('stopping tracing', () => {
  it("hands the SDK's process-wide error handler and diag logger back: nothing more reaches the stopped instance's logger", async () => {
    const { logger, lines } = capturingLogger();
    // Port 9 (discard) on loopback: nothing is exported during this test anyway.
    await startTracing(
      { exporter: 'otlp', endpoint: 'http://127.0.0.1:9', sampleRatio: 1, serviceName: 't' } as never,
      logger,
    );
    assert.ok(activeTracing());
    // Nothing reported while it ran: the first report after the stop would not be rate-limited away.
    await stopTracing(500);
    assert.equal(activeTracing(), undefined);
    globalErrorHandler(new Error('after stop'));
    diag.error('after stop (diag)');
    // A fresh start is heard through its own logger.
    const second = capturingLogger();
    await startTracing(
      { exporter: 'otlp', endpoint: 'http://127.0.0.1:9', sampleRatio: 1, serviceName: 't' } as never,
      second.logger,
    );
    globalErrorHandler(new Error('second instance'));
    await stopTracing(500);
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(
      lines.filter((l) => l.includes('after stop')),
      [],
      'the stopped instance logged nothing more',
    );
    assert.equal(second.lines.filter((l) => l.includes('second instance')).length, 1);
  });
});
