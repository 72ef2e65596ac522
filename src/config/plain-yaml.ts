// A fast reader for the plain YAML that config files are written in: block mappings and sequences,
// one-line flow collections, plain and simply quoted scalars, comments. It gives up (undefined) on
// anything else and on anything wrong, and the caller parses with the yaml library, which keeps
// lines and columns for the error messages; where it answers, it answers what that parse would.

/**
 * The plain document in `text`, equal to what yaml's `parseDocument(text, { uniqueKeys: true,
 * merge: true }).toJS()` returns for it under the YAML 1.2 core schema, or undefined when the text
 * is outside the subset read here or is not valid YAML. The subset: a root block mapping; keys that
 * are plain words (`[A-Za-z_][A-Za-z0-9_-]*`, not null/true/false in any spelling, not `__proto__`),
 * each once per mapping; block sequences, including indentless ones under a key; one-line flow
 * sequences and mappings; plain scalars on one line; quoted scalars on one line without escapes.
 * Given up on: tabs, control characters, a CR but in CRLF, a BOM or line separator in the text;
 * directives and document markers; anchors, aliases, tags, merge keys, block scalars, multi-line
 * scalars, complex or quoted keys, compact nested sequences (`- - a`), empty flow entries.
 *
 * Why: the yaml library builds a document of nodes with positions first, about 18 us per line
 * (2,000 services of 4 reals, 45,000 lines: 0.8 s on the daemon's main thread); this reads such a
 * file in about 40 ms (bench/micro/config-load.js).
 */
export function parsePlainYaml(text: string): Record<string, unknown> | undefined {
  if (UNREAD_CHARS.test(text)) return undefined;
  // CRLF line ends are line ends; a CR anywhere else is left to the yaml library.
  if (text.includes('\r') && LONE_CR.test(text)) return undefined;
  try {
    const reader = new PlainYamlReader(text);
    return reader.document();
  } catch (error) {
    if (error === NOT_PLAIN) return undefined;
    throw error;
  }
}

/** Thrown (never outside this module) where the text leaves the subset; parsePlainYaml returns undefined. */
const NOT_PLAIN: unique symbol = Symbol('not plain YAML');

