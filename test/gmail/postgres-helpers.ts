import { writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Workspace } from './helpers.js';

// The Gmail tests on PostgreSQL: their config, and Pub/Sub's push fanned out to the instances.

/** The workspace's config on postgres, with `webhooks` as given. */
export function writePostgresConfig(ws: Workspace, webhooks?: Record<string, unknown>): void {
  writeFileSync(
    ws.config,
    JSON.stringify(
      {
        storage: { driver: 'postgres', url: '${TEST_DATABASE_URL}', pool: { max: 4 } },
        log: { level: 'info' },
        gateway: {
          listen: { host: '127.0.0.1', port: 0 },
          upstream: { target: 'http://127.0.0.1:9' },
          auth: { apiKey: 'gmail-pg-api-key-0123456789abcdefghijklmn', failures: { max: 100 } },
        },
        ...(webhooks ? { webhooks } : {}),
      },
      null,
      2,
    ),
  );
}

/** Pub/Sub's push endpoint: each push goes to every instance at once; 2xx back only when all answered 2xx. */
export async function startFanOut(): Promise<{
  url: string;
  targets: string[];
  answers: number[][];
  close(): Promise<void>;
}> {
  const fan = { url: '', targets: [] as string[], answers: [] as number[][], close: async () => {} };
  const forward = (to: string, path: string, headers: http.IncomingHttpHeaders, body: Buffer) =>
    new Promise<number>((resolve) => {
      const out = http.request(
        `${to}${path}`,
        { method: 'POST', headers: { ...headers, host: new URL(to).host }, agent: false },
        (back) => {
          back.resume();
          back.on('end', () => resolve(back.statusCode!));
        },
      );
      out.on('error', () => resolve(502));
      out.end(body);
    });
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', async () => {
      if (fan.targets.length === 0) return void res.writeHead(503).end();
      const statuses = await Promise.all(
        fan.targets.map((t) => forward(t, req.url!, req.headers, Buffer.concat(chunks))),
      );
      fan.answers.push(statuses);
      res.writeHead(statuses.every((s) => s >= 200 && s < 300) ? 204 : 503).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  fan.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  fan.close = async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  return fan;
}
