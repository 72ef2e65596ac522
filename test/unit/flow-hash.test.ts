import { describe, expect, it } from 'vitest';
import { FLOW_KEY_WORDS, flowHash, flowHashInt32, flowIndexHash, mix32, mix32Int32, stringHash } from '../../src/dataplane/flow-hash.js';

// Independent byte-at-a-time MurmurHash3 x86_32, written straight from the reference, so the
// word-wise flowHash and the streaming UTF-8 stringHash are checked against a second implementation.
function murmur3Bytes(bytes: Uint8Array, seed: number): number {
  const rotl = (x: number, r: number): number => (x << r) | (x >>> (32 - r));
  let h = seed | 0;
  const blocks = bytes.length >> 2;
  for (let b = 0; b < blocks; b++) {
    const o = b * 4;
    let k = bytes[o]! | (bytes[o + 1]! << 8) | (bytes[o + 2]! << 16) | (bytes[o + 3]! << 24);
    k = Math.imul(rotl(Math.imul(k, 0xcc9e2d51), 15), 0x1b873593);
    h = (Math.imul(rotl(h ^ k, 13), 5) + 0xe6546b64) | 0;
  }
  const tail = blocks * 4;
  const rest = bytes.length & 3;
  if (rest > 0) {
    let k = 0;
    for (let j = rest - 1; j >= 0; j--) k = (k << 8) | bytes[tail + j]!;
    h ^= Math.imul(rotl(Math.imul(k, 0xcc9e2d51), 15), 0x1b873593);
  }
  h ^= bytes.length;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

function keyBytesLittleEndian(key: Uint32Array): Uint8Array {
  const bytes = new Uint8Array(key.length * 4);
  const view = new DataView(bytes.buffer);
  key.forEach((word, i) => view.setUint32(i * 4, word, true));
  return bytes;
}

function xorshift32(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>>= 0);
  };
}

function ipv4Key(protocol: number, src: string, srcPort: number, dst: string, dstPort: number): Uint32Array {
  const word = (text: string): number => text.split('.').reduce((acc, part) => acc * 256 + Number(part), 0);
  const key = new Uint32Array(FLOW_KEY_WORDS);
  key[0] = protocol | (4 << 8);
  key[1] = word(src);
  key[5] = word(dst);
  key[9] = ((srcPort << 16) | dstPort) >>> 0;
  return key;
}

describe('the reference MurmurHash3 used as an oracle', () => {
  it('reproduces the published x86_32 test vectors', () => {
    const vectors: Array<[number[], number, number]> = [
      [[], 0, 0],
      [[], 1, 0x514e28b7],
      [[], 0xffffffff, 0x81f16f39],
      [[0xff, 0xff, 0xff, 0xff], 0, 0x76293b50],
      [[0x21, 0x43, 0x65, 0x87], 0, 0xf55b516b],
      [[0x21, 0x43, 0x65, 0x87], 0x5082edee, 0x2362f9de],
      [[0x21, 0x43, 0x65], 0, 0x7e4a8634],
    ];
    for (const [bytes, seed, expected] of vectors) {
      expect(murmur3Bytes(Uint8Array.from(bytes), seed)).toBe(expected);
    }
  });
});

describe('stringHash', () => {
  it('matches the published MurmurHash3 vectors for ASCII text', () => {
    expect(stringHash('', 0)).toBe(0);
    expect(stringHash('', 1)).toBe(0x514e28b7);
    expect(stringHash('', 0xffffffff)).toBe(0x81f16f39);
    expect(stringHash('!Ce', 0)).toBe(0x7e4a8634); // bytes 21 43 65
    expect(stringHash('Hello world', 0)).toBe(2911983372);
  });

  it('is pinned for real keys as the control plane hashes them (must never change)', () => {
    expect(stringHash('10.0.0.1', 0)).toBe(0xec392163);
    expect(stringHash('10.0.0.1', 42)).toBe(0x560b6af9);
    expect(stringHash('2001:db8::10', 0x9e3779b9)).toBe(0x3ae6af57);
    expect(stringHash('réal-ü-🚀', 7)).toBe(0x0be48329);
  });

  it('hashes the UTF-8 bytes, as Buffer encodes them, including lone surrogates as U+FFFD', () => {
    const texts = ['', 'a', 'ab', 'abc', 'abcd', 'abcde', 'é', 'ü€', '𝄞x', '🚀🚀🚀', 'x\ud800y', '\udc00', 'end\ud83d',
      '192.168.100.200', 'fe80::1ff:fe23:4567:890a', 'ＡＢＣ'];
    for (const text of texts) {
      for (const seed of [0, 1, 0xdeadbeef]) {
        expect(stringHash(text, seed), `${JSON.stringify(text)} seed ${seed}`).toBe(
          murmur3Bytes(Buffer.from(text, 'utf8'), seed),
        );
      }
    }
  });

  it('treats the seed as uint32 (negative and unsigned spellings agree)', () => {
    expect(stringHash('10.0.0.1', -1)).toBe(stringHash('10.0.0.1', 0xffffffff));
  });
});

