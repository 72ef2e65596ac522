// Duration text as written in the config file ("250ms", "2s", "15m", or a plain number of seconds)
// and back: parsing yields whole milliseconds, formatting yields the shortest exact unit.

/** Largest duration accepted: Node timers hold at most 2^31-1 ms (about 24.8 days). */
export const MAX_DURATION_MS = 2 ** 31 - 1;

const UNIT_MS: Readonly<Record<string, number>> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
const DURATION_RE = /^(\d+(?:\.\d+)?)(ms|s|m|h)$/;

export type DurationParse = { ok: true; ms: number } | { ok: false; message: string };

/**
 * Parses a positive duration. Strings need a unit (ms, s, m or h); a plain YAML number
 * means seconds, as keepalived's delay_loop and connect_timeout do, so `interval: 2` is 2 s.
 * The result must be a whole, positive number of milliseconds no larger than MAX_DURATION_MS.
 */
export function parseDurationMs(value: unknown): DurationParse {
  let ms: number;
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) return { ok: false, message: `${String(value)} is not a duration (e.g. 250ms, 2s, 15m)` };
    ms = value * 1000;
  } else if (typeof value === 'string') {
    const match = DURATION_RE.exec(value);
    if (match === null) {
      return { ok: false, message: `${JSON.stringify(value)} is not a duration (a number with a unit ms, s, m or h, e.g. 250ms, 2s, 15m, 1h)` };
    }
    ms = Number(match[1]) * (UNIT_MS[match[2] as string] as number);
  } else {
    return { ok: false, message: `${describeNonText(value)} is not a duration (e.g. 250ms, 2s, 15m)` };
  }
  const shown = typeof value === 'string' ? JSON.stringify(value) : String(value);
  // Rounding absorbs binary noise such as 0.1 * 1000; a real fraction of a millisecond stays an error.
  const rounded = Math.round(ms);
  if (Math.abs(ms - rounded) > 1e-6) return { ok: false, message: `${shown} is not a whole number of milliseconds` };
  if (rounded <= 0) return { ok: false, message: `${shown} is not a positive duration` };
  if (rounded > MAX_DURATION_MS) return { ok: false, message: `${shown} is longer than the maximum of ${formatDurationMs(MAX_DURATION_MS)}` };
  return { ok: true, ms: rounded };
}

/** Shortest exact text for a duration: 1500 -> "1500ms", 2000 -> "2s", 900000 -> "15m". */
export function formatDurationMs(ms: number): string {
  if (ms > 0 && ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms > 0 && ms % 60_000 === 0) return `${ms / 60_000}m`;
  if (ms > 0 && ms % 1000 === 0) return `${ms / 1000}s`;
  return `${ms}ms`;
}

function describeNonText(value: unknown): string {
  if (value === null || value === undefined) return 'an empty value';
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object') return 'a mapping';
  return String(value);
}
