// How a problem shows what the file wrote: values quoted and cut (describe), keys in a path
// (keyPath). Apart from validate.ts so that problem-positions.ts can find a path's key again by the
// same text, without importing the validator.

/** Longest quoted text a message shows: a binary or pasted file must not come back whole. */
const MAX_SHOWN_CHARS = 60;
/** A key shown bare in a problem's path: a word short enough to show whole. Any other key is quoted (keyPath). */
const PLAIN_KEY = new RegExp(`^[A-Za-z0-9_-]{1,${MAX_SHOWN_CHARS}}$`);

/**
 * A value as the operator wrote it: strings quoted (escaped, cut to about MAX_SHOWN_CHARS with
 * the full length named), numbers bare, containers by kind.
 */
export function describe(value: unknown): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'an empty value';
  if (typeof value === 'string') return quoteShort(value);
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object') return 'a mapping';
  return String(value);
}

function quoteShort(text: string): string {
  const quoted = escapeText(text);
  if (quoted.length <= MAX_SHOWN_CHARS) return `"${quoted}"`;
  // Cut by characters as shown (an escaped control byte counts as its escape), never inside a surrogate pair.
  let shown = '';
  for (const char of text) {
    const escaped = escapeText(char);
    if (shown.length + escaped.length > MAX_SHOWN_CHARS) break;
    shown += escaped;
  }
  return `"${shown}"... (${Array.from(text).length} characters)`;
}

/**
 * Text as it goes between quotes in a message: JSON's escapes, plus the DEL, C1 controls (0x9b is
 * a terminal's CSI) and U+2028/U+2029 that JSON.stringify leaves as they are.
 */
function escapeText(text: string): string {
  return JSON.stringify(text)
    .slice(1, -1)
    .replace(/[\x7f-\x9f\u2028\u2029]/g, (char) => `\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/**
 * The path of a key the file wrote (`services[0].schedular`): a plain word as it is, anything else
 * quoted, escaped and cut as describe() shows values (`services[0]."bad\\nkey"`), so an odd key
 * can neither break the one-line-per-problem output nor send control bytes to a terminal.
 */
export function keyPath(path: string, key: string): string {
  const shown = PLAIN_KEY.test(key) ? key : quoteShort(key);
  return path === '' ? shown : `${path}.${shown}`;
}
