// The hashes every LB host must agree on: the per-packet flow hash over a 10-word flow key, the
// control-plane string hash that seeds Maglev permutations and rendezvous scores, and the fmix32
// finaliser. All three are MurmurHash3 x86_32 (Appleby) and are pinned by test vectors forever.
// Also the connection table's own bucket hash, which no two tables share (flowIndexHash).

/** Words in a flow key: [0] protocol | family << 8, [1..4] source, [5..8] destination, [9] ports. */
export const FLOW_KEY_WORDS = 10;

/**
 * Whether a flow key is IPv4, from its word 0 (protocol | family << 8). Such a key holds its
 * addresses in words 1 and 5 and zeros in 2-4 and 6-8 (ParsedPacket.addr): the bucket hash and the
 * flow table's compare read only words 0, 1, 5 and 9 of it.
 */
export function isIpv4Key(word0: number): boolean {
  return word0 >>> 8 === 4;
}

const C1 = 0xcc9e2d51;
const C2 = 0x1b873593;

/** MurmurHash3's 32-bit finaliser (fmix32): a bijection on uint32 with full avalanche. */
export function mix32(x: number): number {
  return mix32Int32(x) >>> 0;
}

/** mix32's bits as an int32, for the packet path (see flowHashInt32). */
export function mix32Int32(x: number): number {
  let h = x | 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return h ^ (h >>> 16);
}

// One MurmurHash3 body round: mixes the 4-byte block k into the running state h.
function mixBlock(h: number, k: number): number {
  k = Math.imul(k, C1);
  k = (k << 15) | (k >>> 17);
  k = Math.imul(k, C2);
  h ^= k;
  h = (h << 13) | (h >>> 19);
  return (Math.imul(h, 5) + 0xe6546b64) | 0;
}

/**
 * uint32 hash of a flow key. Defined as MurmurHash3 x86_32 of the key's 40 bytes with each word
 * serialised little-endian, so any host (or another language) can reproduce it from the words alone.
 * The caller guarantees key.length >= FLOW_KEY_WORDS (a shorter key is a programming error and
 * throws rather than hashing undefined words). The packet path uses flowHashInt32 (same bits).
 */
export function flowHash(key: Uint32Array, seed: number): number {
  return flowHashInt32(key, seed) >>> 0;
}

/**
 * flowHash's bits as an int32 (flowHash(k, s) === flowHashInt32(k, s) >>> 0). What the packet path
 * carries: an int32 is a small integer to V8 and never allocates, while a uint32 >= 2^31 is boxed
 * into a heap number wherever it crosses a call that is not inlined (half of all hashes). Turn it
 * into a table index with `& mask` or `>>> 0` at the point of use.
 */
export function flowHashInt32(key: Uint32Array, seed: number): number {
  if (key.length < FLOW_KEY_WORDS) throw new RangeError('flow key needs 10 words');
  let h = seed | 0;
  // mixBlock written out: ten inlined copies of it would spend the packet path's inlining budget
  // (inlining-budget.ts). `| 0`: a word >= 2^31 read as a uint32 would be a heap number to imul.
  for (let i = 0; i < FLOW_KEY_WORDS; i++) {
    let k = Math.imul(key[i]! | 0, C1);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, C2);
    h ^= k;
    h = (h << 13) | (h >>> 19);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  // fmix32 (mix32Int32) written out for the same reason.
  h ^= FLOW_KEY_WORDS * 4;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return h ^ (h >>> 16);
}

/**
 * The connection table's bucket hash of a flow key (int32). Unlike flowHash it need not agree
 * between hosts, so each table draws its own random seed, as Linux does for its BPF hash maps and
 * TCP's established-connection hash: with the public flowHash and a known hashSeed (0 unless
 * configured), anyone can compute offline thousands of 5-tuples whose hashes share their low bits,
 * and one probe run of the table's index then grows with every such flow (2,000 of them made a
 * packet ten times dearer). Here the seed enters every word before its multiply, so which keys
 * share a bucket depends on it. Each lane then folds its product's high bits down and multiplies
 * again: with one multiply, flips confined to the top bits of a few words cancelled between lanes
 * whatever the seed (for some choices of bits in 1 key of 3), and now depend on it as well (7 of
 * 1.4 million such pairs collided). Not a keyed PRF like SipHash, but no cheap way to a long run.
 * The ten lanes do not depend on each other, so the processor runs them side by side: half
 * flowHash's time. An IPv4 key (family 4 in word 0) holds its addresses in words 1 and 5 and
 * zeros in 2-4 and 6-8 (ParsedPacket.addr), whose lanes add only a constant: it takes the four
 * lanes that vary (10-13 ns less a packet in memory). Keys of family 4 that differ only in those
 * words, which no packet makes, share a hash.
 */
export function flowIndexHash(key: Uint32Array, seed: number): number {
  if (key.length < FLOW_KEY_WORDS) throw new RangeError('flow key needs 10 words');
  const s = seed | 0;
  return isIpv4Key(key[0]!) ? ipv4IndexHash(key, s) : tenLaneIndexHash(key, s);
}

