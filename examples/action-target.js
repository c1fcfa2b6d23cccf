// The example internal service that receives webhook actions in the demo (system-event, message, agent).
// It prints each delivery and answers 200, which tells gatehouse the action was delivered.
import http from 'node:http';
import { pathToFileURL } from 'node:url';

/** Creates (does not start) the example target; `onAction` sees each delivery. */
export function createActionTarget(onAction = (delivery) => console.log('action received:', JSON.stringify(delivery))) {
  return http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', () => {
      let body = null;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        // keep null: the target reports what it got
      }
      onAction({ path: req.url, action: req.headers['x-gatehouse-action'] ?? null, body });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"ok":true}');
    });
  });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const port = Number(process.env.PORT ?? 4000);
  createActionTarget().listen(port, '127.0.0.1', () =>
    console.log(`example action target on http://127.0.0.1:${port}`),
  );
}