/**
 * Mean output bits that change when one input bit of a random key flips: 200 keys, every
 * `bitStep`-th of the 320 key bits; the hash's seed 1, or a random one per key.
 */
function meanFlippedBits(hash: (key: Uint32Array, seed: number) => number, opts: { rngSeed: number; bitStep: number; randomSeed: boolean }): number {
  const next = xorshift32(opts.rngSeed);
  const key = new Uint32Array(FLOW_KEY_WORDS);
  let flippedBits = 0;
  let samples = 0;
  for (let trial = 0; trial < 200; trial++) {
    for (let i = 0; i < FLOW_KEY_WORDS; i++) key[i] = next();
    const seed = opts.randomSeed ? next() : 1;
    const base = hash(key, seed);
    for (let bit = 0; bit < 320; bit += opts.bitStep) {
      key[bit >> 5] ^= 1 << (bit & 31);
      for (let diff = (hash(key, seed) ^ base) >>> 0; diff !== 0; diff >>>= 1) flippedBits += diff & 1;
      key[bit >> 5] ^= 1 << (bit & 31);
      samples++;
    }
  }
  return flippedBits / samples;
}

describe('flowHash', () => {
  it('is pinned by literal keys (several LB hosts must agree forever)', () => {
    expect(flowHash(new Uint32Array(10), 0)).toBe(0xc2067ae9);
    // TCP 192.0.2.10:40000 -> 198.51.100.1:443
    const tcp = ipv4Key(6, '192.0.2.10', 40000, '198.51.100.1', 443);
    expect(Array.from(tcp)).toEqual([0x406, 0xc000020a, 0, 0, 0, 0xc6336401, 0, 0, 0, 0x9c4001bb]);
    expect(flowHash(tcp, 0)).toBe(0x2936b7c7);
    expect(flowHash(tcp, 0x5eed)).toBe(0x8aaa3ad2);
    // UDP [2001:db8::1]:53000 -> [2001:db8::80]:53
    const udp6 = Uint32Array.from([17 | (6 << 8), 0x20010db8, 0, 0, 1, 0x20010db8, 0, 0, 0x80, ((53000 << 16) | 53) >>> 0]);
    expect(flowHash(udp6, 0)).toBe(0xc84b09c8);
    expect(flowHash(udp6, 0xffffffff)).toBe(0x7085632b);
  });

  it('equals MurmurHash3 x86_32 of the 40 little-endian key bytes', () => {
    const next = xorshift32(12345);
    const key = new Uint32Array(FLOW_KEY_WORDS);
    for (let trial = 0; trial < 500; trial++) {
      for (let i = 0; i < FLOW_KEY_WORDS; i++) key[i] = next();
      const seed = next();
      expect(flowHash(key, seed)).toBe(murmur3Bytes(keyBytesLittleEndian(key), seed));
    }
  });

  it('flips about half the output bits when one input bit flips', () => {
    const mean = meanFlippedBits(flowHash, { rngSeed: 99, bitStep: 7, randomSeed: false });
    expect(mean).toBeGreaterThan(15.5);
    expect(mean).toBeLessThan(16.5);
  });

  it('spreads sequential client ports evenly over table slots', () => {
    const key = ipv4Key(6, '203.0.113.7', 0, '198.51.100.1', 80);
    const buckets = new Uint32Array(101);
    for (let port = 0; port < 65536; port++) {
      key[9] = ((port << 16) | 80) >>> 0;
      buckets[flowHash(key, 3) % 101]++;
    }
    const expected = 65536 / 101;
    for (const count of buckets) expect(Math.abs(count - expected)).toBeLessThan(expected * 0.15);
  });

  it('refuses a key shorter than 10 words instead of hashing undefined words', () => {
    expect(() => flowHash(new Uint32Array(9), 0)).toThrow(RangeError);
    expect(() => flowHashInt32(new Uint32Array(9), 0)).toThrow(RangeError);
  });
});

