// Weighted least-connections (IPVS "wlc") over a slice of a service's reals: the real with the
// fewest active flows per unit of weight gets the new flow. Allocation-free.

/**
 * Id of the candidate (start..start+count-1, weight > 0) minimising activeByReal[id] / weight,
 * compared by cross-multiplication so no division rounds; equal loads go to the lower id. A
 * candidate whose id is outside activeByReal is skipped. Returns -1 when none is eligible or the
 * range exceeds ids or weights.
 */
export function leastConnectionsPick(
  ids: Int32Array,
  weights: Float64Array,
  start: number,
  count: number,
  activeByReal: Int32Array,
): number {
  if ((start | 0) !== start || (count | 0) !== count || start < 0 || count < 0) return -1;
  const end = start + count;
  if (end > ids.length || end > weights.length) return -1;
  let bestId = -1;
  let bestActive = 0;
  let bestWeight = 0;
  for (let i = start; i < end; i++) {
    const weight = weights[i]!;
    if (!(weight > 0)) continue;
    const id = ids[i]!;
    if (id < 0 || id >= activeByReal.length) continue;
    const active = activeByReal[id]!;
    if (bestId === -1) {
      bestId = id;
      bestActive = active;
      bestWeight = weight;
      continue;
    }
    // active / weight < bestActive / bestWeight, both weights > 0. Products stay below 2^53 for
    // int32 counts and weights up to 2^21, so the comparison is exact.
    const lhs = active * bestWeight;
    const rhs = bestActive * weight;
    if (lhs < rhs || (lhs === rhs && id < bestId)) {
      bestId = id;
      bestActive = active;
      bestWeight = weight;
    }
  }
  return bestId;
}
