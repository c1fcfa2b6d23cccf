import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { buildEnvelope, compileTemplate, prepareEnvelope, renderTemplate } from '../../src/webhooks/translate.js';

/** Compiles and renders in one step, as the receiver does for each webhook. */
function render(template: string, data: unknown): string {
  return renderTemplate(compileTemplate(template), data);
}

describe('message templates: rendering', () => {
  const body = {
    sender: { name: 'Ada', id: 42, admin: true, score: 1.5, nothing: null, tags: ['x', 'y'], meta: { k: 'v' } },
    a: { b: [{ c: 'deep' }, { c: 'second' }] },
    items: [{ title: 'first' }],
    text: 'hello',
  };

  it('substitutes a dotted path and keeps the surrounding text', () => {
    assert.equal(render('New event from {{sender.name}}!', body), 'New event from Ada!');
  });

  it('follows array indexes inside a path', () => {
    assert.equal(render('{{a.b[0].c}} / {{a.b[1].c}} / {{items[0].title}}', body), 'deep / second / first');
  });

  it('allows whitespace (spaces, tabs, newlines) inside the braces', () => {
    assert.equal(
      render('{{ sender.name }}|{{\tsender.name\t}}|{{\n  sender.name\n}}|{{sender.name   }}', body),
      'Ada|Ada|Ada|Ada',
    );
  });

  it('renders several placeholders, repeated ones and adjacent ones', () => {
    assert.equal(render('{{sender.name}}{{sender.id}}-{{sender.name}}', body), 'Ada42-Ada');
  });

  it('renders a missing path as empty text, at any depth', () => {
    assert.equal(render('[{{nope}}]', body), '[]');
    assert.equal(render('[{{sender.nope.deeper}}]', body), '[]');
    assert.equal(render('[{{a.b[5].c}}]', body), '[]');
    assert.equal(render('[{{text.length}}]', body), '[]', 'no properties of a string primitive');
    assert.equal(render('[{{sender.name}}]', undefined), '[]');
    assert.equal(render('[{{sender.name}}]', null), '[]');
    assert.equal(render('[{{sender.name}}]', 'a string'), '[]');
  });

  it('renders numbers and booleans as text', () => {
    assert.equal(render('{{sender.id}} {{sender.admin}} {{sender.score}}', body), '42 true 1.5');
    assert.equal(
      render('{{n}}|{{f}}|{{neg}}', { n: 0, f: false, neg: -3 }),
      '0|false|-3',
      'falsy values are not treated as missing',
    );
  });

  it('renders an empty string value as empty text', () => {
    assert.equal(render('[{{s}}]', { s: '' }), '[]');
  });

  it('renders objects and arrays as JSON', () => {
    assert.equal(render('{{sender.meta}}', body), '{"k":"v"}');
    assert.equal(render('{{sender.tags}}', body), '["x","y"]');
    assert.equal(render('{{a}}', body), '{"b":[{"c":"deep"},{"c":"second"}]}');
  });

  it('renders null as empty (not "null")', () => {
    assert.equal(render('[{{sender.nothing}}]', body), '[]');
    assert.equal(render('[{{sender.nothing.below}}]', body), '[]');
  });

  it('does not index into a non-array, nor read named properties of an array', () => {
    assert.equal(render('[{{sender[0]}}]', body), '[]', 'index on an object');
    assert.equal(render('[{{text[0]}}]', body), '[]', 'index on a string');
    assert.equal(render('[{{obj[0]}}]', { obj: { 0: 'zero' } }), '[]', 'an object with key "0" is still not an array');
    assert.equal(render('[{{items.length}}]', body), '[]', 'Array length is not data');
  });

  it('never reaches prototype properties: __proto__, constructor, toString, hasOwnProperty render empty', () => {
    for (const path of [
      '__proto__',
      'constructor',
      'toString',
      'hasOwnProperty',
      'valueOf',
      'sender.constructor',
      'sender.__proto__',
      'sender.constructor.name',
      'items.constructor',
      'items[0].__proto__',
      'text.constructor',
    ]) {
      assert.equal(render(`[{{${path}}}]`, body), '[]', path);
    }
    // A prototype-less object carries nothing either.
    assert.equal(render('[{{toString}}]', Object.create(null)), '[]');
  });

  it('an own "__proto__" key from JSON.parse is data and renders; it is not the prototype', () => {
    const parsed = JSON.parse('{"__proto__": {"polluted": "yes"}}') as Record<string, unknown>;
    assert.equal(render('{{__proto__.polluted}}', parsed), 'yes');
    assert.equal(render('[{{polluted}}]', parsed), '[]', 'the key did not become the prototype');
    assert.equal(({} as Record<string, unknown>).polluted, undefined);
  });

  it('leaves text without placeholders unchanged, including lone or unbalanced braces', () => {
    for (const text of [
      '',
      'plain text',
      'a { b } c',
      '{single}',
      '{{ unclosed',
      'closed }}',
      '}}{{',
      'emoji ✓ and "quotes"',
    ]) {
      assert.equal(render(text, body), text);
    }
  });

  it('keeps extra braces around a placeholder as text', () => {
    assert.equal(render('{{{sender.name}}}', body), '{Ada}');
  });

  it('inserts values verbatim, without re-expanding placeholders found in the data', () => {
    assert.equal(render('{{a}}', { a: '{{b}}', b: 'no' }), '{{b}}');
  });

  it('never throws: a value JSON cannot represent (a cycle, a BigInt, nesting past the stack) renders empty', () => {
    const cyclic: Record<string, unknown> = { name: 'loop' };
    cyclic.self = cyclic;
    let deep: unknown = [];
    for (let i = 0; i < 100_000; i++) deep = [deep];
    const data = { cyclic, big: { n: 10n }, deep, fn: { f: () => 1 }, ok: 'fine' };
    assert.equal(render('[{{cyclic}}][{{big}}][{{deep}}][{{ok}}]', data), '[][][][fine]');
    assert.equal(
      render('[{{fn.f}}]', data),
      '[]',
      'JSON.stringify gives undefined for a function: empty, not "undefined"',
    );
  });

  it('a compiled template is reusable across bodies', () => {
    const compiled = compileTemplate('hi {{sender.name}}');
    assert.equal(renderTemplate(compiled, { sender: { name: 'one' } }), 'hi one');
    assert.equal(renderTemplate(compiled, { sender: { name: 'two' } }), 'hi two');
  });
});