// Characters the yaml library treats specially or refuses outside printable text: tabs (allowed as
// separators in some places only), C0/C1 controls but LF and CR, DEL, line/paragraph separators, a
// BOM (the caller drops a leading one), lone surrogates and the non-characters U+FFFE/U+FFFF.
const UNREAD_CHARS = /[\x00-\x09\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff\ufffe\uffff]/;
const LONE_CR = /\r(?!\n)/;
/** Longest key read here; yaml takes at most 1024 characters before an implicit key's `:`. */
const MAX_KEY_CHARS = 100;
/** A flow mapping key: a plain word, then `:` and a space. */
const FLOW_KEY = /[A-Za-z_][A-Za-z0-9_-]{0,99}: +/y;
/** Words yaml reads as null or a boolean, and the one key a plain object cannot take by assignment. */
const RESERVED_KEYS = new Set(['null', 'Null', 'NULL', 'true', 'True', 'TRUE', 'false', 'False', 'FALSE', '__proto__']);
/** Characters that cannot start a plain scalar here (YAML 1.2 c-indicator, less `-` which is handled alone). */
const INDICATOR_START = /^[?:,[\]{}#&*!|>'"%@`]/;
/** A comment after a value: `#` after a space (`a#b` is text). */
const AFTER_VALUE = /^(?: +#.*| *)$/;

// The YAML 1.2 core schema, as the yaml library (2.x) resolves plain scalars: its tests, in its order.
const CORE_NULL = /^(?:~|[Nn]ull|NULL)?$/;
const CORE_BOOL = /^(?:[Tt]rue|TRUE|[Ff]alse|FALSE)$/;
const CORE_INT_OCT = /^0o[0-7]+$/;
const CORE_INT = /^[-+]?[0-9]+$/;
const CORE_INT_HEX = /^0x[0-9a-fA-F]+$/;
const CORE_FLOAT_NAN = /^(?:[-+]?\.(?:inf|Inf|INF)|\.nan|\.NaN|\.NAN)$/;
const CORE_FLOAT_EXP = /^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$/;
const CORE_FLOAT = /^[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*)$/;
/** First characters of every plain scalar the core schema does not read as a string. */
const CORE_NON_STRING_START = /^[-+.~0-9nNtTfF]|^$/;

/** A plain scalar's value under the core schema (the yaml library's tag tests and resolvers). */
export function resolvePlainScalar(text: string): unknown {
  if (!CORE_NON_STRING_START.test(text)) return text;
  if (CORE_NULL.test(text)) return null;
  if (CORE_BOOL.test(text)) return text[0] === 't' || text[0] === 'T';
  if (CORE_INT_OCT.test(text)) return parseInt(text.substring(2), 8);
  if (CORE_INT.test(text)) return parseInt(text, 10);
  if (CORE_INT_HEX.test(text)) return parseInt(text.substring(2), 16);
  if (CORE_FLOAT_NAN.test(text)) return text.slice(-3).toLowerCase() === 'nan' ? NaN : text[0] === '-' ? -Infinity : Infinity;
  if (CORE_FLOAT_EXP.test(text) || CORE_FLOAT.test(text)) return parseFloat(text);
  return text;
}

/** Reads the text line by line; every method either consumes what it reads or throws NOT_PLAIN. */
class PlainYamlReader {
  private readonly lines: string[];
  private index = 0;
  /** The current content line (blank and comment-only lines skipped): its indent in spaces and its text from there on, trailing spaces cut. */
  private indent = -1;
  private content = '';

  constructor(text: string) {
    this.lines = text.split('\n');
    this.skipBlank();
  }

  document(): Record<string, unknown> | undefined {
    // Empty documents and root scalars or sequences are rare and cheap: left to the yaml library.
    if (this.indent < 0 || blockKeyEnd(this.content) < 0) return undefined;
    const root = this.mapping(this.indent);
    if (this.indent >= 0) throw NOT_PLAIN; // something at a lesser indent than the root
    return root;
  }

  /** Moves to the next content line; `indent` is -1 at the end of the text. */
  private advance(): void {
    this.index++;
    this.skipBlank();
  }

  private skipBlank(): void {
    const lines = this.lines;
    for (; this.index < lines.length; this.index++) {
      const line = lines[this.index] as string;
      // A CR here ends a CRLF line end (parsePlainYaml gave up on any other).
      const end = line.charCodeAt(line.length - 1) === 0x0d ? line.length - 1 : line.length;
      let spaces = 0;
      while (line.charCodeAt(spaces) === 0x20) spaces++;
      if (spaces >= end || line.charCodeAt(spaces) === 0x23 /* # */) continue;
      // Directives and document markers (---, ...) start at column 0.
      if (spaces === 0 && (line[0] === '%' || line.startsWith('---') || line.startsWith('...'))) throw NOT_PLAIN;
      this.indent = spaces;
      this.content = trimSpacesEnd(line.slice(spaces, end));
      return;
    }
    this.indent = -1;
    this.content = '';
  }

  /** A block mapping whose keys stand at `indent`; the current line is its first key. */
  private mapping(indent: number): Record<string, unknown> {
    const map: Record<string, unknown> = {};
    while (this.indent === indent) {
      const content = this.content;
      const colon = blockKeyEnd(content);
      if (colon < 0) throw NOT_PLAIN; // a sequence entry, a quoted or complex key, or no key at all
      const key = content.slice(0, colon);
      if (RESERVED_KEYS.has(key) || Object.hasOwn(map, key)) throw NOT_PLAIN;
      let start = colon + 1;
      while (content.charCodeAt(start) === 0x20) start++;
      const rest = content.slice(start);
      if (rest === '' || rest[0] === '#') {
        this.advance();
        map[key] = this.nestedValue(indent, true);
      } else {
        map[key] = this.inlineValue(rest);
        this.advance();
        this.noContinuation(indent);
      }
    }
    if (this.indent > indent) throw NOT_PLAIN;
    return map;
  }

  /** A block sequence whose `-` stand at `indent`; the current line is its first entry. */
  private sequence(indent: number): unknown[] {
    const list: unknown[] = [];
    while (this.indent === indent && isEntry(this.content)) {
      const rest = this.content.slice(1).replace(LEADING_SPACES, '');
      if (rest === '' || rest[0] === '#') {
        this.advance();
        list.push(this.nestedValue(indent, false));
      } else if (isEntry(rest)) {
        throw NOT_PLAIN; // `- - a`
      } else if (blockKeyEnd(rest) > 0) {
        // `- key: value`: a mapping whose keys stand at the column of `key`.
        this.indent = indent + this.content.length - rest.length;
        this.content = rest;
        list.push(this.mapping(this.indent));
      } else {
        list.push(this.inlineValue(rest));
        this.advance();
        this.noContinuation(indent);
      }
    }
    if (this.indent > indent) throw NOT_PLAIN;
    return list;
  }

  /**
   * The value of a key or entry left empty on its own line: a block collection or a scalar on the
   * lines below, more indented than `parent`; an indentless sequence at `parent` under a key; else null.
   */
  private nestedValue(parent: number, indentlessAllowed: boolean): unknown {
    if (this.indent > parent) {
      const indent = this.indent;
      if (isEntry(this.content)) return this.sequence(indent);
      if (blockKeyEnd(this.content) > 0) return this.mapping(indent);
      const value = this.inlineValue(this.content);
      this.advance();
      this.noContinuation(parent);
      return value;
    }
    if (indentlessAllowed && this.indent === parent && isEntry(this.content)) return this.sequence(parent);
    return null;
  }

  /** After a one-line value: a line indented past `indent` would continue it (a multi-line scalar) or be an error. */
  private noContinuation(indent: number): void {
    if (this.indent > indent) throw NOT_PLAIN;
  }

  /** A value written on the line of its key or `-`: a flow collection, a quoted or a plain scalar, maybe a comment after. */
  private inlineValue(text: string): unknown {
    const first = text[0];
    if (first === '[' || first === '{') {
      const flow = new FlowReader(text);
      const value = flow.value();
      if (!AFTER_VALUE.test(text.slice(flow.pos))) throw NOT_PLAIN;
      return value;
    }
    if (first === '"' || first === "'") {
      const end = quotedEnd(text, 0);
      if (!AFTER_VALUE.test(text.slice(end))) throw NOT_PLAIN;
      return text.slice(1, end - 1);
    }
    if (INDICATOR_START.test(text) || (first === '-' && (text.length === 1 || text[1] === ' '))) throw NOT_PLAIN;
    const comment = text.indexOf(' #');
    const plain = comment < 0 ? text : trimSpacesEnd(text.slice(0, comment));
    // `a: b: c` and `a: b:` are errors (a mapping cannot be a plain value on one line).
    if (plain.includes(': ') || plain.endsWith(':')) throw NOT_PLAIN;
    return resolvePlainScalar(plain);
  }
}

/**
 * Where the `:` of a block mapping key stands: the text starts with a plain word
 * (`[A-Za-z_][A-Za-z0-9_-]*`, at most MAX_KEY_CHARS) followed by `:` and a space or the end; else -1.
 */
function blockKeyEnd(text: string): number {
  let i = 0;
  let c = text.charCodeAt(0);
  if (!((c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || c === 0x5f)) return -1;
  for (i = 1; i < text.length && i <= MAX_KEY_CHARS; i++) {
    c = text.charCodeAt(i);
    if (c === 0x3a /* : */) {
      const next = text.charCodeAt(i + 1);
      return i + 1 === text.length || next === 0x20 ? i : -1;
    }
    if (!((c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || (c >= 0x30 && c <= 0x39) || c === 0x5f || c === 0x2d)) return -1;
  }
  return -1;
}

const LEADING_SPACES = /^ +/;

/** `text` without the spaces at its end: YAML's white space is space and tab only (no NBSP, unlike String.trimEnd). */
function trimSpacesEnd(text: string): string {
  let end = text.length;
  while (end > 0 && text.charCodeAt(end - 1) === 0x20) end--;
  return end === text.length ? text : text.slice(0, end);
}

/** `-` alone or followed by a space: a block sequence entry. */
function isEntry(text: string): boolean {
  return text[0] === '-' && (text.length === 1 || text[1] === ' ');
}

/** The position after the quoted scalar starting at text[start]; only quotes without escapes (`\` or `''`) are read. */
function quotedEnd(text: string, start: number): number {
  const quote = text[start] as string;
  const end = text.indexOf(quote, start + 1);
  if (end < 0) throw NOT_PLAIN; // runs on to the next line, or is an error
  if (quote === '"' ? text.slice(start + 1, end).includes('\\') : text[end + 1] === "'") throw NOT_PLAIN;
  return end + 1;
}

/** One flow collection on one line: `[a, b]`, `{ k: v, k2: [1, 2] }`. */
class FlowReader {
  pos = 0;
  constructor(private readonly text: string) {}

  value(): unknown {
    this.spaces();
    const c = this.text[this.pos];
    if (c === '[') return this.sequence();
    if (c === '{') return this.mapping();
    if (c === '"' || c === "'") {
      const start = this.pos;
      this.pos = quotedEnd(this.text, start);
      return this.text.slice(start + 1, this.pos - 1);
    }
    return this.plain();
  }

  private sequence(): unknown[] {
    const list: unknown[] = [];
    this.pos++;
    this.spaces();
    if (this.text[this.pos] === ']') {
      this.pos++;
      return list;
    }
    for (;;) {
      list.push(this.value());
      if (this.endOrNext(']')) return list;
    }
  }

  private mapping(): Record<string, unknown> {
    const map: Record<string, unknown> = {};
    this.pos++;
    this.spaces();
    if (this.text[this.pos] === '}') {
      this.pos++;
      return map;
    }
    for (;;) {
      FLOW_KEY.lastIndex = this.pos;
      const match = FLOW_KEY.exec(this.text);
      if (match === null) throw NOT_PLAIN;
      const key = match[0].slice(0, match[0].indexOf(':'));
      if (RESERVED_KEYS.has(key) || Object.hasOwn(map, key)) throw NOT_PLAIN;
      this.pos += match[0].length;
      const c = this.text[this.pos];
      if (c === ',' || c === '}' || c === undefined) throw NOT_PLAIN; // an empty value
      map[key] = this.value();
      if (this.endOrNext('}')) return map;
    }
  }

  /** After an entry: the closing bracket (true) or a comma and another entry (false); anything else gives up. */
  private endOrNext(close: string): boolean {
    this.spaces();
    const c = this.text[this.pos];
    this.pos++;
    if (c === close) return true;
    if (c !== ',') throw NOT_PLAIN;
    this.spaces();
    const next = this.text[this.pos];
    if (next === ',' || next === ']' || next === '}' || next === undefined) throw NOT_PLAIN; // empty or trailing entry
    return false;
  }

  /** A plain scalar in a flow collection: up to the next `,`, bracket or brace. */
  private plain(): unknown {
    const text = this.text;
    let end = this.pos;
    while (end < text.length && !',[]{}'.includes(text[end] as string)) end++;
    const plain = trimSpacesEnd(text.slice(this.pos, end));
    this.pos = end;
    if (plain === '' || INDICATOR_START.test(plain) || plain.includes(' #') || plain.includes(': ') || plain.endsWith(':')) throw NOT_PLAIN;
    // `-` may start a number; other plain scalars starting with it are left to the yaml library.
    if (plain[0] === '-' && !/^-[0-9]/.test(plain)) throw NOT_PLAIN;
    return resolvePlainScalar(plain);
  }

  private spaces(): void {
    while (this.text.charCodeAt(this.pos) === 0x20) this.pos++;
  }
}
