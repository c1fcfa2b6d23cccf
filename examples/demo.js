// `npm start` / `npm run demo`: the example internal API (:3000), the example action target (:4000)
// and gatehouse itself with ./gateway.json5, in one terminal. Ctrl-C stops all three.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createActionTarget } from './action-target.js';
import { createInternalApi } from './internal-api.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const api = createInternalApi().listen(3000, '127.0.0.1');
const target = createActionTarget().listen(4000, '127.0.0.1');
console.log('example internal API on http://127.0.0.1:3000, example action target on http://127.0.0.1:4000');

const gatehouse = spawn(process.execPath, ['bin/gatehouse.js', 'start', '--config', process.argv[2] ?? 'gateway.json5'], {
  cwd: root,
  stdio: 'inherit',
});
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => gatehouse.kill(signal === 'SIGHUP' ? 'SIGHUP' : 'SIGTERM'));
gatehouse.on('exit', (code) => {
  api.close();
  target.close();
  process.exitCode = code ?? 1;
});
