/**
 * The CPU gateway.cors adds to one /api/ request, measured in a tight loop in one process (steadier
 * than req/s on a shared machine): the `decorate` step on a request without Origin (all a plain API
 * client ever costs), with an allowed exact and subdomain Origin (the response headers set), and
 * with an Origin not allowed; and the upstream header replacement. As the bench cases
 * "gatehouse api-key (cors)" and "(cors, Origin)" configure it.
 *
 *   node --import tsx bench/cors-steps.ts
 */
import http from 'node:http';
import { parseConfig } from '../src/config/load.js';
import { compileCors, replaceUpstreamCors } from '../src/gateway/cors.js';

const config = parseConfig({
  gateway: {
    upstream: { target: 'http://127.0.0.1:1' },
    cors: { origins: ['https://app.example.com', 'https://*.example.com'] },
  },
});
const cors = compileCors(config.gateway, () => ({ prefix: '/api/' }))!;

/** Real node:http request and response objects, as the listener hands them to the pipeline. */
function exchange(origin: string | undefined): { req: http.IncomingMessage; res: http.ServerResponse } {
  const req = new http.IncomingMessage(null as never);
  req.method = 'GET';
  req.url = '/api/items';
  req.headers = origin === undefined ? { 'x-api-key': 'k' } : { 'x-api-key': 'k', origin };
  req.gatehouse = { id: 'bench', startedAt: 0 };
  return { req, res: new http.ServerResponse(req) };
}

function measure(name: string, step: (i: number) => void): void {
  const N = 500_000;
  for (let i = 0; i < 50_000; i++) step(i);
  const started = process.cpuUsage();
  for (let i = 0; i < N; i++) step(i);
  const cpu = process.cpuUsage(started);
  console.log(
    JSON.stringify({ case: name, cpuMicrosPerRequest: Math.round(((cpu.user + cpu.system) / N) * 1000) / 1000 }),
  );
}

for (const [name, origin] of [
  ['no Origin', undefined],
  ['exact Origin', 'https://app.example.com'],
  ['subdomain Origin', 'https://eu.example.com'],
  ['Origin not allowed', 'https://evil.test'],
] as const) {
  const pool = Array.from({ length: 1024 }, () => exchange(origin));
  measure(`decorate, ${name}`, (i) => {
    const { req, res } = pool[i & 1023]!;
    cors.decorate(req, res);
  });
}
measure('replaceUpstreamCors (an upstream answer with Access-Control-Allow-Origin and Vary)', () => {
  replaceUpstreamCors({
    'content-type': 'application/json',
    'access-control-allow-origin': '*',
    vary: 'Accept-Encoding',
  });
});
