import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { cutToBytes, decodeEntities, textBody } from '../../src/integrations/gmail/mailbox.js';
import { decodeNotification } from '../../src/integrations/gmail/run.js';
import { historyIdAfter } from '../../src/integrations/gmail/state.js';

const b64 = (text: string) => Buffer.from(text, 'utf8').toString('base64url');

describe('gmail: the pure parts of reading a mailbox', () => {
  it('textBody prefers text/plain at any depth, else the HTML as text, else empty', () => {
    const plainAndHtml = {
      mimeType: 'multipart/mixed',
      parts: [
        {
          mimeType: 'multipart/alternative',
          parts: [
            { mimeType: 'text/html', body: { data: b64('<p>html</p>') } },
            { mimeType: 'text/plain', body: { data: b64('plain text') } },
          ],
        },
      ],
    };
    assert.equal(textBody(plainAndHtml), 'plain text');
    const htmlOnly = {
      mimeType: 'text/html',
      body: { data: b64('<style>p{}</style><p>Hello <b>Ana</b></p><script>x()</script>') },
    };
    assert.equal(textBody(htmlOnly), 'Hello Ana');
    assert.equal(textBody({ mimeType: 'image/png', body: { data: b64('png') } }), '');
    assert.equal(textBody(undefined), '');
  });

  it('cutToBytes keeps whole UTF-8 characters and says when it cut', () => {
    assert.deepEqual(cutToBytes('short', 100), { body: 'short' });
    const cut = cutToBytes('aé€😀', 6); // 1 + 2 + 3 bytes fit; the emoji (4) does not
    assert.deepEqual(cut, { body: 'aé€', bodyTruncated: true });
    assert.deepEqual(cutToBytes('€€', 4), { body: '€', bodyTruncated: true }, 'never half a character');
  });

  it('decodeEntities turns Gmail snippets into text', () => {
    assert.equal(
      decodeEntities('Tom &amp; Jerry &lt;b&gt; &quot;hi&quot; it&#39;s &#x1F600; &bogus;'),
      'Tom & Jerry <b> "hi" it\'s 😀 &bogus;',
    );
    // An email's text is the sender's: names of Object.prototype are not entities.
    assert.equal(
      decodeEntities('&constructor; &toString; &__proto__; &hasOwnProperty; &amp;'),
      '&constructor; &toString; &__proto__; &hasOwnProperty; &',
    );
  });

  it("decodeNotification accepts Gmail's data (historyId as number or string) and nothing else", () => {
    const encode = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64');
    assert.deepEqual(decodeNotification(encode({ emailAddress: 'a@x.com', historyId: 1234 })), {
      emailAddress: 'a@x.com',
      historyId: '1234',
    });
    assert.deepEqual(decodeNotification(encode({ emailAddress: 'a@x.com', historyId: '99999999999999999999' })), {
      emailAddress: 'a@x.com',
      historyId: '99999999999999999999',
    });
    for (const bad of [
      undefined,
      'not base64 json',
      encode({ emailAddress: 'a@x.com' }),
      encode({ emailAddress: 1, historyId: 1 }),
      encode({ emailAddress: 'a@x.com', historyId: '12a' }),
    ]) {
      assert.equal(decodeNotification(bad), undefined);
    }
  });

  it('history ids compare as 64-bit numbers, not strings', () => {
    assert.equal(historyIdAfter('10', '9'), true);
    assert.equal(historyIdAfter('9', '10'), false);
    assert.equal(historyIdAfter('18446744073709551615', '18446744073709551614'), true);
    assert.equal(historyIdAfter('5', null), true);
  });
});
