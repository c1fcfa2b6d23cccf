import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { jsonNestsDeeperThan } from '../../src/webhooks/json-depth.js';

/** The depth JSON.parse itself sees, computed recursively (fine for these small values). */
function depthOf(value: unknown): number {
  if (value === null || typeof value !== 'object') return 0;
  return 1 + Math.max(0, ...Object.values(value as Record<string, unknown>).map(depthOf));
}

describe('jsonNestsDeeperThan: one linear scan before JSON.parse', () => {
  it('counts arrays and objects; the top level is 1; scalars are 0', () => {
    assert.equal(jsonNestsDeeperThan('{}', 1), false);
    assert.equal(jsonNestsDeeperThan('{}', 0), true);
    assert.equal(jsonNestsDeeperThan('{"a":[{"b":1}]}', 3), false);
    assert.equal(jsonNestsDeeperThan('{"a":[{"b":1}]}', 2), true);
    assert.equal(jsonNestsDeeperThan('"[[[["', 0), false);
    assert.equal(jsonNestsDeeperThan('12', 0), false);
  });

  it('siblings do not add up: depth, not count', () => {
    assert.equal(jsonNestsDeeperThan(`{"a":[${'[1],'.repeat(10_000)}[1]]}`, 3), false);
    assert.equal(jsonNestsDeeperThan('[[],[],{},{"a":{}}]', 3), false);
    assert.equal(jsonNestsDeeperThan('[[],[],{},{"a":{"b":[]}}]', 3), true);
  });

  it('brackets inside strings do not count, nor escaped quotes, and an escaped backslash ends the escape', () => {
    assert.equal(jsonNestsDeeperThan('{"a":"[[[[{{{{"}', 1), false);
    assert.equal(jsonNestsDeeperThan('{"a\\"[[[":"\\"[[[[\\""}', 1), false, 'an escaped quote does not end the string');
    assert.equal(
      jsonNestsDeeperThan('{"a":"\\\\","b":[[1]]}', 2),
      true,
      '"\\\\" is a backslash; the string ends at the next quote',
    );
    assert.equal(jsonNestsDeeperThan('{"a":"\\\\","b":[[1]]}', 3), false);
    assert.equal(jsonNestsDeeperThan('{"\\u005b":"\\u007b","é[":"漢{"}', 1), false);
  });

  it('agrees with the depth JSON.parse builds, for a spread of bodies', () => {
    const bodies = [
      '{}',
      '[]',
      '{"a":{"b":{"c":[1,[2,[3]]]}}}',
      '[{"x":"]}"},[[["\\""]]]]',
      '{"s":"\\\\\\"[","t":[{}]}',
      '{"k":[[],[[{}]],{"z":[]}]}',
    ];
    for (const text of bodies) {
      const depth = depthOf(JSON.parse(text));
      assert.equal(jsonNestsDeeperThan(text, depth), false, `${text} at ${depth}`);
      assert.equal(jsonNestsDeeperThan(text, depth - 1), true, `${text} at ${depth - 1}`);
    }
  });

  it('stops at the first level past the limit: a ~100 KB body nested 50,000 deep is refused at once', () => {
    const deep = `{"data":${'['.repeat(50_000)}${']'.repeat(50_000)}}`;
    assert.equal(jsonNestsDeeperThan(deep, 64), true);
    assert.equal(jsonNestsDeeperThan(deep, 50_001), false);
  });
});
