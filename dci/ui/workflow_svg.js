"use strict";
/*
 * Disbatch operator console — drawing a graph or a batch as SVG (used by workflows.js).
 * A graph's tasks sit in layers by dependency depth (the longest path from a task that waits on
 * nothing), a wide layer wrapping into rows of WF_PER_ROW, each layer ordered by where its
 * dependencies sit so edges cross less; an edge runs from each dependency down to its
 * dependent. A batch is a grid of its members above its callback, an edge from each member.
 * Colours come from workflows.css (no inline styles: the page's CSP forbids them); text
 * reaches the SVG as text nodes only.
 */

const SVG_NS = "http://www.w3.org/2000/svg";
const WF_NODE_W = 168;
const WF_NODE_H = 42;
const WF_GAP_X = 22;
const WF_ROW_GAP = 16;      // between the rows of one wrapped layer
const WF_LAYER_GAP = 52;    // between layers: room for the edges to bend
const WF_PER_ROW = 8;       // ~1500 px: wider layers wrap, so a 300-task fan-out stays legible
const WF_PAD = 14;
const WF_LABEL_CHARS = 22;
/* A batch with more members than this draws them as small squares, 40 to a row. */
const WF_COMPACT_OVER = 48;
const WF_CELL = 14;
const WF_CELL_GAP = 4;
const WF_CELLS_PER_ROW = 40;

/** svgEl("g", {class: "x", dataset: {task: id}}, child, "text") — the SVG twin of el(). */
function svgEl(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "dataset") {
      for (const [dk, dv] of Object.entries(v)) if (dv !== null && dv !== undefined) node.dataset[dk] = dv;
    }
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

/** A stored name for a box: escaped like every name, then cut to fit the box. */
function wfBoxLabel(text) {
  const chars = [...shown(text)];
  return chars.length > WF_LABEL_CHARS ? chars.slice(0, WF_LABEL_CHARS - 1).join("") + "…" : chars.join("");
}

const wfShortId = (id) => `…${String(id).slice(-8)}`;

/** What a blocked task still waits on; an ended one waits on nothing, whatever it stores. */
const wfWaitingOn = (t) => new Set(t && t.state === "blocked" ? (t.waiting_on || []).map(String) : []);

/**
 * Nodes of a graph view with their layer: { nodes: Map id → node, layers: [[node]] }. A
 * dependency outside the graph (an existing task) gets a node of its own, marked `ext`.
 */
function wfGraphLayers(view) {
  const tasks = Array.isArray(view.tasks) ? view.tasks : [];
  const nodes = new Map();
  tasks.forEach((t, i) => nodes.set(String(t.id), {
    id: String(t.id), task: t, order: i, deps: [], name: t.name ?? wfShortId(t.id),
    state: t.state || "other", waiting: wfWaitingOn(t),
  }));
  for (const t of tasks) {
    const node = nodes.get(String(t.id));
    for (const d of new Set((t.depends_on || []).map(String))) {
      if (!nodes.has(d)) {
        nodes.set(d, { id: d, ext: true, order: -1, deps: [], name: `task ${wfShortId(d)}`,
          state: "outside", waiting: new Set() });
      }
      node.deps.push(d);
    }
  }
  // Longest path from a root, in Kahn's order: each node once, each edge once.
  const dependents = new Map([...nodes.keys()].map((k) => [k, []]));
  const left = new Map();
  for (const n of nodes.values()) {
    left.set(n.id, n.deps.length);
    for (const d of n.deps) dependents.get(d).push(n.id);
  }
  const queue = [...nodes.values()].filter((n) => n.deps.length === 0).map((n) => n.id);
  const depth = new Map(queue.map((id) => [id, 0]));
  for (let i = 0; i < queue.length; i++) {
    const id = queue[i];
    for (const d of dependents.get(id)) {
      depth.set(d, Math.max(depth.get(d) || 0, depth.get(id) + 1));
      left.set(d, left.get(d) - 1);
      if (left.get(d) === 0) queue.push(d);
    }
  }
  const layers = [];
  for (const n of nodes.values()) {
    // The server refuses cycles; a hand-edited one still shows its tasks, in the first layer.
    n.layer = depth.has(n.id) ? depth.get(n.id) : 0;
    (layers[n.layer] = layers[n.layer] || []).push(n);
  }
  return { nodes, layers: layers.filter(Boolean) };
}

/**
 * Places nodes (x, y) layer by layer; returns the drawing's width and height and its rows
 * ({y, lefts}: where each row's boxes start), which long edges are routed around.
 */
