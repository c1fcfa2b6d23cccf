import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { describe, it } from 'node:test';
import pino from 'pino';
import { isoNow, requestLogger } from '../../src/http/request-context.js';
import { createLogger } from '../../src/observability/log.js';
import { startServerProcess } from '../helpers/process.js';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

/** ISO 8601 in UTC with milliseconds, as pino.stdTimeFunctions.isoTime writes it. */
const ISO_TIME = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

function memory(): { destination: Writable; lines: () => Record<string, unknown>[] } {
  const chunks: string[] = [];
  const destination = new Writable({
    write(chunk, _encoding, done) {
      chunks.push(String(chunk));
      done();
    },
  });
  return {
    destination,
    lines: () =>
      chunks
        .join('')
        .split('\n')
        .filter(Boolean)
        .map((line) => JSON.parse(line) as Record<string, unknown>),
  };
}

describe('log lines (log.format "json")', () => {
  it('the level is its name and the time ISO 8601, on ordinary lines and on the request line alike', () => {
    const { destination, lines } = memory();
    const logger = createLogger({ level: 'info', destination, bindings: { worker: 2 } });
    logger.warn({ ip: '10.0.0.1' }, 'client locked out');
    requestLogger(logger)({ id: 'r1', method: 'GET', path: '/api/x', status: 200, ms: 1.5 });
    const [warned, request] = lines();
    assert.deepEqual(Object.keys(warned!), ['level', 'time', 'name', 'worker', 'ip', 'msg']);
    assert.equal(warned!.level, 'warn');
    assert.match(String(warned!.time), ISO_TIME);
    // The hand-written request line keeps pino's field order and the logger's format.
    assert.deepEqual(Object.keys(request!), [
      'level',
      'time',
      'name',
      'worker',
      'id',
      'method',
      'path',
      'status',
      'ms',
      'msg',
    ]);
    assert.equal(request!.level, 'info');
    assert.match(String(request!.time), ISO_TIME);
    assert.ok(Math.abs(Date.parse(String(request!.time)) - Date.now()) < 60_000);
  });

  it("the request line follows its logger: a plain pino logger's numbers stay numbers", () => {
    const { destination, lines } = memory();
    const logger = pino({ base: { name: 'other' } }, destination);
    requestLogger(logger)({ status: 204 });
    const [line] = lines();
    assert.equal(line!.level, 30);
    assert.equal(typeof line!.time, 'number');
    assert.equal(line!.msg, 'request');
  });

  it('the request line is byte for byte the JSON of level, time, bindings, fields and msg (undefined fields left out, any text escaped)', () => {
    const written: string[] = [];
    const destination = new Writable({
      write(chunk, _encoding, done) {
        written.push(String(chunk));
        done();
      },
    });
    const logger = createLogger({ level: 'info', destination, bindings: { worker: 1 } });
    const fields = [
      { id: 'r"1', method: 'GET', path: '/api/\\x"\u2028', status: 200, ms: 1.5, auth: undefined, detail: 'a\nb' },
      { status: undefined },
      {},
    ];
    for (const f of fields) requestLogger(logger)(f);
    assert.equal(written.length, 3);
    written.forEach((line, i) => {
      const time = (JSON.parse(line) as { time: string }).time;
      assert.equal(
        line,
        JSON.stringify({ level: 'info', time, name: 'gatehouse', worker: 1, ...fields[i], msg: 'request' }) + '\n',
      );
    });
  });

  it('the request time is what toISOString gives, across second boundaries and a clock that steps back', () => {
    const instants = [0, 1, 9, 10, 99, 100, 999, 1000, 1001, 59_999, 60_000, 1_764_000_000_000, 1_764_000_000_999];
    for (let i = 0; i < 2000; i++) instants.push(Math.floor(Math.random() * 4_000_000_000_000));
    instants.push(1_764_000_000_500, 1_764_000_000_499, 1_763_999_999_999);
    for (const at of instants) assert.equal(isoNow(at), new Date(at).toISOString(), String(at));
  });

  it('a level below log.level writes no request line', () => {
    const { destination, lines } = memory();
    requestLogger(createLogger({ level: 'warn', destination }))({ status: 200 });
    assert.deepEqual(lines(), []);
  });
});

describe('log.format "pretty"', () => {
  it('writes readable text even when stdout is no terminal', async (t) => {
    const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-log-pretty-'));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    const file = path.join(dir, 'pretty.json5');
    writeFileSync(
      file,
      `{ log: { format: "pretty" }, gateway: { listen: { port: 0 }, upstream: { target: "http://127.0.0.1:9" } } }`,
    );
    const server = startServerProcess(file);
    let text = '';
    server.child.stdout!.on('data', (d) => (text += d));
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no start line in: ${text}`)), 60_000);
        server.child.stdout!.on('data', () => {
          if (/INFO.*gatehouse started \(pid \d+\)/.test(text)) {
            clearTimeout(timer);
            resolve();
          }
        });
      });
      assert.deepEqual(server.lines, [], 'no JSON line');
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });
});
