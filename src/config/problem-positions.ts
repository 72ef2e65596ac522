// The line and column in the config text that each validation problem's path points at. Only run
// when there are problems: validation itself reads plain data (from plain-yaml.ts's fast reader
// or the yaml library), which keeps no positions, so the text is parsed again here with the yaml
// library's LineCounter and each path walked down its document.

import { isAlias, isMap, isScalar, isSeq, LineCounter, parseDocument, type Alias, type Node, type Pair } from 'yaml';
import { keyPath } from './problem-text.js';
import type { ConfigProblem, SourcePosition } from './types.js';
import { aliasTargets, CONFIG_YAML_OPTIONS, isMergeKey } from './yaml-document.js';

/**
 * `problems` with the position of what each path names in `source` (the text validated, BOM
 * dropped): for `a.b`, the key `b` as written; for `a[2]`, the list entry. A required key left out
 * (the validator's message starts `missing`) points at its parent's key or entry; one at the top
 * level has no parent in the file and gets no position. Nor does any other path the file does not
 * hold (`(file)`, or a key left to its default that a check between keys names: a `timeout` longer
 * than the written `interval`): a line there would point at something else. Through an alias or a
 * merge (`<<: *defaults`), and for a value that is an alias (`vip: *v`), the position is where the
 * anchor writes it, which is what the operator edits, and `aliasLine` the line of the alias, which
 * says which use it was (the first alias on the way, the one in the path's own part of the file).
 */
export function locateProblems(source: string, problems: readonly ConfigProblem[]): ConfigProblem[] {
  if (!problems.some((problem) => problem.position === undefined && !problem.path.startsWith('('))) return [...problems];
  const lineCounter = new LineCounter();
  const doc = parseDocument(source, { ...CONFIG_YAML_OPTIONS, lineCounter });
  const walker = new PathWalker(doc.contents, aliasTargets(doc), lineCounter);
  return problems.map((problem) => {
    if (problem.position !== undefined || problem.path.startsWith('(')) return problem;
    const position = walker.find(problem.path, problem.message.startsWith('missing'));
    return position === undefined ? problem : { ...problem, position };
  });
}

/** A path's last part when it can be a required key the file left out: a plain word (the validator's keys). */
const ABSENT_KEY = /^[A-Za-z0-9_-]+$/;
const INDEX = /^\[(\d+)\]/;

class PathWalker {
  constructor(
    private readonly root: unknown,
    private readonly targets: ReadonlyMap<Alias, Node>,
    private readonly lines: LineCounter,
  ) {}

  /**
   * The position `path` (as the validator writes it: `services[0].reals[2].address`) names, if the
   * file holds it; when `absent` (the problem is that the last key is missing), its parent's.
   */
  find(path: string, absent: boolean): SourcePosition | undefined {
    let node: unknown = this.root;
    let rest = path;
    let via: Alias | undefined;
    let parent: SourcePosition | undefined;
    for (;;) {
      // A node reached through an alias is read at its anchor.
      if (isAlias(node)) {
        via ??= node;
        node = this.targets.get(node);
      }
      let written: { at: unknown; value: unknown; via: Alias | undefined } | undefined;
      let after: string;
      const index = INDEX.exec(rest);
      if (index !== null) {
        const item = isSeq(node) ? (node.items[Number(index[1])] as unknown) : undefined;
        written = item === undefined ? undefined : { at: item, value: item, via: undefined };
        after = rest.slice(index[0].length);
      } else {
        if (!isMap(node)) return undefined;
        const found = this.pair(node.items as Pair[], rest);
        // A key left out of a mapping the file has: the mapping's own key or entry.
        if (found === undefined) return absent && ABSENT_KEY.test(rest) ? parent : undefined;
        written = { at: found.pair.key, value: found.pair.value, via: found.via };
        after = rest.slice(found.length);
      }
      if (written === undefined) return undefined;
      via ??= written.via;
      // A value given by an alias (`vip: *v`, `- *pool`) is where its anchor writes it.
      const target = isAlias(written.value) ? this.targets.get(written.value) : undefined;
      if (target !== undefined) via ??= written.value as Alias;
      const position = this.position(target ?? written.at, via);
      if (position === undefined || after === '') return position;
      if (after[0] === '.') after = after.slice(1);
      else if (after[0] !== '[') return undefined;
      parent = position;
      node = written.value;
      rest = after;
    }
  }

  /**
   * The pair among `items` whose key, as keyPath writes it, starts `rest` (followed by its end, `.`
   * or `[`), and the length of that key in the path. The mapping's own keys first, then those it
   * merges (`<<: *a` or `<<: [*a, *b]`, the first source that has the key), as yaml's toJS lets
   * them win; `via` is the merge's alias.
   */
  private pair(items: readonly Pair[], rest: string): { pair: Pair; length: number; via: Alias | undefined } | undefined {
    for (const pair of items) {
      if (isMergeKey(pair.key) || !isScalar(pair.key)) continue;
      // The key as toJS makes it a property name: null (`? ` or `: v`) as "", anything else as String() writes it.
      const shown = keyPath('', pair.key.value === null ? '' : String(pair.key.value));
      if (rest.startsWith(shown) && (rest.length === shown.length || rest[shown.length] === '.' || rest[shown.length] === '[')) {
        return { pair, length: shown.length, via: undefined };
      }
    }
    for (const pair of items) {
      if (!isMergeKey(pair.key)) continue;
      const sources: unknown[] = isSeq(pair.value) ? pair.value.items : [pair.value];
      for (const source of sources) {
        const map = isAlias(source) ? this.targets.get(source) : source;
        const found = isMap(map) ? this.pair(map.items as Pair[], rest) : undefined;
        if (found !== undefined) return { ...found, via: isAlias(source) ? source : found.via };
      }
    }
    return undefined;
  }

  private position(node: unknown, via: Alias | undefined): SourcePosition | undefined {
    const offset = (node as { range?: [number, number, number] | null } | null)?.range?.[0];
    if (offset === undefined) return undefined;
    const { line, col } = this.lines.linePos(offset);
    const aliasOffset = via?.range?.[0];
    return aliasOffset === undefined ? { line, column: col } : { line, column: col, aliasLine: this.lines.linePos(aliasOffset).line };
  }
}