function wfPlaceLayers(nodes, layers) {
  const widest = Math.max(1, ...layers.map((l) => l.length));
  const cols = Math.min(WF_PER_ROW, widest);
  let y = WF_PAD;
  const rows = [];
  layers.forEach((layer, k) => {
    if (k > 0) {
      // By the mean place of its dependencies in their layers' reading order (left to right,
      // row by row): fewer crossings, and a wrapped layer's children wrap the same way.
      const at = (n) => n.deps.reduce((sum, d) => sum + nodes.get(d).rank, 0) / (n.deps.length || 1);
      for (const n of layer) n.bary = at(n);
      layer.sort((a, b) => a.bary - b.bary || a.order - b.order);
    } else {
      layer.sort((a, b) => a.order - b.order);
    }
    layer.forEach((n, i) => { n.rank = (i + 0.5) / layer.length; });
    for (let r = 0; r < layer.length; r += cols) {
      const row = layer.slice(r, r + cols);
      const offset = (cols - row.length) / 2;
      row.forEach((n, i) => {
        n.x = WF_PAD + (offset + i) * (WF_NODE_W + WF_GAP_X);
        n.y = y;
      });
      rows.push({ y, lefts: row.map((n) => n.x) });
      y += WF_NODE_H + WF_ROW_GAP;
    }
    y += WF_LAYER_GAP - WF_ROW_GAP;
  });
  return {
    width: 2 * WF_PAD + cols * (WF_NODE_W + WF_GAP_X) - WF_GAP_X,
    height: y - WF_LAYER_GAP + WF_PAD,
    rows,
  };
}

/**
 * An edge from the bottom of `from` to the top of `to` (boxes w × h, `to` toW wide). Where it
 * crosses a row of boxes on the way (a dependency two layers up, a wrapped layer), it passes
 * through the nearest gap between that row's boxes instead of behind one, so it cannot be
 * read as ending there.
 */
function wfEdgePath(from, to, w, h, toW, rows) {
  const start = [from.x + w / 2, from.y + h];
  const end = [to.x + (toW ?? w) / 2, to.y - 3];   // the arrowhead ends at the box
  const points = [start];
  for (const row of rows || []) {
    if (row.y <= from.y || row.y >= to.y) continue;
    const mid = row.y + h / 2;
    let x = start[0] + (end[0] - start[0]) * (mid - start[1]) / (end[1] - start[1]);
    const hit = row.lefts.find((left) => x > left - WF_GAP_X / 4 && x < left + w + WF_GAP_X / 4);
    if (hit !== undefined) {
      x = x - hit < hit + w - x ? hit - WF_GAP_X / 2 : hit + w + WF_GAP_X / 2;
    }
    points.push([x, row.y - 4], [x, row.y + h + 4]);
  }
  points.push(end);
  const f = (n) => n.toFixed(1);
  let d = `M${f(start[0])},${f(start[1])}`;
  for (let i = 1; i < points.length; i++) {
    const [[px, py], [qx, qy]] = [points[i - 1], points[i]];
    if (i % 2 === 0) {
      d += ` L${f(qx)},${f(qy)}`;   // straight down through a row's gap
    } else {
      const bend = Math.max(12, (qy - py) / 2);
      d += ` C${f(px)},${f(py + bend)} ${f(qx)},${f(qy - bend)} ${f(qx)},${f(qy)}`;
    }
  }
  return d;
}

function wfSvgRoot(width, height, label, state) {
  return svgEl("svg", {
    id: "wf-svg", xmlns: SVG_NS, width, height, viewBox: `0 0 ${width} ${height}`,
    role: "img", "aria-label": label, dataset: { state: state || "" },
  }, svgEl("defs", null,
    svgEl("marker", { id: "wf-arrow", viewBox: "0 0 8 8", refX: 7, refY: 4, markerWidth: 7,
      markerHeight: 7, orient: "auto-start-reverse" }, svgEl("path", { d: "M0,0 L8,4 L0,8 z" }))));
}

/** The tooltip of a node: everything the box has no room for. */
function wfNodeTitle(lines) {
  return svgEl("title", null, lines.filter(Boolean).join("\n"));
}

/** A task box linking to the task's page. */
function wfTaskBox(n, extra) {
  const t = n.task || {};
  const waits = n.waiting.size;
  const stateText = waits ? `${n.state} · waits on ${waits}` : n.state;
  const box = svgEl("g", {
    class: `${n.ext ? "wf-ext" : "wf-node"} wf-st-${n.state}`,
    transform: `translate(${n.x},${n.y})`,
    dataset: { task: n.id, state: n.state, name: n.ext ? null : String(n.name), layer: n.layer },
  },
  wfNodeTitle([shown(n.name), n.id, n.ext ? "a task outside this graph" : `state: ${n.state}`,
    ...(extra || []), t.cancel_reason ? `cancelled: ${shown(t.cancel_reason)}` : null]),
  svgEl("rect", { width: WF_NODE_W, height: WF_NODE_H, rx: 6, ry: 6 }),
  svgEl("text", { x: 9, y: 17, class: "wf-name" }, wfBoxLabel(n.name)),
  svgEl("text", { x: 9, y: 33, class: "wf-state" }, stateText));
  return svgEl("a", { href: `#/task/${encodeURIComponent(n.id)}`, class: "wf-link" }, box);
}