describe('flowIndexHash (the flow table\'s own bucket hash)', () => {
  it('flips about half the output bits when one input bit flips, top bits included', () => {
    const mean = meanFlippedBits(flowIndexHash, { rngSeed: 4242, bitStep: 5, randomSeed: true });
    expect(mean).toBeGreaterThan(15.5);
    expect(mean).toBeLessThan(16.5);
  });

  it('flips about half the output bits for IPv4 keys too (their four varying words, another code path)', () => {
    const next = xorshift32(777);
    const varying = [1, 5, 9];
    let flipped = 0;
    let samples = 0;
    for (let trial = 0; trial < 300; trial++) {
      const key = new Uint32Array(FLOW_KEY_WORDS);
      key[0] = (next() & 0xff) | (4 << 8);
      for (const w of varying) key[w] = next();
      const seed = next();
      const base = flowIndexHash(key, seed);
      // The protocol byte of word 0, and every bit of the addresses and ports.
      const bits = [...Array.from({ length: 8 }, (_, b) => [0, b]), ...varying.flatMap((w) => Array.from({ length: 32 }, (_, b) => [w, b]))];
      for (const [w, b] of bits) {
        key[w!] ^= 1 << b!;
        for (let diff = (flowIndexHash(key, seed) ^ base) >>> 0; diff !== 0; diff >>>= 1) flipped += diff & 1;
        key[w!] ^= 1 << b!;
        samples++;
      }
    }
    expect(flipped / samples).toBeGreaterThan(15.5);
    expect(flipped / samples).toBeLessThan(16.5);
  });

  it('spreads sequential client ports evenly over the low (bucket) bits, under any seed', () => {
    const key = ipv4Key(17, '203.0.113.7', 0, '198.51.100.1', 53);
    for (const seed of [0, 1, 0x7fffffff, 0x80000000, 0xdeadbeef]) {
      const buckets = new Uint32Array(4096);
      for (let port = 0; port < 65536; port++) {
        key[9] = ((port << 16) | 53) >>> 0;
        buckets[flowIndexHash(key, seed) & 4095]++;
      }
      // 16 per bucket on average; a fair hash puts no bucket near 3 times that.
      expect(Math.max(...buckets)).toBeLessThan(40);
      expect(buckets.filter((n) => n === 0).length).toBeLessThan(10);
    }
  });

  it('scatters keys that share their bucket bits under one seed when the seed changes', () => {
    // What an attacker who learnt nothing about a table's seed can do: keys that collide under a
    // seed of their choosing (or under flowHash, whose seed is public) are spread under another.
    const key = ipv4Key(6, '192.0.2.1', 0, '198.51.100.1', 443);
    const colliding: number[] = [];
    for (let port = 0; port < 65536; port++) {
      key[9] = ((port << 16) | 443) >>> 0;
      if ((flowIndexHash(key, 12345) & 255) === 7) colliding.push(port);
    }
    expect(colliding.length).toBeGreaterThan(200);
    for (const seed of [12346, 0, 0x9e3779b9]) {
      const homes = new Set<number>();
      for (const port of colliding) {
        key[9] = ((port << 16) | 443) >>> 0;
        homes.add(flowIndexHash(key, seed) & 255);
      }
      // Random placement of ~256 keys into 256 buckets fills about 63% of them.
      expect(homes.size).toBeGreaterThan(140);
    }
  });

  it('has no seed-free collisions from top-bit flips in two words (they cancel in a plain xor of products)', () => {
    const next = xorshift32(31337);
    const key = new Uint32Array(FLOW_KEY_WORDS);
    for (let trial = 0; trial < 500; trial++) {
      for (let i = 0; i < FLOW_KEY_WORDS; i++) key[i] = next();
      const seed = next();
      const a = trial % FLOW_KEY_WORDS;
      const b = (a + 1 + (trial % (FLOW_KEY_WORDS - 1))) % FLOW_KEY_WORDS;
      const base = flowIndexHash(key, seed);
      key[a] ^= 0x80000000;
      key[b] ^= 0x80000000;
      expect(flowIndexHash(key, seed)).not.toBe(base);
    }
  });

  it('lets flips in the top bits of several words collide only by chance, not whatever the seed', () => {
    // A sender choosing the top three bits of words 3, 4 and 9 (IPv6 source, ports): with one
    // multiply per lane some of these 511 variants collided with the original for 1 key in 13.
    const next = xorshift32(2718);
    const key = new Uint32Array(FLOW_KEY_WORDS);
    const words = [3, 4, 9];
    let collisions = 0;
    for (let trial = 0; trial < 100; trial++) {
      for (let i = 0; i < FLOW_KEY_WORDS; i++) key[i] = next();
      const seed = next();
      const base = flowIndexHash(key, seed);
      for (let combo = 1; combo < 512; combo++) {
        const variant = key.slice();
        for (let bit = 0; bit < 9; bit++) if (combo & (1 << bit)) variant[words[Math.floor(bit / 3)]!] ^= 1 << (31 - (bit % 3));
        if (flowIndexHash(variant, seed) === base) collisions++;
      }
    }
    // 51,100 pairs: the one-multiply lanes gave about 100 collisions here; a random function 0.
    expect(collisions).toBeLessThan(10);
  });

  it('is an int32 and refuses a key shorter than 10 words', () => {
    const key = ipv4Key(6, '192.0.2.10', 40000, '198.51.100.1', 443);
    const h = flowIndexHash(key, 99);
    expect(h).toBe(h | 0);
    expect(() => flowIndexHash(new Uint32Array(9), 0)).toThrow(RangeError);
  });
});

