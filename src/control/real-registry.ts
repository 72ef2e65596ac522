// Stable small integer ids for (service, real) pairs. The packet loop's flow table and counters
// refer to reals by id, so an id must not change while flows may point at it: it is kept across
// reloads while the pair exists or still holds flows, and only then reused.

import type { ServiceConfig } from '../config/types.js';

/** The key a service is known by across reloads: protocol, VIP and port (names may change). */
export function serviceIdentity(s: Pick<ServiceConfig, 'protocol' | 'vip' | 'port'>): string {
  return `${s.protocol}|${s.vip}|${s.port}`;
}

export class RealRegistry {
  private readonly ids = new Map<string, number>();
  /** Freed ids, kept sorted high to low so the lowest is popped (sorted lazily: a reload that forgets 8,000 reals sorted 8,000 times). */
  private readonly free: number[] = [];
  private freeSorted = true;
  private nextId = 0;

  constructor(private readonly maxIds: number) {}

  static keyOf(serviceIdentity: string, address: string): string {
    return `${serviceIdentity}#${address}`;
  }

  /** The id of a pair, allocating one if the pair is new. */
  idFor(key: string): number {
    const existing = this.ids.get(key);
    if (existing !== undefined) return existing;
    if (this.available() === 0) throw new RangeError(`more than ${this.maxIds} reals`);
    if (!this.freeSorted) {
      this.free.sort((a, b) => b - a);
      this.freeSorted = true;
    }
    const id = this.free.length > 0 ? this.free.pop()! : this.nextId++;
    this.ids.set(key, id);
    return id;
  }

  /** How many new pairs could get an id now (ids of removed pairs still draining are not free). */
  available(): number {
    return this.free.length + Math.max(0, this.maxIds - this.nextId);
  }

  /** Pairs holding an id. */
  get size(): number {
    return this.ids.size;
  }

  has(key: string): boolean {
    return this.ids.has(key);
  }

  /** Give an id back once nothing refers to it any more (no config entry, no flows). */
  release(key: string): void {
    const id = this.ids.get(key);
    if (id === undefined) return;
    this.ids.delete(key);
    this.free.push(id);
    this.freeSorted = false;
  }

  entries(): IterableIterator<[string, number]> {
    return this.ids.entries();
  }
}