/** The SVG of a graph view. */
function drawGraph(view) {
  const { nodes, layers } = wfGraphLayers(view);
  const size = wfPlaceLayers(nodes, layers);
  const svg = wfSvgRoot(size.width, size.height, `graph of ${nodes.size} tasks`, view.state);
  const edges = svgEl("g", { class: "wf-edges" });
  const boxes = svgEl("g", { class: "wf-boxes" });
  const names = new Map([...nodes.values()].map((n) => [n.id, n.name]));
  for (const n of nodes.values()) {
    for (const d of n.deps) {
      edges.append(svgEl("path", {
        class: `wf-edge${n.waiting.has(d) ? " waiting" : ""}`,
        d: wfEdgePath(nodes.get(d), n, WF_NODE_W, WF_NODE_H, WF_NODE_W, size.rows),
        "marker-end": "url(#wf-arrow)",
        dataset: { from: d, to: n.id },
      }));
    }
    const waits = [...n.waiting].map((id) => shown(names.get(id) ?? id));
    boxes.append(wfTaskBox(n, [waits.length ? `waiting on: ${waits.join(", ")}` : null]));
  }
  svg.append(edges, boxes);
  return svg;
}

/** The SVG of a batch view: its members (as many as the server listed) above its callback. */
function drawBatch(view) {
  const members = Array.isArray(view.tasks) ? view.tasks : [];
  const compact = members.length > WF_COMPACT_OVER;
  const [w, h, gap, perRow] = compact
    ? [WF_CELL, WF_CELL, WF_CELL_GAP, WF_CELLS_PER_ROW]
    : [WF_NODE_W, WF_NODE_H, WF_GAP_X, WF_PER_ROW];
  const cols = Math.max(1, Math.min(perRow, members.length));
  const gridWidth = cols * (w + gap) - gap;
  const callback = view.callback && typeof view.callback === "object" ? view.callback : null;
  const width = 2 * WF_PAD + Math.max(gridWidth, callback ? WF_NODE_W : 0);
  const left = WF_PAD + (width - 2 * WF_PAD - gridWidth) / 2;
  const nodes = members.map((t, i) => ({
    id: String(t.id), task: t, name: wfShortId(t.id), state: t.state || "other",
    waiting: new Set(), x: left + (i % cols) * (w + gap),
    y: WF_PAD + Math.floor(i / cols) * (h + (compact ? gap : WF_ROW_GAP)),
  }));
  const rowCount = Math.ceil(members.length / cols);
  const rows = [];
  for (let r = 0; r < rowCount; r++) {
    const inRow = nodes.slice(r * cols, (r + 1) * cols);
    rows.push({ y: inRow[0].y, lefts: inRow.map((n) => n.x) });
  }
  let height = WF_PAD + rowCount * (h + (compact ? gap : WF_ROW_GAP)) - (compact ? gap : WF_ROW_GAP);
  let cb = null;
  if (callback) {
    cb = { id: String(callback.id), task: callback, name: "callback", state: callback.state || "other",
      waiting: wfWaitingOn(callback),
      x: (width - WF_NODE_W) / 2, y: height + WF_LAYER_GAP * 1.5 };
    height = cb.y + WF_NODE_H;
  }
  height += WF_PAD;
  const svg = wfSvgRoot(width, height, `batch of ${members.length} shown tasks`, view.state);
  const edges = svgEl("g", { class: `wf-edges${compact ? " compact" : ""}` });
  const boxes = svgEl("g", { class: "wf-boxes" });
  for (const n of nodes) {
    if (cb) {
      edges.append(svgEl("path", {
        class: `wf-edge${cb.waiting.has(n.id) ? " waiting" : ""}`,
        // Hundreds of compact edges are a fan, not routes: only boxes are routed around.
        d: wfEdgePath(n, cb, w, h, WF_NODE_W, compact ? null : rows),
        "marker-end": compact ? null : "url(#wf-arrow)",
        dataset: { from: n.id, to: cb.id },
      }));
    }
    if (compact) {
      boxes.append(svgEl("a", { href: `#/task/${encodeURIComponent(n.id)}`, class: "wf-link" },
        svgEl("g", { class: `wf-node wf-cell wf-st-${n.state}`, dataset: { task: n.id, state: n.state } },
          wfNodeTitle([n.id, `state: ${n.state}`,
            n.task.cancel_reason ? `cancelled: ${shown(n.task.cancel_reason)}` : null]),
          svgEl("rect", { x: n.x, y: n.y, width: w, height: h, rx: 2, ry: 2 }))));
    } else {
      boxes.append(wfTaskBox(n));
    }
  }
  if (cb) {
    const box = wfTaskBox(cb, [cb.waiting.size ? `waiting on ${cb.waiting.size} members` : null]);
    box.firstChild.classList.add("wf-callback");
    boxes.append(box);
  }
  svg.append(edges, boxes);
  return svg;
}
