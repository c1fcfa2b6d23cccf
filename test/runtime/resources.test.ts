import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ResourceStack } from '../../src/runtime/resources.js';

describe('ResourceStack (the start and shutdown lifecycle)', () => {
  it('closes the last opened first, with the grace given, and only once', async () => {
    const closed: string[] = [];
    const stack = new ResourceStack();
    for (const name of ['store', 'deliverer', 'listener'])
      stack.defer((graceMs) => void closed.push(`${name}:${graceMs}`));
    await stack.close(5_000);
    await stack.close(5_000);
    assert.deepEqual(closed, ['listener:5000', 'deliverer:5000', 'store:5000']);
  });

  it('runs every closer when one throws, then throws the first error', async () => {
    const closed: string[] = [];
    const stack = new ResourceStack();
    stack.defer(() => void closed.push('a'));
    stack.defer(async () => {
      closed.push('b');
      throw new Error('b failed');
    });
    stack.defer(() => {
      closed.push('c');
      throw new Error('c failed');
    });
    await assert.rejects(stack.close(0), /c failed/);
    assert.deepEqual(closed, ['c', 'b', 'a']);
  });

  it("a start that throws closes what it had opened, with grace 0, and rethrows its own error (not a closer's)", async () => {
    const closed: string[] = [];
    const stack = new ResourceStack();
    await assert.rejects(
      stack.open(async (resources) => {
        resources.defer((graceMs) => void closed.push(`store:${graceMs}`));
        resources.defer(() => {
          closed.push('gateway');
          throw new Error('closing failed too');
        });
        throw new Error('port in use');
      }),
      /port in use/,
    );
    assert.deepEqual(closed, ['gateway', 'store:0']);
  });

  it('a start that succeeds keeps everything open until close', async () => {
    const closed: string[] = [];
    const stack = new ResourceStack();
    assert.equal(
      await stack.open(async (resources) => {
        resources.defer(() => void closed.push('store'));
        return 'started';
      }),
      'started',
    );
    assert.deepEqual(closed, []);
    await stack.close(0);
    assert.deepEqual(closed, ['store']);
  });
});
