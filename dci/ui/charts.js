"use strict";
/*
 * Disbatch operator console — the Charts page: throughput, queue depth and throughput per node
 * over time, from GET /stats (per-minute buckets the maintenance leader keeps), for the whole
 * fleet or one queue. Drawn with uPlot 1.6.32 (MIT, dci/ui/uPlot.LICENSE), vendored from
 * https://github.com/leeoniya/uPlot/tree/1.6.32/dist (uPlot.iife.min.js, uPlot.min.css) and
 * served by disbatch-web itself: no CDN. uPlot draws on <canvas> and writes every label with
 * textContent, so stored names stay text.
 */

const RANGES = [["60", "1 hour"], ["360", "6 hours"], ["1440", "24 hours"], ["10080", "7 days"]];
/** Buckets change once a minute: reading them every poll would only cost the server. */
const CHART_REFRESH_MS = 15000;
/** More lines than this are unreadable; the busiest nodes are drawn. */
const MAX_NODE_LINES = 8;
/** Points are marked while few enough to tell apart. */
const MAX_MARKED = 90;
const CHART_H = 180;
/** One color per series (canvas strokes cannot take CSS classes). */
const COLORS = ["#1f9d55", "#d64545", "#b7791f", "#3182ce", "#805ad5", "#2c7a7b", "#c05621",
  "#4a5568"];

PAGES.charts = {
  title: "Charts",

  enter(main, ctx) {
    const s = (ctx.state = { key: null, at: 0 });
    const minutes = RANGES.some((r) => r[0] === ctx.params.minutes) ? ctx.params.minutes : "60";
    s.range = selectEl({ id: "charts-range", "aria-label": "time range" }, RANGES, minutes);
    s.queue = selectEl({ id: "charts-queue", "aria-label": "queue" },
      [["", "All queues"]], ctx.params.queue || "");
    const go = () => {
      location.hash = hashFor("charts", { minutes: s.range.value, queue: s.queue.value });
    };
    s.range.addEventListener("change", go);
    s.queue.addEventListener("change", go);
    s.charts = el("div", { id: "charts", class: "charts" });
    s.plots = [];
    // uPlot draws at a fixed pixel size: follow the boxes' width (window, phone rotation).
    s.resize = new ResizeObserver(() => {
      for (const u of s.plots) fitWidth(u);
    });
    main.append(
      el("div", { class: "page-head" }, el("h1", null, "Charts"),
        el("div", { class: "charts-controls" }, s.range, s.queue)),
      el("p", { class: "hint" },
        "Per minute, kept by the maintenance leader for 7 days. Depth is sampled as each minute is written."),
      s.charts,
    );
  },

  async refresh(ctx) {
    const s = ctx.state;
    const minutes = s.range.value;
    const queue = ctx.params.queue || "";
    const key = `${minutes} ${queue}`;
    if (s.key === key && Date.now() - s.at < CHART_REFRESH_MS) {
      ctx.rendered();
      return;
    }
    const path = `stats?minutes=${encodeURIComponent(minutes)}` +
      (queue ? `&queue=${encodeURIComponent(queue)}` : "");
    const [rows, queues] = await Promise.all([api("GET", path), fetchQueues()]);
    if (!ctx.alive()) return;
    if (!isBusy(s.queue)) {
      setOptions(s.queue, [["", "All queues"], ...queues.map((q) => [q.id, shown(q.name)])], queue);
    }
    s.key = key;
    s.at = Date.now();
    const wanted = (Array.isArray(rows) ? rows : []).filter((r) =>
      queue ? r.queue_id === queue || r.queue === queue : r.queue === null);
    const to = Date.now() / 1000;
    const from = to - Number(minutes) * 60;
    drawCharts(s, wanted, from, to);
    ctx.rendered();
  },
};

