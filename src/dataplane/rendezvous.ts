// Weighted rendezvous (highest random weight) hashing over a slice of a service's reals: each real
// scores every flow independently, so removing a real moves only its own flows. Allocation-free.
// Score = -weight / ln(u), u uniform in (0, 1) per (flow, real): Schindelhauer & Schomaker, 2005.

import { mix32Int32 } from './flow-hash.js';

const TWO_POW_32 = 4294967296;

/**
 * Id of the real with the highest score for this flow hash among candidates start..start+count-1
 * with weight > 0; equal scores go to the earlier candidate: the snapshot builder lists them by
 * address, the same order on every LB, where local ids differ from LB to LB. seeds[i] = stringHash(key_i, seed), computed by
 * the control plane. `hash` may be the flow hash as uint32 or int32 (same bits, same pick). Returns -1
 * when no candidate has weight > 0 or the range exceeds any array.
 */
export function rendezvousPick(
  hash: number,
  ids: Int32Array,
  seeds: Uint32Array,
  weights: Float64Array,
  start: number,
  count: number,
): number {
  const end = start + count;
  if ((start | 0) !== start || (count | 0) !== count || start < 0 || count < 0) return -1;
  if (end > ids.length || end > seeds.length || end > weights.length) return -1;
  let bestId = -1;
  let bestScore = -1; // every real score is > 0
  for (let i = start; i < end; i++) {
    const weight = weights[i]!;
    if (!(weight > 0)) continue;
    // +0.5 keeps u strictly inside (0, 1), so ln(u) is finite and negative and the score positive.
    const u = ((mix32Int32(hash ^ seeds[i]!) >>> 0) + 0.5) / TWO_POW_32;
    const score = -weight / Math.log(u);
    if (score > bestScore) {
      bestId = ids[i]!;
      bestScore = score;
    }
  }
  return bestId;
}