describe('message templates: compiling', () => {
  it('accepts property paths with letters, digits, _, $ and -', () => {
    for (const template of ['{{a}}', '{{a_b.c-d.$e}}', '{{x1.y2[0][1].z}}', '{{ a.b[0].c }}']) {
      assert.doesNotThrow(() => compileTemplate(template), template);
    }
  });

  it('throws for anything that is not a property path, naming the placeholder', () => {
    const invalid = [
      '{{a..b}}',
      '{{a()}}',
      '{{ process.exit() }}',
      '{{}}',
      '{{   }}',
      '{{a b}}',
      '{{.a}}',
      '{{a.}}',
      '{{a[0}}',
      '{{a[-1]}}',
      '{{a["b"]}}',
      '{{a[b]}}',
      '{{[0]}}',
      '{{a + 1}}',
      '{{this.constructor.constructor("return process")()}}',
      '{{`x`}}',
      'ok {{sender.name}} then {{bad name}}',
    ];
    for (const template of invalid) {
      assert.throws(
        () => compileTemplate(template),
        (err: Error) => err instanceof Error && err.message.includes('invalid placeholder'),
        template,
      );
    }
    assert.throws(() => compileTemplate('{{ process.exit() }}'), /process\.exit\(\)/);
  });

  it('never executes code: a would-be expression neither runs nor reads globals', () => {
    const g = globalThis as Record<string, unknown>;
    g.__gatehouseTemplateProbe = 'leaked';
    try {
      assert.throws(() => compileTemplate('{{ globalThis.__gatehouseTemplateProbe = 1 }}'));
      assert.equal(g.__gatehouseTemplateProbe, 'leaked', 'assignment did not run');
      // A syntactically valid path only ever looks in the data, never in scope.
      assert.equal(render('[{{__gatehouseTemplateProbe}}]', {}), '[]');
      assert.equal(render('[{{globalThis.__gatehouseTemplateProbe}}]', {}), '[]');
      assert.equal(render('[{{process.pid}}]', {}), '[]');
    } finally {
      delete g.__gatehouseTemplateProbe;
    }
  });
});

