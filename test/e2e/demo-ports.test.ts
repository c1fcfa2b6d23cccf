import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { ROOT } from '../helpers/process.js';

/** A port something else holds for the test's duration. */
async function occupy(): Promise<{ port: number; close: () => Promise<void> }> {
  const server = net.createServer((socket) => socket.destroy());
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

async function freePort(): Promise<number> {
  const held = await occupy();
  await held.close();
  return held.port;
}

function isListening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

/** `npm start` as a user runs it (node examples/demo.js), to completion. */
async function runDemo(
  env: Record<string, string>,
  cwd: string,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [path.join(ROOT, 'examples/demo.js')], {
    cwd,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  const timer = setTimeout(() => child.kill('SIGKILL'), 180_000);
  const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
  clearTimeout(timer);
  return { code, stdout, stderr };
}

describe('npm start with a port in use', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-demo-ports-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('the example API port taken: one line naming the variable to change, exit 1, nothing left listening', async () => {
    const taken = await occupy();
    try {
      const [targetPort, gatewayPort] = [await freePort(), await freePort()];
      const result = await runDemo(
        {
          DEMO_API_PORT: String(taken.port),
          DEMO_TARGET_PORT: String(targetPort),
          GATEHOUSE_PORT: String(gatewayPort),
        },
        dir,
      );
      assert.equal(result.code, 1);
      assert.equal(
        result.stderr,
        `demo: the example internal API cannot listen on 127.0.0.1:${taken.port}: the port is already in use (set DEMO_API_PORT to another port)\n`,
      );
      assert.equal(await isListening(targetPort), false);
      assert.equal(await isListening(gatewayPort), false, 'gatehouse was not started');
    } finally {
      await taken.close();
    }
  });

  it('the gatehouse port taken: its one line, exit 1, and the example servers and gatehouse all gone', async (t) => {
    if (!existsSync(path.join(ROOT, 'dist/bin.js'))) return t.skip('dist/ is not built here (npm install builds it)');
    const taken = await occupy();
    try {
      const [apiPort, targetPort, hooksPort] = [await freePort(), await freePort(), await freePort()];
      const result = await runDemo(
        {
          DEMO_API_PORT: String(apiPort),
          DEMO_TARGET_PORT: String(targetPort),
          GATEHOUSE_PORT: String(taken.port),
          GATEHOUSE_WEBHOOKS_PORT: String(hooksPort),
        },
        ROOT,
      );
      assert.equal(result.code, 1, result.stderr);
      // gateway.json5's port is "${GATEHOUSE_PORT:-8080}": the line names the variable, as the demo does for its own ports.
      assert.match(
        result.stderr,
        new RegExp(
          `^gatehouse: gateway\\.listen 127\\.0\\.0\\.1:${taken.port} is already in use \\(set GATEHOUSE_PORT to another port\\)$`,
          'm',
        ),
      );
      assert.doesNotMatch(result.stderr, /\n\s+at /, 'no stack');
      for (const port of [apiPort, targetPort, hooksPort])
        assert.equal(await isListening(port), false, `${port} still listening`);
    } finally {
      await taken.close();
    }
  });
});
