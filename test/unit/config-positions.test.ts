// Where a config problem points in the file: each `path: message` line ends with the line and
// column of what its path names (src/config/problem-positions.ts), through anchors and merges too;
// and how far aliases may expand a file (src/config/yaml-document.ts): a fleet's shared anchors
// load, an alias bomb is refused quickly.

import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateConfigText } from '../../bench/micro/config-shapes.js';
import { loadConfigFile } from '../../src/config/load.js';
import { parsePlainYaml } from '../../src/config/plain-yaml.js';
import { locateProblems } from '../../src/config/problem-positions.js';
import type { ConfigProblem } from '../../src/config/types.js';
import { formatProblems, parseConfigText, parseConfigYamlDocument, problemLines, validateConfig } from '../../src/config/validate.js';
import { MAX_EXPANDED_NODES } from '../../src/config/yaml-document.js';

/** The lines `dsrlb validate` prints for `text` (none when it is valid). */
function validateLines(text: string): string[] {
  const result = parseConfigText(text);
  return result.ok ? [] : formatProblems(result.problems).split('\n');
}

function problemsOf(text: string): ConfigProblem[] {
  const result = parseConfigText(text);
  if (result.ok) throw new Error('expected problems, the config is valid');
  return result.problems;
}

/** The 1-based number of the line of `text` that is exactly `line` (trailing comment and CR aside). */
function lineNumber(text: string, line: string): number {
  const index = text.split('\n').findIndex((l) => l.replace(/\r$/, '').replace(/ +#.*$/, '') === line);
  if (index < 0) throw new Error(`no line ${JSON.stringify(line)}`);
  return index + 1;
}

/** The text as the yaml library path alone reads it (the fast reader skipped), problems located as parseConfigText does. */
function throughYamlLibrary(text: string): ConfigProblem[] {
  const source = text.startsWith('\uFEFF') ? text.slice(1) : text;
  const parsed = parseConfigYamlDocument(source);
  if (!parsed.ok) return parsed.problems;
  const result = validateConfig(parsed.raw);
  return result.ok ? [] : locateProblems(source, result.problems);
}

const SMALL = `interface: eth0
services:
  - name: web
    vip: 203.0.113.10
    port: 80
    healthCheck:
      type: http
      interval: 2s
    reals:
      - address: 10.0.1.11
      - address: 10.0.1.12
        weight: 70000
  - { name: dns, vip: 203.0.113.53, port: 53, protocol: udp, reals: [{ address: 10.0.2.1 }, { address: 10.0.2.300 }] }
`;
/** SMALL with its two problems fixed: the cases below each break one thing in it. */
const VALID = SMALL.replace('weight: 70000', 'weight: 7').replace('10.0.2.300', '10.0.2.3');

describe('a problem names the line and column of its node', () => {
  it('a bad address deep in a list of 8,000 reals: the line of that real, read the fast way and the library way alike', () => {
    const text = generateConfigText({ services: 8, realsPerService: 1000 }).replace('      - address: 10.5.2.235\n', '      - address: 10.5.2.300\n');
    const line = lineNumber(text, '      - address: 10.5.2.300');
    expect(validateLines(text)).toEqual([`services[5].reals[734].address: "10.5.2.300" is not an IPv4 or IPv6 address (line ${line}, column 9)`]);
    expect(parsePlainYaml(text)).toBeDefined(); // the fast reader took it
    expect(throughYamlLibrary(text)).toEqual(problemsOf(text));
  });

  it('block and flow style: the key of a mapping, the entry of a list; a column tells apart two reals on one line', () => {
    expect(validateLines(SMALL)).toEqual([
      'services[0].reals[1].weight: 70000 is not a weight (0..65535) (line 12, column 9)',
      'services[1].reals[1].address: "10.0.2.300" is not an IPv4 or IPv6 address (line 13, column 95)',
    ]);
    expect(SMALL.split('\n')[12]!.slice(94)).toMatch(/^address: 10\.0\.2\.300/);
    // A list entry that is not a mapping, and a wrong type for a whole section.
    expect(validateLines(VALID.replace('      - address: 10.0.1.11\n', '      - 10.0.1.11\n'))).toEqual([
      'services[0].reals[0]: expected a mapping with an address, got "10.0.1.11" (line 10, column 9)',
    ]);
    expect(validateLines(VALID.replace('      type: http\n      interval: 2s\n', '      - http\n'))).toEqual([
      'services[0].healthCheck: expected a mapping with a type (tcp, http, https, udp, icmp, exec, none), got a list (line 6, column 5)',
    ]);
  });

  it('a required key left out: the line of the mapping it is missing from; at the top level, no line', () => {
    const text = VALID.replace('      - address: 10.0.1.12\n        weight: 7\n', '      - weight: 7\n').replace('      type: http\n', '      path: /\n');
    expect(validateLines(text)).toEqual([
      'services[0].healthCheck.type: missing; expected one of tcp, http, https, udp, icmp, exec, none (line 6, column 5)',
      'services[0].reals[1].address: missing; expected an IPv4 or IPv6 address (line 11, column 9)',
    ]);
    // A service without its port, in flow style: the service's own entry.
    expect(validateLines(VALID.replace(' port: 53,', ''))).toEqual([
      'services[1].port: missing; expected a port (0..65535) (line 13, column 5)',
    ]);
    // The file itself is the parent of a top-level key: no line to give.
    expect(validateLines('interface: eth0\n')).toEqual(['services: missing; expected a list of services']);
    expect(validateLines('admin: { listen: "0.0.0.0:9743" }\ninterface: eth0\nservices: []\n')).toEqual([
      'admin.tokenFile: missing; a token file is required when admin.listen (0.0.0.0:9743) is not a loopback address (line 1, column 1)',
      'services: an empty list; expected at least one service (line 3, column 1)',
    ]);
  });

  it('a problem with no single node of its own keeps no line: the file as a whole, a key left to its default', () => {
    expect(validateLines('- a\n- b\n')).toEqual(['(file): expected a mapping with at least interface and services, got a list']);
    expect(validateLines('')).toEqual(['(file): the file is empty; expected a mapping with at least interface and services']);
    // timeout is not written: it is its default (1s), longer than the interval written.
    expect(validateLines(VALID.replace('interval: 2s', 'interval: 500ms'))).toEqual([
      'services[0].healthCheck.timeout: 1s is longer than the interval (500ms); a probe must end before the next one starts',
    ]);
    // Checks between keys that name a key written in the file point at it.
    expect(validateLines(VALID.replace('interval: 2s', 'interval: 1s\n      timeout: 2s'))).toEqual([
      'services[0].healthCheck.timeout: 2s is longer than the interval (1s); a probe must end before the next one starts (line 9, column 7)',
    ]);
    expect(validateLines(`${VALID}  - { vip: 203.0.113.10, port: 80, reals: [] }\n`)).toEqual([
      'services[2]: tcp://203.0.113.10:80 is already defined by services[0] ("web") (line 14, column 5)',
    ]);
  });

  it('an odd key is found by the quoted form the path shows it in', () => {
    const text = 'interface: eth0\nadmin:\n  "tokenFile\\r\\n": /x\nservices:\n  - { vip: 203.0.113.10, port: 80, reals: [], "a.b": 1 }\n';
    expect(validateLines(text)).toEqual([
      'admin."tokenFile\\r\\n": unknown key (did you mean "tokenFile"?) (line 3, column 3)',
      'services[0]."a.b": unknown key (expected one of name, vip, port, protocol, scheduler, forwarding, whenAllDown, onRealDown, persistence, persistencePrefix, ops, tableSize, healthCheck, announce, reals) (line 5, column 47)',
    ]);
  });

  it('CRLF line ends, a BOM and one-line JSON give the same lines', () => {
    const lf = validateLines(SMALL);
    expect(validateLines(SMALL.replace(/\n/g, '\r\n'))).toEqual(lf);
    expect(validateLines(`\uFEFF${SMALL}`)).toEqual(lf);
    expect(validateLines(`\uFEFF${SMALL.replace(/\n/g, '\r\n')}`)).toEqual(lf);
    const json = JSON.stringify({ interface: 'eth0', services: [{ vip: '203.0.113.10', port: 80, reals: [{ address: '10.0.1.300' }] }] });
    expect(validateLines(json)).toEqual([`services[0].reals[0].address: "10.0.1.300" is not an IPv4 or IPv6 address (line 1, column ${json.indexOf('"address"') + 1})`]);
  });

  it('the fast reader and the yaml library path give the same lines, and so does a file only the library reads', () => {
    expect(parsePlainYaml(SMALL)).toBeDefined();
    expect(throughYamlLibrary(SMALL)).toEqual(problemsOf(SMALL));
    // A tag sends the file to the yaml library: the lines above it are the same.
    const tagged = SMALL.replace('interface: eth0', 'interface: !!str eth0');
    expect(parsePlainYaml(tagged)).toBeUndefined();
    expect(problemsOf(tagged)).toEqual(problemsOf(SMALL));
  });

  it('dsrlb validate and a refused reload print the same lines: a file named in front, the path first', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'dsrlb-positions-'));
    try {
      const file = join(dir, 'dsrlb.yaml');
      await writeFile(file, SMALL);
      const loaded = await loadConfigFile(file);
      expect(loaded.ok ? [] : problemLines(loaded.problems, file)).toEqual([
        `${file}: services[0].reals[1].weight: 70000 is not a weight (0..65535) (line 12, column 9)`,
        `${file}: services[1].reals[1].address: "10.0.2.300" is not an IPv4 or IPv6 address (line 13, column 95)`,
      ]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('through anchors, aliases and merge keys', () => {
  const SHARED = `interface: eth0
x-check: &check
  type: http
  interval: 2x
x-service: &service
  protocol: tcp
  healthCheck: *check
x-pool: &pool
  - address: 10.0.1.1
  - address: 10.0.1.300
services:
  - <<: *service
    vip: 203.0.113.10
    port: 80
    reals: *pool
  - <<: [{ scheduler: wlc }, *service]
    name: second
    vip: 203.0.113.11
    port: 80
    protocol: udpp
    reals:
      - *pool
`;

  it('a value written in an anchor: the anchor\'s line, where it is edited, and the line of the alias that used it', () => {
    expect(validateLines(SHARED)).toEqual([
      'services[0].healthCheck.interval: "2x" is not a duration (a number with a unit ms, s, m or h, e.g. 250ms, 2s, 15m, 1h) (line 4, column 3, through the alias on line 12)',
      'services[0].reals[1].address: "10.0.1.300" is not an IPv4 or IPv6 address (line 10, column 5, through the alias on line 15)',
      // The service's own key wins over the merged one, and is where it is written.
      'services[1].protocol: "udpp" is not tcp or udp (line 20, column 5)',
      'services[1].healthCheck.interval: "2x" is not a duration (a number with a unit ms, s, m or h, e.g. 250ms, 2s, 15m, 1h) (line 4, column 3, through the alias on line 16)',
      // A value that is an alias (here a list entry): where its anchor writes it, and the alias's line.
      'services[1].reals[0]: expected a mapping with an address, got a list (line 9, column 3, through the alias on line 22)',
    ]);
  });

  it('a required key an anchor leaves out: the anchored mapping it is missing from, and each use', () => {
    const text = SHARED.replace('  type: http\n  interval: 2x\n', '  path: /\n').replace('10.0.1.300', '10.0.1.3').replace('protocol: udpp', 'protocol: udp').replace('      - *pool', '      - address: 10.0.1.9');
    expect(validateLines(text)).toEqual([
      'services[0].healthCheck.type: missing; expected one of tcp, http, https, udp, icmp, exec, none (line 3, column 3, through the alias on line 11)',
      'services[1].healthCheck.type: missing; expected one of tcp, http, https, udp, icmp, exec, none (line 3, column 3, through the alias on line 15)',
    ]);
  });

  it('a scalar given by an alias: the anchor that writes it', () => {
    const text = 'interface: eth0\nx-vip: &vip 203.0.113.300\nservices:\n  - vip: *vip\n    port: 80\n    reals: []\n';
    expect(validateLines(text)).toEqual(['services[0].vip: "203.0.113.300" is not an IPv4 or IPv6 address (line 2, column 13, through the alias on line 4)']);
  });

  it('the first merge source that has a key wins, as the yaml library merges', () => {
    const text = SHARED.replace('  - <<: [{ scheduler: wlc }, *service]', '  - <<: [{ protocol: sctp }, *service]').replace('    protocol: udpp\n', '');
    expect(validateLines(text).filter((line) => line.startsWith('services[1].protocol'))).toEqual(['services[1].protocol: "sctp" is not tcp or udp (line 16, column 12)']);
  });

  it('reads the same problems, lines included, through the yaml library alone', () => {
    expect(throughYamlLibrary(SHARED)).toEqual(problemsOf(SHARED));
  });
});

describe('how far aliases may expand a file', () => {
  /** `count` services that all merge one anchor, and one real each that merges another. */
  function sharedAnchors(count: number): string {
    const services = Array.from({ length: count }, (_, i) =>
      `  - <<: *service\n    vip: 203.0.${Math.floor(i / 250)}.${(i % 250) + 1}\n    reals:\n      - { <<: *real, address: 10.1.${Math.floor(i / 250)}.${(i % 250) + 1} }\n`,
    );
    return `interface: eth0\nx-check: &check { type: http, path: /healthz, interval: 2s }\nx-service: &service\n  port: 80\n  healthCheck: *check\nx-real: &real { weight: 50 }\nservices:\n${services.join('')}`;
  }

  it('takes 200 services sharing one anchor (the yaml library\'s default refused 100), and 2,000', () => {
    for (const count of [200, 2000]) {
      const result = parseConfigText(sharedAnchors(count));
      if (!result.ok) throw new Error(formatProblems(result.problems));
      expect(result.config.services).toHaveLength(count);
      expect(result.config.services[count - 1]!.healthCheck).toMatchObject({ type: 'http', path: '/healthz', intervalMs: 2000 });
      expect(result.config.services[count - 1]!.reals[0]).toMatchObject({ address: `10.1.${Math.floor((count - 1) / 250)}.${((count - 1) % 250) + 1}`, weight: 50 });
    }
  });

  it('refuses an exponential alias bomb with a clear message, in bounded time and memory, before expanding it', () => {
    // Nine levels of ten aliases of the level above: 10^9 nodes.
    const levels = Array.from({ length: 9 }, (_, i) => `x-l${i + 1}: &l${i + 1} [${Array(10).fill(`*l${i}`).join(', ')}]\n`);
    const bomb = `interface: eth0\nx-l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n${levels.join('')}services: []\n`;
    const heapBefore = process.memoryUsage().heapUsed;
    const started = performance.now();
    const lines = validateLines(bomb);
    const elapsedMs = performance.now() - started;
    expect(lines).toEqual([
      `(yaml) line 8, column 11: aliases expand the file here to more than ${MAX_EXPANDED_NODES.toLocaleString('en-US')} YAML nodes (an anchor that uses other aliases is copied whole at each use): refused as an alias bomb`,
    ]);
    expect(bomb.split('\n')[7]).toMatch(/^x-l6: &l6 \[/);
    expect(elapsedMs).toBeLessThan(1000);
    expect(process.memoryUsage().heapUsed - heapBefore).toBeLessThan(50e6);
  });

  it('names the first YAML syntax error only, and how many followed it (an unclosed [ made four more on lines that are fine)', () => {
    const text = 'interface: eth0\nservices:\n  - name: web\n    vip: 10.77.0.100\n    port: [80\n    protocol: tcp\n    scheduler: maglev\n    reals:\n      - { address: 10.77.0.11 }\n';
    const lines = validateLines(text);
    expect(lines[0]).toMatch(/^\(yaml\) line 6, column 5: Flow sequence in block collection must be sufficiently indented and end with a \]$/);
    expect(lines.slice(1)).toEqual([expect.stringMatching(/^\(yaml\): \d+ more YAML errors? after the first, most likely caused by it: fix it and check again$/)]);
    // Repeated keys stand alone: each is said, in one run.
    const twice = validateLines('interface: eth0\ninterface: eth1\nservices:\n  - name: web\n    vip: 10.77.0.100\n    port: 80\n    port: 81\n    reals: []\n');
    expect(twice).toEqual([
      '(yaml) line 2, column 1: the key "interface" is given twice in one mapping (YAML keys must be unique)',
      '(yaml) line 7, column 5: the key "port" is given twice in one mapping (YAML keys must be unique)',
    ]);
  });

  it('refuses a bomb made of merges, and an alias inside its own anchor', () => {
    const levels = Array.from({ length: 12 }, (_, i) => `x-m${i + 1}: &m${i + 1} { a: { <<: *m${i} }, b: { <<: *m${i} }, c: { <<: *m${i} }, d: { <<: *m${i} } }\n`);
    const merges = `interface: eth0\nx-m0: &m0 { k: 1, l: 2 }\n${levels.join('')}services: []\n`;
    const started = performance.now();
    expect(validateLines(merges)).toEqual([expect.stringMatching(/^\(yaml\) line \d+, column \d+: aliases expand the file here to more than .* refused as an alias bomb$/)]);
    expect(performance.now() - started).toBeLessThan(1000);
    expect(validateLines('interface: eth0\nx-loop: &loop { next: *loop }\nservices: []\n')).toEqual([
      '(yaml) line 2, column 23: the alias *loop is inside the anchor &loop it names (a structure that contains itself)',
    ]);
    expect(validateLines('interface: eth0\nx-loop: &loop\n  <<: *loop\nservices: []\n')).toEqual([
      '(yaml) line 3, column 7: the alias *loop is inside the anchor &loop it names (a structure that contains itself)',
    ]);
  });

  it('still refuses an alias to no anchor and a merge of a list, with the yaml library\'s words', () => {
    expect(validateLines('interface: eth0\nservices: *nothing\n')).toEqual([expect.stringMatching(/^\(yaml\): Unresolved alias .*nothing/)]);
    expect(validateLines('interface: eth0\nx-list: &list [1]\nservices:\n  - <<: *list\n')).toEqual(['(yaml): Merge sources must be maps or map aliases']);
  });
});

describe('problemLines', () => {
  it('appends the position after the message, and the alias line when there is one', () => {
    expect(problemLines([
      { path: 'a.b', message: 'x' },
      { path: 'c', message: 'y', position: { line: 3, column: 5 } },
      { path: 'd[0]', message: 'z', position: { line: 2, column: 3, aliasLine: 9 } },
    ], 'f.yaml')).toEqual(['f.yaml: a.b: x', 'f.yaml: c: y (line 3, column 5)', 'f.yaml: d[0]: z (line 2, column 3, through the alias on line 9)']);
  });
});

describe('loadConfigFile', () => {
  let dir = '';
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'dsrlb-positions-load-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('gives the lines of the file as it is on disk, BOM and CRLF included', async () => {
    const file = join(dir, 'windows.yaml');
    await writeFile(file, `\uFEFF${SMALL.replace(/\n/g, '\r\n')}`);
    const loaded = await loadConfigFile(file);
    expect(loaded.ok ? [] : loaded.problems.map((problem) => problem.position)).toEqual([{ line: 12, column: 9 }, { line: 13, column: 95 }]);
  });
});
