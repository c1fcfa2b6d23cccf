/**
 * The CPU tracing adds to one /api/ request, measured in a loop in one process (steadier than the
 * bench's req/s on a shared machine): the calls src/gateway/app.ts makes (begin, authentication,
 * upstream, the answer's close) on a request-shaped object, with tracing at sampleRatio 0 and 1.0,
 * exporting over OTLP/HTTP to a sink in another process (its CPU is not counted; the export's
 * serialising and sending is). `serialize`: the OTLP encoders' cost per span, JSON and protobuf.
 *
 *   node --import tsx bench/tracing-spans.ts            # every mode, one process each
 *   node --import tsx bench/tracing-spans.ts 1 <sink>   # one mode
 */
import { execFileSync, spawn } from 'node:child_process';
import { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { fileURLToPath } from 'node:url';
import pino from 'pino';
import { traceApiRequests } from '../src/observability/request-spans.js';
import { activeTracing, startTracing, stopTracing } from '../src/observability/tracing.js';

const N = Number(process.env.TRACING_BENCH_REQUESTS ?? 200_000);
/**
 * TRACING_BENCH_HEAP_MB=100: that much live data (small objects) held through the run, as a
 * server's heap holds its modules, config and caches: spans that wait for their export outlive the
 * young generation, and each old-generation collection then walks the whole heap.
 */
const ballast = Array.from({ length: Number(process.env.TRACING_BENCH_HEAP_MB ?? 0) * 10_000 }, (_, i) => ({
  i,
  name: `entry-${i}`,
  tags: [i, i + 1],
}));
const TARGET = 'http://127.0.0.1:8080/internal';

function request(i: number): { req: IncomingMessage; res: ServerResponse } {
  const req = {
    method: 'GET',
    url: '/api/items?page=2',
    headers: { host: '127.0.0.1', 'x-api-key': 'redacted', accept: '*/*' } as Record<string, string>,
    gatehouse: {
      id: `req-${i}`,
      startedAt: performance.now(),
      identity: { methods: ['api-key'], subject: 'bench' },
      route: '/api/',
    },
  } as unknown as IncomingMessage;
  const res = Object.assign(new EventEmitter(), { writableFinished: true, statusCode: 200 });
  return { req, res: res as unknown as ServerResponse };
}

async function measure(mode: string, sink: string): Promise<void> {
  const origin = { ip: '127.0.0.1', viaTrustedProxy: false };
  let once = (_i: number) => {};
  if (mode !== 'off' && !mode.startsWith('floor')) {
    const config = {
      exporter: 'otlp',
      endpoint: sink,
      sampleRatio: Number(mode),
      serviceName: 'bench',
      maxQueueSize: 2048,
    };
    await startTracing(config as never, pino({ level: 'warn' }));
    const spans = traceApiRequests(activeTracing()!);
    once = (i) => {
      const { req, res } = request(i);
      spans.begin(req, res, origin as never, false);
      spans.beginAuthentication(req);
      spans.endAuthentication(req);
      spans.beginUpstream(req, TARGET);
      res.emit('close');
    };
  } else {
    once = (i) => void request(i);
  }
  if (mode.startsWith('floor')) once = await sdkFloor(mode === 'floor', sink);
  const run = async (count: number) => {
    // In slices, yielding between them so the batch processor exports as it would under traffic.
    for (let i = 0; i < count; i += 500) {
      for (let j = i; j < i + 500; j++) once(j);
      await new Promise((resolve) => setImmediate(resolve));
    }
  };
  await run(20_000);
  const started = process.cpuUsage();
  await run(N);
  await stopTracing(30_000); // the last exports, inside the measurement
  await stopFloor();
  const cpu = process.cpuUsage(started);
  console.log(
    JSON.stringify({
      mode,
      heapMB: Math.round(ballast.length / 10_000),
      requests: N,
      cpuMicrosPerRequest: Math.round(((cpu.user + cpu.system) / N) * 100) / 100,
    }),
  );
}

/**
 * The official SDK's own floor for three spans a request: a root SERVER span with five attributes,
 * two children (one CLIENT with four), ended; `exported`: through a BatchSpanProcessor and the
 * OTLP/HTTP JSON exporter to the sink, else ended into a processor that drops them.
 */
async function sdkFloor(exported: boolean, sink: string): Promise<(i: number) => void> {
  const { ROOT_CONTEXT, SpanKind, trace } = await import('@opentelemetry/api');
  const { BasicTracerProvider, BatchSpanProcessor } = await import('@opentelemetry/sdk-trace-base');
  const { OTLPTraceExporter } = await import('@opentelemetry/exporter-trace-otlp-http');
  const processor = exported
    ? new BatchSpanProcessor(new OTLPTraceExporter({ url: `${sink}/v1/traces` }), {
        maxQueueSize: 2048,
        maxExportBatchSize: 512,
      })
    : { onStart() {}, onEnd() {}, forceFlush: async () => {}, shutdown: async () => {} };
  const provider = new BasicTracerProvider({ spanProcessors: [processor] });
  const tracer = provider.getTracer('bench');
  stopFloor = () => provider.shutdown();
  return (i) => {
    const server = tracer.startSpan('GET', {
      kind: SpanKind.SERVER,
      root: true,
      attributes: {
        'http.request.method': 'GET',
        'url.path': '/api/items',
        'url.scheme': 'http',
        'client.address': '127.0.0.1',
        'gatehouse.request.id': `req-${i}`,
      },
    });
    const parent = trace.setSpan(ROOT_CONTEXT, server);
    tracer.startSpan('authenticate', {}, parent).end();
    const call = tracer.startSpan(
      'GET',
      {
        kind: SpanKind.CLIENT,
        attributes: {
          'http.request.method': 'GET',
          'server.address': '127.0.0.1',
          'server.port': 8080,
          'url.full': 'http://127.0.0.1:8080/internal/api/items',
        },
      },
      parent,
    );
    call.setAttribute('http.response.status_code', 200);
    call.end();
    server.setAttributes({
      'http.response.status_code': 200,
      'http.route': '/api/',
      'gatehouse.auth': 'api-key',
      'enduser.id': 'bench',
    });
    server.end();
  };
}
let stopFloor = async () => {};

async function serialize(): Promise<void> {
  const { BasicTracerProvider } = await import('@opentelemetry/sdk-trace-base');
  // A transitive dependency (of exporter-trace-otlp-http): both encoders the OTLP exporters use.
  const { JsonTraceSerializer, ProtobufTraceSerializer } = await import('@opentelemetry/otlp-transformer');
  const ended: never[] = [];
  const provider = new BasicTracerProvider({
    spanProcessors: [
      { onStart() {}, onEnd: (s: never) => ended.push(s), forceFlush: async () => {}, shutdown: async () => {} },
    ],
  });
  const tracer = provider.getTracer('bench');
  for (let i = 0; i < 512; i++) {
    const span = tracer.startSpan('GET /api/', {
      attributes: {
        'http.request.method': 'GET',
        'url.path': '/api/items',
        'client.address': '127.0.0.1',
        'gatehouse.request.id': `r${i}`,
      },
    });
    span.setAttributes({ 'http.response.status_code': 200, 'http.route': '/api/', 'gatehouse.auth': 'api-key' });
    span.end();
  }
  for (const [name, serializer] of [
    ['json', JsonTraceSerializer],
    ['protobuf', ProtobufTraceSerializer],
  ] as const) {
    let bytes = 0;
    for (let i = 0; i < 50; i++) serializer.serializeRequest(ended);
    const started = process.cpuUsage();
    for (let i = 0; i < 400; i++) bytes = serializer.serializeRequest(ended)!.length;
    const cpu = process.cpuUsage(started);
    console.log(
      JSON.stringify({
        mode: `serialize ${name}`,
        cpuMicrosPerSpan: Math.round(((cpu.user + cpu.system) / (400 * 512)) * 100) / 100,
        bytesPerSpan: Math.round(bytes / 512),
      }),
    );
  }
}

const [mode, sink] = process.argv.slice(2);
if (mode === 'serialize') await serialize();
else if (mode !== undefined) await measure(mode, sink!);
else {
  // The sink: an OTLP/HTTP collector that reads each export and answers 200, in its own process.
  const collector = spawn(
    process.execPath,
    [
      '-e',
      `require('http').createServer((q,s)=>{q.resume();q.on('end',()=>s.end('{}'))}).listen(0,'127.0.0.1',function(){console.log(this.address().port)})`,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const port = await new Promise<string>((resolve) =>
    collector.stdout!.once('data', (d: Buffer) => resolve(d.toString().trim())),
  );
  const self = fileURLToPath(import.meta.url);
  try {
    for (const m of [
      'off',
      '0',
      '1',
      'floor',
      'floor-unexported',
      'off',
      '0',
      '1',
      'floor',
      'floor-unexported',
      'serialize',
    ]) {
      process.stdout.write(execFileSync(process.execPath, ['--import', 'tsx', self, m, `http://127.0.0.1:${port}`]));
    }
  } finally {
    collector.kill();
  }
}
