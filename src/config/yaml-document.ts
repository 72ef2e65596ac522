// The yaml library's document of a config text: the options it is parsed with, which node each
// alias stands for, and its conversion to plain data behind a bound on how far aliases expand it.

import { isAlias, isMap, isPair, isScalar, isSeq, visit, type Alias, type Document, type Node } from 'yaml';

/** How config text is parsed wherever a yaml document of it is made (validation, the admin section, problem positions). */
export const CONFIG_YAML_OPTIONS = { uniqueKeys: true, merge: true } as const;

/**
 * Most nodes a document may hold with every alias expanded in place (a scalar, a list or a
 * mapping counts one; a merge counts the merged mapping whole). Aliases are what make a short
 * file large: an anchor whose value uses other aliases is copied whole at each use, so nine lines
 * of ten aliases each (a "billion laughs") expand to 10^9 nodes. The yaml library's own guard
 * (toJS's maxAliasCount, 100 by default) counts the uses of each anchor instead, and refused a
 * config whose 100 services merge one `x-` anchor. The file is root's, but a mistake or a pasted
 * file must still be refused rather than take the daemon's memory. A config at the daemon's limit
 * of 8,192 (service, real) pairs, as 8,192 services that each merge an anchor, with one real each
 * that merges another, expands to about 400,000 nodes; at ten times that, a file converts in about
 * 0.5 s and 120 MB, and one past the bound is refused in about 30 ms, before anything expands.
 */
export const MAX_EXPANDED_NODES = 4_000_000;

/** `text` without a leading byte order mark, which the yaml library would take as content. */
export function withoutBom(text: string): string {
  return text.startsWith('\uFEFF') ? text.slice(1) : text;
}

/** The `<<` of a merge (`<<: *defaults`), as the yaml library reads it under `merge: true`: a plain scalar holding a symbol. */
export function isMergeKey(key: unknown): boolean {
  return isScalar(key) && typeof key.value === 'symbol' && key.value.description === '<<';
}

/**
 * Each alias of `doc` -> the node it stands for: the last node before it in the document with that
 * anchor, as the yaml library resolves it. One pass over the document, where the library's
 * Alias.resolve walks the whole document again for each alias.
 */
export function aliasTargets(doc: Document.Parsed): Map<Alias, Node> {
  const anchors = new Map<string, Node>();
  const targets = new Map<Alias, Node>();
  // visit() calls a node before its children, so an alias inside its own anchor finds that anchor, as in yaml.
  visit(doc, {
    Node(_, node) {
      if (isAlias(node)) {
        const target = anchors.get(node.source);
        if (target !== undefined) targets.set(node, target);
      } else if (node.anchor !== undefined) {
        anchors.set(node.anchor, node);
      }
    },
  });
  return targets;
}

/** Why a document cannot be made plain data, and where (an offset in the text) when one place is to blame. */
export interface DocumentProblem {
  readonly message: string;
  readonly offset?: number;
}

/**
 * The plain data of a parsed document (mappings as objects, merges applied), or why not: an
 * expansion past MAX_EXPANDED_NODES, an alias inside its own anchor, or what toJS throws
 * (an alias to no anchor, a merge of something not a mapping). Alters `doc`: its aliases are
 * replaced by the nodes they name.
 */
export function toPlainData(doc: Document.Parsed): { ok: true; value: unknown } | { ok: false; problem: DocumentProblem } {
  try {
    const targets = aliasTargets(doc);
    if (targets.size > 0) {
      const problem = expansionProblem(doc, targets);
      if (problem !== null) return { ok: false, problem };
      // toJS finds an alias's anchor by a scan of the document's anchors and aliases up to it: 8,192
      // services each merging an anchor took 6 s. In place of its aliases, it converts the nodes
      // themselves, a copy at each use (the expansion is bounded above) instead of one shared object.
      inlineAliases(doc.contents, targets);
    }
    // What aliases remain name no anchor, which toJS refuses; the library's own guard (a count of
    // uses per anchor, 100 by default) is off, the expansion being bounded above.
    return { ok: true, value: doc.toJS({ maxAliasCount: -1 }) };
  } catch (error) {
    // Also a RangeError from a nesting too deep for the stack, here or in toJS.
    return { ok: false, problem: { message: error instanceof Error ? error.message : String(error) } };
  }
}

/**
 * Puts in place of each alias under `node` the node it names, in one pass over the document as
 * written (a node put in place is not walked again there: its own aliases are replaced where it
 * is defined). Only after expansionProblem: an alias inside its own anchor would make a cycle.
 */
function inlineAliases(node: unknown, targets: ReadonlyMap<Alias, Node>): void {
  if (!isMap(node) && !isSeq(node)) return;
  const items = node.items as unknown[];
  const inline = (child: unknown): unknown => {
    if (!isAlias(child)) {
      inlineAliases(child, targets);
      return child;
    }
    return targets.get(child) ?? child;
  };
  for (let i = 0; i < items.length; i++) {
    const item = items[i];
    if (isPair(item)) {
      item.key = inline(item.key);
      item.value = inline(item.value);
    } else {
      items[i] = inline(item);
    }
  }
}

/** Thrown inside expansionProblem to stop the walk at the first node to blame. */
class Refused extends Error {
  constructor(readonly problem: DocumentProblem) {
    super(problem.message);
  }
}

/**
 * Whether the document, every alias expanded in place, holds more than MAX_EXPANDED_NODES nodes,
 * or an alias inside the anchor it names (a structure that contains itself: toJS would merge it
 * into itself without end). Counted without expanding: each anchored node's size is computed once
 * and an alias adds it, so the walk is linear in the text however far the aliases multiply it.
 * The node blamed is the innermost one whose expanded size passes the bound.
 */
function expansionProblem(doc: Document.Parsed, targets: ReadonlyMap<Alias, Node>): DocumentProblem | null {
  const sizes = new Map<Node, number>();
  const open = new Set<Node>();
  const offsetOf = (node: { range?: [number, number, number] | null }): number | undefined => node.range?.[0] ?? undefined;
  const size = (node: unknown): number => {
    if (node === null || node === undefined) return 0;
    if (isAlias(node)) {
      const target = targets.get(node);
      // An alias to no anchor is toJS's to refuse, with its own message.
      if (target === undefined) return 1;
      if (open.has(target)) {
        throw new Refused({ message: `the alias *${node.source} is inside the anchor &${node.source} it names (a structure that contains itself)`, offset: offsetOf(node) });
      }
      return sizes.get(target) ?? size(target);
    }
    if (isPair(node)) return size(node.key) + size(node.value);
    if (!isMap(node) && !isSeq(node)) return 1;
    const known = sizes.get(node);
    if (known !== undefined) return known;
    open.add(node);
    let total = 1;
    for (const item of node.items as unknown[]) {
      total += size(item);
      if (total > MAX_EXPANDED_NODES) {
        throw new Refused({
          message: `aliases expand the file here to more than ${MAX_EXPANDED_NODES.toLocaleString('en-US')} YAML nodes (an anchor that uses other aliases is copied whole at each use): refused as an alias bomb`,
          offset: offsetOf(node),
        });
      }
    }
    open.delete(node);
    if (node.anchor !== undefined) sizes.set(node, total);
    return total;
  };
  try {
    size(doc.contents);
    return null;
  } catch (error) {
    if (error instanceof Refused) return error.problem;
    throw error;
  }
}