// Odd multipliers, one pair per word. A loop over constant arrays ran no faster than flowHash's chain.
function tenLaneIndexHash(key: Uint32Array, s: number): number {
  const h =
    lane(key[0]!, s, 0x9e3779b1, 16, 0x21f0aaad) ^
    lane(key[1]!, s, 0x85ebca77, 15, 0x735a2d97) ^
    (lane(key[2]!, s, 0xc2b2ae3d, 14, 0x0e3c4c6b) ^ lane(key[3]!, s, 0x27d4eb2f, 13, 0x2c1b3c6d)) ^
    (lane(key[4]!, s, 0x165667b1, 12, 0x297a2d39) ^ lane(key[5]!, s, 0xd3a2646d, 17, 0x7feb352d)) ^
    (lane(key[6]!, s, 0xfd7046c5, 18, 0x846ca68b) ^ lane(key[7]!, s, 0xb55a4f09, 19, 0x9e485565)) ^
    (lane(key[8]!, s, 0x7feb352d, 11, 0xed5ad4bb) ^ lane(key[9]!, s, 0x846ca68b, 10, 0xac4c1b51));
  return finishIndexHash(h, s);
}

/** The lanes of words 0, 1, 5 and 9, as tenLaneIndexHash has them. */
function ipv4IndexHash(key: Uint32Array, s: number): number {
  const h =
    lane(key[0]!, s, 0x9e3779b1, 16, 0x21f0aaad) ^
    lane(key[1]!, s, 0x85ebca77, 15, 0x735a2d97) ^
    (lane(key[5]!, s, 0xd3a2646d, 17, 0x7feb352d) ^ lane(key[9]!, s, 0x846ca68b, 10, 0xac4c1b51));
  return finishIndexHash(h, s);
}

/**
 * One lane: the seeded word times m1, its high bits folded down, times m2. `| 0`: a word >= 2^31
 * read as a uint32 would be a heap number to imul.
 */
function lane(word: number, s: number, m1: number, shift: number, m2: number): number {
  const x = Math.imul((word | 0) ^ s, m1);
  return Math.imul(x ^ (x >>> shift), m2);
}

/** fmix32 of the lanes, the seed once more in front of its first multiply. */
function finishIndexHash(lanes: number, s: number): number {
  let h = Math.imul(lanes ^ s, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return h ^ (h >>> 16);
}

/**
 * uint32 MurmurHash3 x86_32 of the string's UTF-8 bytes (lone surrogates encode as U+FFFD, as
 * TextEncoder does). Control plane only: hashes real keys into permutation offsets and seeds.
 * Encodes on the fly so the result needs no intermediate buffer.
 */
export function stringHash(text: string, seed: number): number {
  let h = seed | 0;
  let block = 0; // pending bytes, little-endian
  let blockBytes = 0;
  let totalBytes = 0;
  const length = text.length;
  for (let i = 0; i < length; i++) {
    let cp = text.charCodeAt(i);
    if (cp >= 0xd800 && cp <= 0xdfff) {
      const next = i + 1 < length ? text.charCodeAt(i + 1) : 0;
      if (cp <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
        cp = 0x10000 + ((cp - 0xd800) << 10) + (next - 0xdc00);
        i++;
      } else {
        cp = 0xfffd;
      }
    }
    // Up to four UTF-8 bytes, emitted one by one into the block.
    let count: number;
    let b0: number;
    if (cp < 0x80) {
      count = 1;
      b0 = cp;
    } else if (cp < 0x800) {
      count = 2;
      b0 = 0xc0 | (cp >>> 6);
    } else if (cp < 0x10000) {
      count = 3;
      b0 = 0xe0 | (cp >>> 12);
    } else {
      count = 4;
      b0 = 0xf0 | (cp >>> 18);
    }
    for (let j = 0; j < count; j++) {
      const byte = j === 0 ? b0 : 0x80 | ((cp >>> (6 * (count - 1 - j))) & 0x3f);
      block |= byte << (8 * blockBytes);
      blockBytes++;
      totalBytes++;
      if (blockBytes === 4) {
        h = mixBlock(h, block);
        block = 0;
        blockBytes = 0;
      }
    }
  }
  if (blockBytes > 0) {
    // Tail: mixed into h without the rotate-multiply-add step, as in the reference.
    let k = Math.imul(block, C1);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, C2);
    h ^= k;
  }
  return mix32(h ^ totalBytes);
}

/**
 * The outer IPv6 flow label of a tunnelled packet (RFC 6437/6438): the same for every packet of a
 * flow. From the inner addresses, protocol and ports; a fragment (no ports in later fragments) uses
 * no ports, so all fragments of a datagram share one label. `addr` holds source then destination
 * as four words each (ParsedPacket.addr).
 */
export function tunnelFlowLabel(addr: Uint32Array, protocol: number, ports: number): number {
  let h = mix32Int32(protocol ^ 0x6c61626c);
  for (let i = 0; i < 8; i++) h = mix32Int32(h ^ addr[i]!);
  return (mix32Int32(h ^ ports) >>> 0) & 0xfffff;
}
