// Where a V3 ring taken over from an ended loop is read from (afpacket-io.ts takeoverCursor): the
// oldest block user space owns, by the kernel's block numbers, or the block the kernel fills now.
// Synthetic rings: block headers only (status word at byte 8, the u64 sequence number at 24).
import { describe, expect, it } from 'vitest';
import { takeoverCursor } from '../../src/io/afpacket-io.js';

const BLOCK = 4096;

/** A ring of `seqs.length` blocks: block b numbered seqs[b], ours (TP_STATUS_USER) when in `ours`. */
function ring(seqs: readonly number[], ours: readonly number[] = []): Uint32Array {
  const u32 = new Uint32Array((seqs.length * BLOCK) / 4);
  seqs.forEach((seq, b) => {
    const at = (b * BLOCK) / 4;
    u32[at + 2] = ours.includes(b) ? 1 : 0;
    u32[at + 6] = seq % 2 ** 32;
    u32[at + 7] = Math.floor(seq / 2 ** 32);
  });
  return u32;
}

describe('takeoverCursor', () => {
  it('starts at the block the kernel fills now (the highest number) when no block is ours', () => {
    // Blocks 0..5 went round twice; the kernel opened block 2 last (number 15).
    expect(takeoverCursor(ring([13, 14, 15, 10, 11, 12]), 6, BLOCK)).toBe(2);
    // A ring never filled past its first block.
    expect(takeoverCursor(ring([1, 0, 0, 0]), 4, BLOCK)).toBe(0);
  });

  it('starts at the oldest block that is ours, across the end of the ring', () => {
    // Blocks 4, 5, 0 are ours (numbers 10, 11, 12: retired, not given back); the kernel fills 1.
    expect(takeoverCursor(ring([12, 13, 8, 9, 10, 11], [4, 5, 0]), 6, BLOCK)).toBe(4);
    expect(takeoverCursor(ring([12, 13, 8, 9, 10, 11], [0]), 6, BLOCK)).toBe(0);
  });

  it('starts at the oldest block when every block is ours (the ring full)', () => {
    expect(takeoverCursor(ring([20, 21, 22, 17, 18, 19], [0, 1, 2, 3, 4, 5]), 6, BLOCK)).toBe(3);
  });

  it('orders by the whole 64-bit number, not its low word', () => {
    const low = 2 ** 32 - 1;
    // Block 1's number passed 2^32 (low word 0): it is the newer one.
    expect(takeoverCursor(ring([low, low + 1]), 2, BLOCK)).toBe(1);
    expect(takeoverCursor(ring([low, low + 1], [0, 1]), 2, BLOCK)).toBe(0);
  });
});
