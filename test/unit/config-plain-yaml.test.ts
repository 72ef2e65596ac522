// The fast reader of plain config YAML (src/config/plain-yaml.ts): where it answers, its document is
// the yaml library's to the key order; where the text is outside its subset or wrong, it gives up,
// so every problem (YAML or config) reads exactly as it did through the yaml library alone.

import { readFileSync } from 'node:fs';
import { parseDocument } from 'yaml';
import { describe, expect, it } from 'vitest';
import { generateConfigText } from '../../bench/micro/config-shapes.js';
import { parsePlainYaml, resolvePlainScalar } from '../../src/config/plain-yaml.js';
import { locateProblems } from '../../src/config/problem-positions.js';
import type { ConfigProblem } from '../../src/config/types.js';
import { formatProblems, parseConfigText, parseConfigYaml, parseConfigYamlDocument, validateConfig, type ConfigResult } from '../../src/config/validate.js';
import { mulberry32 } from '../support/prng.js';

const YAML_ERROR = Symbol('yaml error');

/** What the yaml library makes of `text` with the options parseConfigYaml gives it, or YAML_ERROR. */
function yamlLibrary(text: string): unknown {
  const doc = parseDocument(text, { uniqueKeys: true, merge: true });
  if (doc.errors.length > 0) return YAML_ERROR;
  try {
    // Aliases are bounded by parseConfigYaml's own guard (yaml-document.ts), not the library's use count.
    return doc.toJS({ maxAliasCount: -1 });
  } catch {
    return YAML_ERROR;
  }
}

/** Every key in document order, with its path: toStrictEqual does not compare key order, problems are reported in it. */
function keyOrder(value: unknown, path = ''): string[] {
  if (Array.isArray(value)) return value.flatMap((item, i) => keyOrder(item, `${path}[${i}]`));
  if (typeof value !== 'object' || value === null) return [];
  return Object.entries(value).flatMap(([key, item]) => [`${path}.${key}`, ...keyOrder(item, `${path}.${key}`)]);
}

/** True when the fast reader answered; then its answer must be the yaml library's, key order included. */
function readsAsYamlDoes(text: string): boolean {
  const fast = parsePlainYaml(text);
  if (fast === undefined) return false;
  const slow = yamlLibrary(text);
  if (slow === YAML_ERROR) throw new Error(`the fast reader answered for text the yaml library refuses:\n${text}`);
  expect(fast).toStrictEqual(slow);
  expect(keyOrder(fast)).toEqual(keyOrder(slow));
  return true;
}

/** The whole of parseConfigText as it was before the fast reader: the yaml library, then the validator, then the problems' positions. */
function throughYamlLibrary(text: string): ConfigResult {
  const source = text.startsWith('\uFEFF') ? text.slice(1) : text;
  const parsed = parseConfigYamlDocument(source);
  if (!parsed.ok) return parsed;
  const result = validateConfig(parsed.raw);
  return result.ok ? result : { ok: false, problems: locateProblems(source, result.problems) };
}

function expectSameResult(text: string): void {
  const result = parseConfigText(text);
  expect(result).toStrictEqual(throughYamlLibrary(text));
  if (!result.ok) expectPositionsAtTheirKeys(text, result.problems);
}

/**
 * Each position where its path's last key is written in the text (quoted or not), when that key is
 * a plain word, is in the file (not a `missing` one, which points at its parent) and not reached
 * through an alias; and every problem with a path into the file has a position but for those.
 */
