// Types of report.js (plain JavaScript so `npm run bench` needs no build step).

export interface BarChart {
  title: string;
  unit: string;
  series: readonly string[];
  groups: readonly { label: string; values: readonly (number | null)[] }[];
}

export declare function formatTable(headers: readonly string[], rows: readonly (readonly (string | number | null | undefined)[])[]): string;
export declare function formatNumber(v: number): string;
export declare function writeJson(path: string, value: unknown): void;
export declare function escapeXml(s: string): string;
export declare function niceScale(max: number, ticks?: number): { max: number; step: number };
export declare function barChartGroup(chart: BarChart, x: number, y: number, width: number, height: number): string;
export declare function renderSvg(title: string, charts: readonly BarChart[], opts?: { width?: number; chartHeight?: number }): string;
