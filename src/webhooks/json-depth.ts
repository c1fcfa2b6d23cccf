const QUOTE = 0x22; // "
const BACKSLASH = 0x5c; // \
const OPEN_BRACKET = 0x5b; // [
const CLOSE_BRACKET = 0x5d; // ]
const OPEN_BRACE = 0x7b; // {
const CLOSE_BRACE = 0x7d; // }

/**
 * Whether JSON text nests arrays and objects more than `maxDepth` levels deep (a top-level object
 * or array is level 1). One linear pass counting `[` and `{` outside strings (inside one, `\`
 * escapes the next character), with no recursion and nothing allocated: safe to run on any input
 * before JSON.parse, so that nothing recursive (JSON.stringify, template rendering) ever meets a
 * value deeper than the limit. For text that is not JSON the answer means nothing; JSON.parse
 * refuses such text anyway.
 */
export function jsonNestsDeeperThan(text: string, maxDepth: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
    } else if (c === QUOTE) {
      inString = true;
    } else if (c === OPEN_BRACKET || c === OPEN_BRACE) {
      if (++depth > maxDepth) return true;
    } else if (c === CLOSE_BRACKET || c === CLOSE_BRACE) {
      depth--;
    }
  }
  return false;
}