function expectPositionsAtTheirKeys(text: string, problems: readonly ConfigProblem[]): void {
  const lines = (text.startsWith('\uFEFF') ? text.slice(1) : text).split('\n');
  for (const { path, message, position } of problems) {
    const lastKey = /(?:^|\.)([A-Za-z0-9_-]+)$/.exec(path)?.[1];
    const missing = message.startsWith('missing');
    if (position === undefined) {
      // Only `(file)`/`(yaml)`, a top-level key left out, or a key left to its default (a timeout longer than the interval).
      expect(path.startsWith('(') || (missing && !/[.[]/.test(path)) || / is longer than the interval /.test(message), `${path}: ${message}`).toBe(true);
      continue;
    }
    if (lastKey === undefined || missing || position.aliasLine !== undefined) continue;
    const at = (lines[position.line - 1] ?? '').slice(position.column - 1);
    // A key, then its `:`, or the `,` or `}` of a flow mapping entry with no value (`{ a, b: 1 }`).
    expect(at, `${path}: ${message}`).toMatch(new RegExp(`^["']?${lastKey}["']?\\s*(?:[:,}]|$)`));
  }
}

const EXAMPLE = readFileSync(new URL('../../examples/dsrlb.yaml', import.meta.url), 'utf8');
const DEPLOY_SAMPLE = readFileSync(new URL('../../deploy/linux/dsrlb.yaml.sample', import.meta.url), 'utf8');

const SMALL = `interface: eth0
flowTable:
  tcpTimeouts: { syn: 60s, established: 900s, fin: 120s }   # IPVS-like
metrics: { listen: 127.0.0.1:9742 }
admin:   { listen: "[::1]:9743", tokenFile: '/etc/dsrlb/admin token' }
services:
  - name: web
    vip: 203.0.113.10
    port: 80
    healthCheck:
      type: http
      expectStatus: [200, 204]
      interval: 2s
    reals:
      - address: 10.0.1.11
        weight: 100            # a comment
      - { address: 10.0.1.12, state: drain }
  - vip: 2001:db8::10
    port: 53
    protocol: udp
    reals: []
`;

describe('the fast reader answers as the yaml library does', () => {
  it('reads the shipped example, the deploy sample and generated large configs, all of them', () => {
    for (const text of [
      EXAMPLE,
      DEPLOY_SAMPLE,
      SMALL,
      generateConfigText({ services: 8, realsPerService: 40 }),
      generateConfigText({ services: 60, realsPerService: 4, comments: false }),
    ]) {
      expect(readsAsYamlDoes(text)).toBe(true);
    }
  });

  it('reads CRLF line ends as line ends', () => {
    expect(readsAsYamlDoes(SMALL.replaceAll('\n', '\r\n'))).toBe(true);
    expect(readsAsYamlDoes(EXAMPLE.replaceAll('\n', '\r\n'))).toBe(true);
  });

  // Plain scalars as the YAML 1.2 core schema reads them, and text that merely looks like a number.
  const SCALARS = [
    '10.0.1.11', '2001:db8::5', '::1', '127.0.0.1:9742', '/etc/dsrlb/admin.token', '60s', '250ms', '1h', 'eth0', 'web',
    '0', '7', '-7', '+7', '-0', '007', '080', '65535', '99999999999999999999', '1_000', '0x1F', '0X1F', '0x', '0o17', '0o8', '0O17',
    '1.5', '1.', '.5', '-.5', '+1.50', '1e3', '1E-3', '-1.5e+2', '1e', 'e3', '.inf', '-.Inf', '+.INF', '.nan', '.NaN', 'nan', 'inf',
    'null', 'Null', 'NULL', 'nULL', '~', 'true', 'True', 'TRUE', 'tRUE', 'false', 'False', 'FALSE', 'yes', 'no', 'on', 'off', 'y', 'n',
    '-x', '--x', 'a-b', 'a:b', 'a::', 'a#b', 'a #b', 'a  b', 'a, b', 'a[0]', 'a{b}', 'x\u00a0', '\u00a0x', 'caf\u00e9', '\u{1f600}',
    '"quoted"', '"with # hash"', '"a: b"', '"esc\\"aped"', "'single'", "'it''s'", "''", '""', '"[::1]:9743"', '/usr/bin/check "$DSRLB_REAL"',
    '...', '.', '-', '?', ':', '?x', ':x', '@x', '`x', '%x', '!x', '&x', '*x', '|', '>', '#x',
  ];

  it('resolves plain scalars by the core schema, in block and flow collections alike', () => {
    let answered = 0;
    for (const scalar of SCALARS) {
      for (const text of [`k: ${scalar}\n`, `k:\n  - ${scalar}\n`, `k: [${scalar}]\n`, `k: { a: ${scalar} }\n`, `k: [1, ${scalar}, 2]   # c\n`, `k:\n  ${scalar}\n`]) {
        if (readsAsYamlDoes(text)) answered++;
      }
    }
    // Most are read; the rest (indicators, escapes, flow-unsafe text) go to the yaml library.
    expect(answered).toBeGreaterThan(SCALARS.length * 4);
    for (const [text, value] of [
      ['10.0.1.11', '10.0.1.11'], ['0x1F', 31], ['0o17', 15], ['007', 7], ['-0', -0], ['1e3', 1000], ['.inf', Infinity], ['~', null], ['True', true], ['', null],
    ] as const) {
      expect(resolvePlainScalar(text)).toStrictEqual(value);
    }
  });

  // Layouts the reader takes, each read as the yaml library reads it.
  const READ = [
    'a: 1\nb:\n  c: 2\n  d:\n    - x\n    - y\n',
    'services:\n- name: a\n  reals:\n  - address: 10.0.0.1\n  - address: 10.0.0.2\n- name: b\n',
    'a:\n  -\n    b: 1\n  -\n  - c\n',
    'a:\n  - b: 1\n    c: [1, 2]\n    d: { e: f }\n  -   g: 2\n      h: 3\n',
    '  a: 1\n  b: 2\n',
    '# head\n\na: 1   # tail\n   # deep comment\n# low comment\nb:    # before the value\n\n  # between\n  c: d\n',
    'a:\n  b\n',
    'a: []\nb: {}\nc: [[], {}]\nd: { e: [1, [2, 3]], f: { g: h } }\n',
    'a:\nb: ~\nc: null\n',
    'x-note: free text here\nx_y: 1\nA-b_c: 2\n',
    'constructor: 1\ntoString: 2\nhasOwnProperty: 3\n',
    'a: "x"   # c\nb: \'y\'\nc: ["p", \'q\']\n',
  ];

  it('reads block and flow layouts, indentless sequences and comments anywhere', () => {
    for (const text of READ) expect(readsAsYamlDoes(text)).toBe(true);
  });

  // Left to the yaml library: outside the subset, or not valid YAML at all.
  const GIVEN_UP: readonly [string, string][] = [
    ['an anchor and an alias', 'a: &x 1\nb: *x\n'],
    ['a merge key', 'x-s: &s { a: 1 }\nb:\n  <<: *s\n'],
    ['a tag', 'a: !!str 1\n'],
    ['a block scalar', 'a: |\n  text\n'],
    ['a folded scalar', 'a: >\n  text\n'],
    ['a multi-line plain scalar', 'a: one\n  two\n'],
    ['a multi-line quoted scalar', 'a: "one\n  two"\n'],
    ['a multi-line flow sequence', 'a: [1,\n  2]\n'],
    ['an escape in double quotes', 'a: "x\\ty"\n'],
    ['a quote in single quotes', "a: 'it''s'\n"],
    ['a quoted key', '"a": 1\n'],
    ['a complex key', '? [a, b]\n: 1\n'],
    ['a flow key', '[a, b]: 1\n'],
    ['a duplicate key', 'a: 1\nb: 2\na: 3\n'],
    ['a duplicate key in a flow mapping', 'a: { b: 1, b: 2 }\n'],
    ['a duplicate nested key', 'a:\n  - b: 1\n    b: 2\n'],
    ['a document marker', '---\na: 1\n'],
    ['two documents', 'a: 1\n---\nb: 2\n'],
    ['a directive', '%YAML 1.2\n---\na: 1\n'],
    ['a tab', 'a:\t1\n'],
    ['a lone CR', 'a: 1\rb: 2\n'],
    ['a mapping as a plain value', 'a: b: c\n'],
    ['a compact nested sequence', 'a:\n  - - 1\n'],
    ['a __proto__ key', '__proto__: 1\n'],
    ['a key yaml reads as null', 'null: 1\n'],
    ['a key yaml reads as true', 'True: 1\n'],
    ['a numeric key', '1: a\n'],
    ['a trailing comma', 'a: [1, 2, ]\n'],
    ['an empty flow entry', 'a: [1, , 2]\n'],
    ['an empty flow value', 'a: { b: }\n'],
    ['a flow key without a space after the colon', 'a: { b:1 }\n'],
    ['a comment in a flow collection', 'a: [1 #c\n  ]\n'],
    ['text after a flow collection', 'a: [1] x\n'],
    ['a sequence entry where a key belongs', 'a: 1\n- b\n'],
    ['a deeper key after a value', 'a: 1\n  b: 2\n'],
    ['a shallower key', 'a:\n    b: 1\n  c: 2\n'],
    ['a root sequence', '- a\n- b\n'],
    ['a root scalar', 'just text\n'],
    ['an empty document', '# only a comment\n'],
    ['an unclosed flow sequence', 'a: [1, 2\n'],
    ['an unclosed quote', 'a: "x\n'],
    ['a key with a space before the colon', 'a : 1\n'],
    ['a key without a space after the colon', 'a:1\n'],
  ];

  it.each(GIVEN_UP)('gives up on %s', (_what, text) => {
    expect(parsePlainYaml(text)).toBeUndefined();
  });
});

describe('errors read as they did through the yaml library alone', () => {
  // The reader's answers feed the validator; its refusals go to the yaml library. Either way each
  // problem names its path and value, and a YAML problem its line and column, as before.
  const BROKEN: readonly [string, string][] = [
    ['a duplicate top-level key', 'interface: eth0\nservices: []\ninterface: eth1\n'],
    ['a duplicate key in a real', SMALL.replace('        weight: 100', '        weight: 100\n        weight: 5')],
    ['a duplicate key in a flow mapping', SMALL.replace('{ syn: 60s,', '{ syn: 60s, syn: 1s,')],
    ['a wrong type (a list for a port)', SMALL.replace('port: 80', 'port: [80]')],
    ['a wrong type (a quoted number)', SMALL.replace('port: 80', 'port: "80"')],
    ['a wrong type (a mapping for reals)', SMALL.replace('reals: []', 'reals: { address: 10.0.0.1 }')],
    ['a bad real address', SMALL.replace('10.0.1.11', '10.0.1.300')],
    ['a bad VIP', SMALL.replace('vip: 203.0.113.10', 'vip: 203.0.113')],
    ['an IPv6 address with a zone', SMALL.replace('2001:db8::10', 'fe80::1%eth0')],
    ['a loopback real', SMALL.replace('10.0.1.12', '127.0.0.1')],
    ['an IPv4-mapped VIP', SMALL.replace('2001:db8::10', '::ffff:192.0.2.1')],
    ['a complex key', SMALL.replace('    port: 80\n', '    port: 80\n    ? [a, b]\n    : 1\n')],
    ['a flow mapping as a key', 'interface: eth0\nservices:\n  - { {a: 1}: 2 }\n'],
    ['an unclosed flow sequence', SMALL.replace('[200, 204]', '[200, 204')],
    ['a bad indent', SMALL.replace('      interval: 2s', '       interval: 2s')],
    ['a tab', SMALL.replace('    port: 80', '\tport: 80')],
    ['two documents', `${SMALL}---\ninterface: eth1\n`],
    ['an unknown key', SMALL.replace('protocol: udp', 'protocl: udp')],
    ['many problems at once', SMALL.replace('port: 80', 'port: 70000').replace('10.0.1.11', '10.0.1.300').replace('state: drain', 'state: up').replace('interval: 2s', 'interval: 2 s')],
    ['an alias bomb', `interface: eth0\n${'abcdefghi'.split('').map((name, i) => `x-${name}: &${name} [${Array(10).fill(i === 0 ? '1' : `*${'abcdefghi'[i - 1]}`).join(', ')}]\n`).join('')}services: []\n`],
  ];

  it.each(BROKEN)('%s', (_what, text) => {
    const result = parseConfigText(text);
    expect(result.ok).toBe(false);
    expectSameResult(text);
  });

  it('names the line of a YAML problem and the path and value of a config problem', () => {
    const duplicate = parseConfigText(SMALL.replace('        weight: 100', '        weight: 100\n        weight: 5'));
    expect(duplicate.ok ? '' : formatProblems(duplicate.problems)).toBe('(yaml) line 17, column 9: the key "weight" is given twice in one mapping (YAML keys must be unique)');
    const address = parseConfigText(SMALL.replace('10.0.1.11', '10.0.1.300'));
    expect(address.ok ? '' : formatProblems(address.problems)).toBe('services[0].reals[0].address: "10.0.1.300" is not an IPv4 or IPv6 address (line 15, column 9)');
    // That one went the fast way: the file is plain YAML, only its content is wrong.
    expect(parsePlainYaml(SMALL.replace('10.0.1.11', '10.0.1.300'))).toBeDefined();
  });

  it('parseConfigYaml drops a BOM before either way', () => {
    expect(parseConfigYaml(`\uFEFF${SMALL}`)).toStrictEqual(parseConfigYaml(SMALL));
    expect(parseConfigYaml('\uFEFFa: 1\na: 2\n')).toStrictEqual(parseConfigYamlDocument('a: 1\na: 2\n'));
  });
});

describe('fuzzed configs', () => {
  const TOKENS = [
    ' ', '  ', '\n', '\n  ', '\n- ', '-', '- ', ':', ': ', '#', ' #', '"', "'", '[', ']', '{', '}', ',', ', ', '&a ', '*a', '!', '|', '>', '?', '? ',
    '~', '0', '1', '.', 'x', 'e5', '0x', 'null', 'true', '\t', '\r', '\r\n', '\u00a0', '%', '@', '`', '\\', '<<: ', '---\n', '__proto__: ',
  ];

  function mutate(text: string, next: () => number): string {
    const pick = <T>(items: readonly T[]): T => items[Math.floor(next() * items.length)] as T;
    const lines = text.split('\n');
    const at = Math.floor(next() * text.length);
    const line = Math.floor(next() * lines.length);
    switch (Math.floor(next() * 6)) {
      case 0:
        return text.slice(0, at) + pick(TOKENS) + text.slice(at);
      case 1:
        return text.slice(0, at) + text.slice(at + 1 + Math.floor(next() * 3));
      case 2:
        lines.splice(line, 0, lines[line] ?? '');
        return lines.join('\n');
      case 3:
        lines.splice(line, 1);
        return lines.join('\n');
      case 4:
        lines[line] = next() < 0.5 ? ` ${lines[line]}` : (lines[line] ?? '').replace(/^ {1,2}/, '');
        return lines.join('\n');
      default:
        [lines[line], lines[line + 1]] = [lines[line + 1] ?? '', lines[line] ?? ''];
        return lines.join('\n');
    }
  }

  it('answers as the yaml library does or gives up, and the problems are those of the yaml library path', () => {
    const bases = [SMALL, EXAMPLE.split('\n').slice(0, 60).join('\n'), generateConfigText({ services: 3, realsPerService: 3 })];
    let answered = 0;
    let total = 0;
    for (let seed = 1; seed <= 800; seed++) {
      const next = mulberry32(seed);
      let text = bases[seed % bases.length] as string;
      const mutations = 1 + Math.floor(next() * 3);
      for (let m = 0; m < mutations; m++) text = mutate(text, next);
      total++;
      try {
        if (readsAsYamlDoes(text)) answered++;
        expectSameResult(text);
      } catch (error) {
        throw new Error(`seed ${seed}: ${(error as Error).message}\n--- text ---\n${text}`);
      }
    }
    // Not a vacuous pass: a fair share of the mutants stay plain YAML the reader takes.
    expect(answered / total).toBeGreaterThan(0.2);
  });
});