/** The four charts of a scope's buckets (sorted by minute), replacing those drawn before. */
function drawCharts(s, rows, from, to) {
  const nodeTotals = new Map();
  for (const r of rows) {
    for (const n of Array.isArray(r.nodes) ? r.nodes : []) {
      nodeTotals.set(n.node, (nodeTotals.get(n.node) || 0) + n.succeeded + n.failed + n.lost);
    }
  }
  const nodes = [...nodeTotals.entries()].sort((a, b) => b[1] - a[1]).slice(0, MAX_NODE_LINES);
  const num = (v) => (typeof v === "number" ? v : null);
  const specs = [
    ["chart-throughput", "Finished per minute", [
      ["succeeded", 0, (r) => num(r.succeeded)],
      ["failed", 1, (r) => num(r.failed)],
      ["lost", 2, (r) => num(r.lost)],
    ]],
    ["chart-depth", "Queue depth", [
      ["queued", 3, (r) => num(r.queued)],
      ["running", 4, (r) => num(r.running)],
    ]],
    ["chart-duration", "Duration (ms)", [
      ["mean", 5, (r) => num(r.mean_ms)],
      ["p95", 6, (r) => num(r.p95_ms)],
    ]],
    ["chart-nodes", "Finished per minute, by node", nodes.map(([node], i) => [shown(node), i, (r) => {
      const n = (Array.isArray(r.nodes) ? r.nodes : []).find((x) => x.node === node);
      return n ? n.succeeded + n.failed + n.lost : 0;
    }])],
  ];
  for (const u of s.plots) u.destroy();
  s.resize.disconnect();
  const boxes = specs.map(([id, title, series]) => {
    const box = el("figure", { id, class: "chart-box", "data-points": rows.length,
      "data-series": series.length }, el("figcaption", null, title));
    if (!rows.length) box.append(el("p", { class: "hint" }, "No statistics in this range yet."));
    return box;
  });
  s.charts.replaceChildren(...boxes);
  s.plots = specs.map(([, title, series], i) =>
    lineChart(boxes[i], title, from, to, rows, series));
  for (const box of boxes) s.resize.observe(box);
}

/** A short label for a count or a duration: 1234 → "1.2k". */
function fmtShort(v) {
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (v >= 1e4) return `${Math.round(v / 1e3)}k`;
  if (v >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  return String(Math.round(v * 10) / 10);
}

/** The width a chart may take inside its box (padding excluded). */
function chartWidth(box) {
  const cs = getComputedStyle(box);
  const w = box.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  return Math.max(120, Math.floor(w));
}

function fitWidth(u) {
  const box = u.root.parentNode;
  if (!box || !box.isConnected || !box.clientWidth) return;
  const width = chartWidth(box);
  if (width !== u.width) u.setSize({ width, height: CHART_H });
}

/**
 * One uPlot line chart in `box`: time across (the chosen range), zero-based values up, one line
 * per [name, color, pick(row)] and uPlot's legend (names as text; values follow the cursor).
 */
function lineChart(box, title, from, to, rows, series) {
  const data = [rows.map((r) => r.minute), ...series.map(([, , pick]) => rows.map(pick))];
  const marked = rows.length <= MAX_MARKED;
  const opts = {
    width: chartWidth(box),
    height: CHART_H,
    scales: {
      x: { time: true, range: () => [from, to] },
      y: { range: (u, min, max) => [0, Math.max(1, max || 0) * 1.05] },
    },
    axes: [
      { stroke: "#5b6472", grid: { stroke: "#e3e7ee", width: 1 }, ticks: { show: false } },
      { stroke: "#5b6472", grid: { stroke: "#e3e7ee", width: 1 }, ticks: { show: false },
        size: 44, values: (u, splits) => splits.map(fmtShort) },
    ],
    series: [
      { label: "time" },
      ...series.map(([name, color]) => ({
        label: name,
        stroke: COLORS[color % COLORS.length],
        width: 1.75,
        points: { show: marked, size: 4, fill: COLORS[color % COLORS.length] },
        value: (u, v) => (v === null || v === undefined ? "--" : fmtShort(v)),
      })),
    ],
    legend: { live: true },
    cursor: { drag: { x: false, y: false } },
  };
  const u = new uPlot(opts, data, box);
  u.root.setAttribute("aria-label", title);
  return u;
}
