// When a router's too-big error about an IPIP tunnel (path-mtu-sockets.ts) has the daemon ask the
// routes again: soon after it (the errors of a burst come together), at most once a gap (a flood,
// forged or not, costs one route lookup a second), never while a refresh runs (it may have read
// the route before the kernel learned the smaller MTU) or before the daemon has started, and
// never after stop. The reals named in between are handed over together.

export interface RouteRefreshHooks {
  /** False while a refresh runs or the daemon is still starting: the trigger waits and asks again. */
  ready(): boolean;
  refresh(reals: readonly string[]): void;
  /** Monotonic milliseconds. */
  now(): number;
}

export class RouteRefreshTrigger {
  private timer: NodeJS.Timeout | null = null;
  private lastAtMs = -Infinity;
  private readonly pending = new Set<string>();
  private stopped = false;

  constructor(
    private readonly hooks: RouteRefreshHooks,
    private readonly delayMs = 50,
    private readonly gapMs = 1000,
  ) {}

  /** A too-big error about a tunnel toward `real`. */
  tooBig(real: string): void {
    if (this.stopped) return;
    this.pending.add(real);
    this.arm();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.pending.clear();
  }

  private arm(): void {
    if (this.timer !== null) return;
    const waitMs = Math.max(this.delayMs, this.lastAtMs + this.gapMs - this.hooks.now());
    this.timer = setTimeout(() => this.fire(), waitMs);
  }

  private fire(): void {
    this.timer = null;
    if (this.stopped) return;
    if (!this.hooks.ready()) {
      this.arm();
      return;
    }
    this.lastAtMs = this.hooks.now();
    const reals = [...this.pending];
    this.pending.clear();
    this.hooks.refresh(reals);
  }
}
