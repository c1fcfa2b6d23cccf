// The example internal API that gatehouse protects in the demo: a plain node:http service.
// It answers every request with what it was sent, so you can see what gatehouse forwards.
import http from 'node:http';
import { pathToFileURL } from 'node:url';

/** Creates (does not start) the example API server. */
export function createInternalApi() {
  return http.createServer((req, res) => {
    const body = JSON.stringify({
      service: 'example internal API',
      method: req.method,
      path: req.url,
      // Set by gatehouse; a client cannot forge them (gatehouse strips client-sent X-Gatehouse-*).
      auth: req.headers['x-gatehouse-auth'] ?? null,
      subject: req.headers['x-gatehouse-subject'] ?? null,
      requestId: req.headers['x-request-id'] ?? null,
      forwardedFor: req.headers['x-forwarded-for'] ?? null,
    });
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(body);
  });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const port = Number(process.env.PORT ?? 3000);
  createInternalApi().listen(port, '127.0.0.1', () => console.log(`example internal API on http://127.0.0.1:${port}`));
}
