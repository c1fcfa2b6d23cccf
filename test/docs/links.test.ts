import assert from 'node:assert/strict';
import { existsSync, statSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { docFiles, headingAnchors, readDoc, ROOT, splitFences, withoutCodeSpans } from './markdown.js';

/**
 * docs/configuration.md is generated from the config schema by `npm run docs`. Until that page is
 * committed, links to it (and to its anchors) are not checked; once it exists they are, like any other.
 */
const GENERATED_PAGES = new Set(['docs/configuration.md']);

interface Link {
  file: string;
  line: number;
  target: string;
}

/** Every link of a page outside code: inline `[text](target)`, images, and reference definitions. */
function linksOf(file: string): Link[] {
  const links: Link[] = [];
  splitFences(readDoc(file)).prose.forEach((raw, i) => {
    const line = withoutCodeSpans(raw);
    for (const m of line.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g))
      links.push({ file, line: i + 1, target: m[1]! });
    const definition = /^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)/.exec(line);
    if (definition) links.push({ file, line: i + 1, target: definition[1]! });
  });
  return links;
}

const anchorsByFile = new Map<string, Set<string>>();
function anchorsOf(file: string): Set<string> {
  let anchors = anchorsByFile.get(file);
  if (!anchors) anchorsByFile.set(file, (anchors = headingAnchors(readDoc(file))));
  return anchors;
}

/** Why a relative link does not resolve, or undefined when it does. */
function problem(link: Link): string | undefined {
  const [pathPart = '', anchor] = link.target.split('#', 2) as [string, string | undefined];
  const target =
    pathPart === ''
      ? link.file
      : path.posix.normalize(path.posix.join(path.posix.dirname(link.file), decodeURIComponent(pathPart)));
  if (target.startsWith('..')) return `${target} is outside the repository`;
  if (GENERATED_PAGES.has(target) && !existsSync(path.join(ROOT, target))) return undefined;
  if (!existsSync(path.join(ROOT, target))) return `${target} does not exist`;
  if (anchor === undefined || anchor === '') return undefined;
  if (!target.endsWith('.md') || statSync(path.join(ROOT, target)).isDirectory())
    return `#${anchor} on ${target}, which is not a Markdown page`;
  if (!anchorsOf(target).has(decodeURIComponent(anchor).toLowerCase())) return `${target} has no heading #${anchor}`;
  return undefined;
}

describe('docs: every relative link and anchor resolves', () => {
  for (const file of docFiles()) {
    it(file, () => {
      const broken = linksOf(file)
        .filter((link) => !/^[a-z][a-z0-9+.-]*:/i.test(link.target)) // http:, https:, mailto: …
        .map((link) => ({ link, why: problem(link) }))
        .filter((found) => found.why !== undefined)
        .map(({ link, why }) => `${link.file}:${link.line}: (${link.target}) ${why}`);
      assert.deepEqual(broken, []);
    });
  }

  it('the heading slugs follow GitHub', () => {
    const anchors = headingAnchors(
      '# The /api/ pipeline and status codes\n## Verifying the sender: `secret` or `verify`\n' +
        '### Rotating GATEHOUSE_SECRET_KEY\n## Notes\n## Notes\n```\n# not a heading\n```\n## [0.1.0] - 2026-11-26\n',
    );
    assert.deepEqual(
      [...anchors],
      [
        'the-api-pipeline-and-status-codes',
        'verifying-the-sender-secret-or-verify',
        'rotating-gatehouse_secret_key',
        'notes',
        'notes-1',
        '010---2026-11-26',
      ],
    );
  });

  it('README links to every page under docs/', () => {
    const linked = new Set(linksOf('README.md').map((link) => path.posix.normalize(link.target.split('#')[0]!)));
    const pages = docFiles().filter((file) => file.startsWith('docs/'));
    assert.deepEqual(
      pages.filter((page) => !linked.has(page)),
      [],
    );
  });
});