describe('flowHashInt32 and mix32Int32 (the packet path\'s view)', () => {
  it('are the same bits as flowHash and mix32, as an int32', () => {
    const tcp = ipv4Key(6, '192.0.2.10', 40000, '198.51.100.1', 443);
    expect(flowHashInt32(tcp, 0x5eed)).toBe(0x8aaa3ad2 | 0); // negative: the top bit is set
    expect(flowHashInt32(tcp, 0)).toBe(0x2936b7c7);
    expect(mix32Int32(0xffffffff)).toBe(0x81f16f39 | 0);
    const next = xorshift32(777);
    const key = new Uint32Array(FLOW_KEY_WORDS);
    let negative = 0;
    for (let trial = 0; trial < 2000; trial++) {
      for (let i = 0; i < FLOW_KEY_WORDS; i++) key[i] = next();
      const seed = next();
      const h = flowHashInt32(key, seed);
      expect(h).toBe(flowHash(key, seed) | 0);
      expect(h >>> 0).toBe(flowHash(key, seed));
      expect(mix32Int32(seed)).toBe(mix32(seed) | 0);
      if (h < 0) negative++;
    }
    expect(negative).toBeGreaterThan(800); // both halves of the range were exercised
  });
});

describe('mix32', () => {
  it('is fmix32: pinned values', () => {
    expect(mix32(0)).toBe(0);
    expect(mix32(1)).toBe(0x514e28b7); // murmur3("", seed 1) is fmix32(1)
    expect(mix32(0xffffffff)).toBe(0x81f16f39);
    expect(mix32(-1)).toBe(0x81f16f39);
    expect(mix32(0x12345678)).toBe(0xe37cd1bc);
  });

  it('is injective on a sample (a bijection of uint32)', () => {
    const seen = new Set<number>();
    for (let i = 0; i < 100_000; i++) seen.add(mix32(i * 40503));
    expect(seen.size).toBe(100_000);
  });
});
