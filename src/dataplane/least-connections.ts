// Weighted least-connections (IPVS "wlc") over a slice of a service's reals: the real with the
// least load per unit of weight gets the new flow, load counted as IPVS does
// (ip_vs_dest_conn_overhead: active * 256 + inactive), so connections still in their handshake
// count and a burst of SYNs spreads. Allocation-free.

/**
 * Id of the candidate (start..start+count-1, weight > 0) minimising
 * (activeByReal[id] * 256 + inactiveByReal[id]) / weight, compared by cross-multiplication so no
 * division rounds; equal loads go to the lower id. A candidate whose id is outside the count arrays
 * is skipped. Returns -1 when none is eligible or the range exceeds ids or weights.
 */
export function leastConnectionsPick(
  ids: Int32Array,
  weights: Float64Array,
  start: number,
  count: number,
  activeByReal: Int32Array,
  inactiveByReal: Int32Array,
): number {
  if ((start | 0) !== start || (count | 0) !== count || start < 0 || count < 0) return -1;
  const end = start + count;
  if (end > ids.length || end > weights.length) return -1;
  let bestId = -1;
  let bestLoad = 0;
  let bestWeight = 0;
  for (let i = start; i < end; i++) {
    const weight = weights[i]!;
    if (!(weight > 0)) continue;
    const id = ids[i]!;
    if (id < 0 || id >= activeByReal.length || id >= inactiveByReal.length) continue;
    const load = activeByReal[id]! * 256 + inactiveByReal[id]!;
    if (bestId === -1) {
      bestId = id;
      bestLoad = load;
      bestWeight = weight;
      continue;
    }
    // load / weight < bestLoad / bestWeight, both weights > 0. With counts bounded by the flow
    // table (2^28 entries) a load is below 2^37 and a weight at most 65535: products stay below
    // 2^53, so the comparison is exact.
    const lhs = load * bestWeight;
    const rhs = bestLoad * weight;
    if (lhs < rhs || (lhs === rhs && id < bestId)) {
      bestId = id;
      bestLoad = load;
      bestWeight = weight;
    }
  }
  return bestId;
}
