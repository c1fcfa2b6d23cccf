import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

/** The repository's root (this file is test/docs/markdown.ts). */
export const ROOT = path.resolve(import.meta.dirname, '../..');

/** README.md, CHANGELOG.md and every page under docs/, as paths relative to ROOT. */
export function docFiles(): string[] {
  const pages: string[] = [];
  const walk = (dir: string): void => {
    for (const entry of readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
      const rel = path.posix.join(dir, entry.name);
      if (entry.isDirectory()) walk(rel);
      else if (entry.name.endsWith('.md')) pages.push(rel);
    }
  };
  walk('docs');
  return ['README.md', 'CHANGELOG.md', ...pages.sort()];
}

export function readDoc(file: string): string {
  return readFileSync(path.join(ROOT, file), 'utf8');
}

export interface CodeBlock {
  lang: string;
  /** 1-based line number of the block's first content line. */
  line: number;
  lines: string[];
}

/** A page split into its fenced code blocks and its prose lines (code blocks blanked out, line numbers kept). */
export function splitFences(text: string): { prose: string[]; blocks: CodeBlock[] } {
  const prose: string[] = [];
  const blocks: CodeBlock[] = [];
  let open: { fence: string; block: CodeBlock } | undefined;
  text.split('\n').forEach((line, i) => {
    const fence = /^\s*(`{3,}|~{3,})\s*([\w+-]*)/.exec(line);
    if (open) {
      if (fence && fence[1]!.startsWith(open.fence) && line.trim() === fence[1]) open = undefined;
      else open.block.lines.push(line);
      prose.push('');
    } else if (fence) {
      open = { fence: fence[1]!, block: { lang: fence[2]!.toLowerCase(), line: i + 2, lines: [] } };
      blocks.push(open.block);
      prose.push('');
    } else prose.push(line);
  });
  return { prose, blocks };
}

/** A prose line without its inline code spans (links inside backticks are not links). */
export function withoutCodeSpans(line: string): string {
  return line.replace(/(`+)(?:(?!\1).)+?\1/g, '');
}

/** The inline code spans of a prose line, without their backticks. */
export function codeSpans(line: string): string[] {
  return [...line.matchAll(/(`+)((?:(?!\1).)+?)\1/g)].map((m) => m[2]!.trim());
}

/**
 * Heading anchors as GitHub makes them (github-slugger): the heading's text as rendered, lower-cased,
 * everything but letters, marks, digits, connector punctuation (`_`), spaces and hyphens dropped,
 * each space a hyphen; a repeated slug gets -1, -2, ….
 */
export function headingAnchors(text: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const line of splitFences(text).prose) {
    const heading = /^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$/.exec(line);
    if (!heading) continue;
    const rendered = heading[1]!
      .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1') // links and images: their text
      .replace(/<[^>]+>/g, '') // inline HTML tags
      .replace(/`/g, '')
      .replace(/\*/g, '');
    const base = rendered
      .toLowerCase()
      .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
      .replace(/ /g, '-');
    const count = seen.get(base) ?? 0;
    seen.set(base, count + 1);
    anchors.add(count === 0 ? base : `${base}-${count}`);
  }
  return anchors;
}
