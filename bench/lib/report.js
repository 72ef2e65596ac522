// Output of the benchmark: fixed-width text tables for the terminal, the results JSON, and a
// hand-written SVG of grouped bar charts (packet rates, CPU per packet, CPU per GB). Pure functions
// apart from writeJson.

import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';

/**
 * A text table: a header row, a rule, then the rows; numbers right-aligned, text left-aligned.
 * @param {readonly string[]} headers
 * @param {readonly (readonly (string | number | null))[]} rows
 * @returns {string}
 */
export function formatTable(headers, rows) {
  const cells = rows.map((r) => headers.map((_, i) => cellText(r[i])));
  const numeric = headers.map((_, i) => rows.length > 0 && rows.every((r) => r[i] === null || r[i] === undefined || typeof r[i] === 'number'));
  const widths = headers.map((h, i) => Math.max(h.length, ...cells.map((r) => r[i].length)));
  const line = (r) => r.map((c, i) => (numeric[i] ? c.padStart(widths[i]) : c.padEnd(widths[i]))).join('  ').trimEnd();
  return [line(headers), widths.map((w) => '-'.repeat(w)).join('  '), ...cells.map(line)].join('\n');
}

/** @param {string | number | null | undefined} v */
function cellText(v) {
  if (v === null || v === undefined || (typeof v === 'number' && Number.isNaN(v))) return '-';
  if (typeof v === 'number') return formatNumber(v);
  return v;
}

/** 3 significant digits, thousands grouped for large values. */
export function formatNumber(v) {
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a >= 1000) return Math.round(v).toLocaleString('en-US');
  if (Number.isInteger(v)) return String(v);
  if (a >= 100) return v.toFixed(0);
  if (a >= 10) return v.toFixed(1);
  if (a >= 1) return v.toFixed(2);
  if (a === 0) return '0';
  return v.toFixed(3);
}

/** @param {string} path @param {unknown} value */
export function writeJson(path, value) {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, `${JSON.stringify(value, null, 2)}\n`);
}

/** @param {string} s */
export function escapeXml(s) {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#b07aa1'];

/** A "nice" axis maximum and step at or above max (1, 2, 2.5, 5 x 10^k). */
export function niceScale(max, ticks = 5) {
  if (!(max > 0)) return { max: 1, step: 0.2 };
  const raw = max / ticks;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? 10 * mag;
  return { max: Math.ceil(max / step - 1e-9) * step, step };
}

/**
 * One grouped bar chart as an SVG <g> at (x, y), size width x height.
 * @param {{ title: string, unit: string, series: readonly string[], groups: readonly { label: string, values: readonly (number | null)[] }[] }} chart
 */
export function barChartGroup(chart, x, y, width, height) {
  const left = 64;
  const top = 28;
  const bottom = 58;
  const plotW = width - left - 12;
  const plotH = height - top - bottom;
  const values = chart.groups.flatMap((g) => g.values).filter((v) => typeof v === 'number' && Number.isFinite(v));
  const { max, step } = niceScale(Math.max(0, ...values));
  const out = [`<g transform="translate(${x},${y})">`];
  out.push(`<text x="${left}" y="16" font-size="14" font-weight="bold">${escapeXml(chart.title)}</text>`);
  for (let t = 0; t <= max + 1e-9; t += step) {
    const ty = top + plotH - (t / max) * plotH;
    out.push(`<line x1="${left}" x2="${left + plotW}" y1="${ty.toFixed(1)}" y2="${ty.toFixed(1)}" stroke="#ddd"/>`);
    out.push(`<text x="${left - 6}" y="${(ty + 4).toFixed(1)}" font-size="11" text-anchor="end">${escapeXml(formatNumber(t))}</text>`);
  }
  out.push(`<text x="14" y="${top + plotH / 2}" font-size="11" transform="rotate(-90 14 ${top + plotH / 2})" text-anchor="middle">${escapeXml(chart.unit)}</text>`);
  const n = Math.max(1, chart.groups.length);
  const groupW = plotW / n;
  const barW = Math.max(2, (groupW * 0.8) / Math.max(1, chart.series.length));
  chart.groups.forEach((g, gi) => {
    const gx = left + gi * groupW + groupW * 0.1;
    g.values.forEach((v, si) => {
      if (typeof v !== 'number' || !Number.isFinite(v)) return;
      const h = (Math.max(0, v) / max) * plotH;
      const bx = gx + si * barW;
      out.push(`<rect x="${bx.toFixed(1)}" y="${(top + plotH - h).toFixed(1)}" width="${(barW - 1).toFixed(1)}" height="${h.toFixed(1)}" fill="${PALETTE[si % PALETTE.length]}"><title>${escapeXml(`${g.label}, ${chart.series[si]}: ${formatNumber(v)} ${chart.unit}`)}</title></rect>`);
    });
    const lines = g.label.split('\n');
    lines.forEach((l, li) => {
      out.push(`<text x="${(gx + groupW * 0.4).toFixed(1)}" y="${top + plotH + 16 + li * 13}" font-size="11" text-anchor="middle">${escapeXml(l)}</text>`);
    });
  });
  out.push(`<line x1="${left}" x2="${left + plotW}" y1="${top + plotH}" y2="${top + plotH}" stroke="#333"/>`);
  // Legend, top right.
  chart.series.forEach((s, si) => {
    const lx = left + plotW - 190;
    const ly = 6 + si * 14;
    out.push(`<rect x="${lx}" y="${ly}" width="10" height="10" fill="${PALETTE[si % PALETTE.length]}"/>`);
    out.push(`<text x="${lx + 14}" y="${ly + 9}" font-size="11">${escapeXml(s)}</text>`);
  });
  out.push('</g>');
  return out.join('\n');
}

/**
 * A whole SVG document of charts stacked vertically.
 * @param {string} title
 * @param {readonly Parameters<typeof barChartGroup>[0][]} charts
 */
export function renderSvg(title, charts, { width = 900, chartHeight = 300 } = {}) {
  const height = 40 + charts.length * chartHeight;
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif">`,
    `<rect width="${width}" height="${height}" fill="#fff"/>`,
    `<text x="12" y="24" font-size="16" font-weight="bold">${escapeXml(title)}</text>`,
  ];
  charts.forEach((c, i) => parts.push(barChartGroup(c, 0, 36 + i * chartHeight, width, chartHeight)));
  parts.push('</svg>');
  return `${parts.join('\n')}\n`;
}