describe('buildEnvelope', () => {
  const receivedAt = Date.UTC(2024, 4, 6, 7, 8, 9, 123);
  const info = { action: 'message' as const, endpoint: '/webhook/github', receivedAt };

  function envelope(rawBody: string, template?: string): Record<string, unknown> {
    const text = buildEnvelope(
      'evt_1',
      { ...info, template: template === undefined ? undefined : compileTemplate(template) },
      JSON.parse(rawBody) as Record<string, unknown>,
      rawBody,
    );
    return JSON.parse(text) as Record<string, unknown>;
  }

  it('carries id, action, endpoint, ISO receivedAt and the payload', () => {
    const env = envelope('{"a":1}');
    assert.deepEqual(env, {
      id: 'evt_1',
      action: 'message',
      endpoint: '/webhook/github',
      receivedAt: '2024-05-06T07:08:09.123Z',
      payload: { a: 1 },
    });
  });

  it("message comes from the template when one is set (even over the body's own message)", () => {
    const env = envelope('{"message":"from body","sender":{"name":"Ada"}}', 'push by {{sender.name}}');
    assert.equal(env.message, 'push by Ada');
  });

  it("message is the body's string message when there is no template", () => {
    assert.equal(envelope('{"message":"from body"}').message, 'from body');
    assert.equal(envelope('{"message":""}').message, '');
  });

  it('message is absent (not null, not "") when there is neither template nor string body.message', () => {
    for (const raw of [
      '{"a":1}',
      '{"message":null}',
      '{"message":42}',
      '{"message":{"text":"x"}}',
      '{"message":["x"]}',
      '{"message":true}',
    ]) {
      const env = envelope(raw);
      assert.equal(Object.hasOwn(env, 'message'), false, raw);
    }
  });

  it('does not pick up a message from the prototype chain', () => {
    assert.equal(Object.hasOwn(envelope('{"__proto__":{"message":"sneaky"}}'), 'message'), false);
  });

  it('embeds the raw body byte for byte: key order, duplicate keys, number formatting, escapes, whitespace', () => {
    const raw =
      '{ "z": 1.0, "a": 1e2, "dup": 1, "dup": 2, "n": -0, "big": 12345678901234567890, "s": "\\u00e9\\/", "nested": { "b" : [ 1 , 2 ] } }';
    const text = buildEnvelope('evt_1', info, JSON.parse(raw) as Record<string, unknown>, raw);
    assert.ok(text.endsWith(`"payload":${raw}}`), text);
    assert.equal(text.indexOf(raw), text.length - raw.length - 1, 'the payload appears once, at the end');
    // And the whole envelope is still JSON whose payload is the body.
    const env = JSON.parse(text) as { payload: Record<string, unknown> };
    assert.equal(env.payload.dup, 2);
    assert.equal(env.payload.z, 1);
  });

  it('trims only the whitespace around the raw body', () => {
    const raw = '\n  {"a": "x"}\r\n';
    const text = buildEnvelope('evt_1', info, JSON.parse(raw) as Record<string, unknown>, raw);
    assert.ok(text.endsWith('"payload":{"a": "x"}}'), text);
  });

  it('is valid JSON when the message and template values need escaping', () => {
    const raw = '{"sender":{"name":"\\"quoted\\" \\\\ back\\nline \\u2028 </script>"},"u":"ü"}';
    const env = envelope(raw, 'by {{sender.name}} {{u}}');
    assert.equal(env.message, 'by "quoted" \\ back\nline \u2028 </script> ü');
    assert.deepEqual(env.payload, JSON.parse(raw));
  });

  it('puts the payload last and has no other keys', () => {
    const text = buildEnvelope('evt_9', { ...info, action: 'agent' }, { message: 'm' }, '{"message":"m"}');
    assert.equal(
      text,
      '{"id":"evt_9","action":"agent","endpoint":"/webhook/github","receivedAt":"2024-05-06T07:08:09.123Z","message":"m","payload":{"message":"m"}}',
    );
  });

  it('prepareEnvelope renders now and adds the id later, byte for byte what buildEnvelope gives', () => {
    const raw = '{"sender":{"name":"Ada"},"n":[1,2]}';
    const body = JSON.parse(raw) as Record<string, unknown>;
    const full = {
      ...info,
      template: compileTemplate('hi {{sender.name}} {{n}}'),
      extra: { channel: { name: 'c' }, from: null },
    };
    let reads = 0;
    const counting = new Proxy(body, { get: (t, k) => (reads++, Reflect.get(t, k)) });
    const withId = prepareEnvelope(full, counting, raw);
    const readsWhenPrepared = reads;
    assert.equal(withId('evt_2'), buildEnvelope('evt_2', full, body, raw));
    assert.equal(reads, readsWhenPrepared, 'adding the id reads nothing of the body again');
    assert.equal(withId('evt_"q"'), buildEnvelope('evt_"q"', full, body, raw), 'the id is JSON-escaped');
    assert.deepEqual(Object.keys(JSON.parse(withId('evt_3'))), [
      'id',
      'action',
      'endpoint',
      'receivedAt',
      'channel',
      'from',
      'message',
      'payload',
    ]);
  });

  it('a template that renders empty still sets message (to "")', () => {
    const env = envelope('{"message":"from body"}', '{{missing}}');
    assert.equal(env.message, '');
  });
});
