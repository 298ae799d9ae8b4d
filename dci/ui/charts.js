"use strict";
/*
 * Disbatch operator console — the Charts page: throughput, queue depth and throughput per node
 * over time, from GET /stats (per-minute buckets the maintenance leader keeps), for the whole
 * fleet or one queue. The charts are plain SVG drawn here: no library, every label a text node.
 */

const RANGES = [["60", "1 hour"], ["360", "6 hours"], ["1440", "24 hours"], ["10080", "7 days"]];
/** Buckets change once a minute: reading them every poll would only cost the server. */
const CHART_REFRESH_MS = 15000;
/** More lines than this are unreadable; the busiest nodes are drawn. */
const MAX_NODE_LINES = 8;
/** Points are marked while few enough to tell apart. */
const MAX_MARKED = 90;
const SVG_NS = "http://www.w3.org/2000/svg";
const CHART_W = 400;
const CHART_H = 180;
const PAD = { left: 40, right: 8, top: 10, bottom: 22 };

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
    s.charts.replaceChildren(...drawCharts(wanted, from, to));
    ctx.rendered();
  },
};

/** The three charts of a scope's buckets (sorted by minute). */
function drawCharts(rows, from, to) {
  const at = (r) => r.minute;
  const series = (name, cls, pick) => ({
    name, cls,
    points: rows.filter((r) => typeof pick(r) === "number").map((r) => [at(r), pick(r)]),
  });
  const nodeTotals = new Map();
  for (const r of rows) {
    for (const n of Array.isArray(r.nodes) ? r.nodes : []) {
      nodeTotals.set(n.node, (nodeTotals.get(n.node) || 0) + n.succeeded + n.failed + n.lost);
    }
  }
  const nodes = [...nodeTotals.entries()].sort((a, b) => b[1] - a[1]).slice(0, MAX_NODE_LINES);
  const perNode = nodes.map(([node], i) => series(shown(node), `s${i % 8}`, (r) => {
    const n = (Array.isArray(r.nodes) ? r.nodes : []).find((x) => x.node === node);
    return n ? n.succeeded + n.failed + n.lost : 0;
  }));
  return [
    lineChart("chart-throughput", "Finished per minute", from, to, [
      series("succeeded", "s0", (r) => r.succeeded),
      series("failed", "s1", (r) => r.failed),
      series("lost", "s2", (r) => r.lost),
    ]),
    lineChart("chart-depth", "Queue depth", from, to, [
      series("queued", "s3", (r) => r.queued),
      series("running", "s4", (r) => r.running),
    ]),
    lineChart("chart-duration", "Duration (ms)", from, to, [
      series("mean", "s5", (r) => r.mean_ms),
      series("p95", "s6", (r) => r.p95_ms),
    ]),
    lineChart("chart-nodes", "Finished per minute, by node", from, to, perNode),
  ];
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

/** A short label for a count or a duration: 1234 → "1.2k". */
function fmtShort(v) {
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (v >= 1e4) return `${Math.round(v / 1e3)}k`;
  if (v >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  return String(Math.round(v * 10) / 10);
}

function fmtAxisTime(seconds, span) {
  const d = new Date(seconds * 1000);
  const hm = d.toTimeString().slice(0, 5);
  return span > 86400 ? `${d.getMonth() + 1}/${d.getDate()} ${hm}` : hm;
}

/** One line chart as a <figure>: an SVG scaled to its box, a title and a legend. */
function lineChart(id, title, from, to, seriesList) {
  const all = seriesList.flatMap((s) => s.points);
  const max = Math.max(1, ...all.map((p) => p[1]));
  const span = Math.max(1, to - from);
  const w = CHART_W - PAD.left - PAD.right;
  const h = CHART_H - PAD.top - PAD.bottom;
  const x = (t) => PAD.left + Math.min(1, Math.max(0, (t - from) / span)) * w;
  const y = (v) => PAD.top + h - (v / max) * h;
  const chart = svg("svg", {
    viewBox: `0 0 ${CHART_W} ${CHART_H}`, role: "img", class: "chart",
    "aria-label": title, "data-points": all.length,
  }, svg("title", null, title));
  for (const v of [0, max / 2, max]) {
    chart.append(
      svg("line", { class: "grid-line", x1: PAD.left, x2: CHART_W - PAD.right, y1: y(v), y2: y(v) }),
      svg("text", { class: "tick", x: PAD.left - 4, y: y(v) + 4, "text-anchor": "end" }, fmtShort(v)));
  }
  chart.append(
    svg("text", { class: "tick", x: PAD.left, y: CHART_H - 6 }, fmtAxisTime(from, span)),
    svg("text", { class: "tick", x: CHART_W - PAD.right, y: CHART_H - 6, "text-anchor": "end" },
      fmtAxisTime(to, span)));
  for (const s of seriesList) {
    if (!s.points.length) continue;
    const points = s.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    const g = svg("g", { class: `series ${s.cls}`, "data-series": s.name },
      svg("polyline", { points }));
    if (s.points.length <= MAX_MARKED) {
      for (const [t, v] of s.points) {
        g.append(svg("circle", { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2 },
          svg("title", null, `${s.name} ${fmtAxisTime(t, span)}: ${fmtShort(v)}`)));
      }
    }
    chart.append(g);
  }
  const legend = el("ul", { class: "legend" }, seriesList.map((s) =>
    el("li", null, el("span", { class: `swatch ${s.cls}` }), s.name)));
  const empty = all.length ? null : el("p", { class: "hint" }, "No statistics in this range yet.");
  return el("figure", { id, class: "chart-box" }, el("figcaption", null, title), chart, legend, empty);
}
