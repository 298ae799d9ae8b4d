"use strict";
/*
 * Disbatch operator console — workflows. The Workflows page lists the newest graphs and
 * batches (GET graphs, GET batches); #/graphs/ID and #/batches/ID show one (GET graphs/:id,
 * GET batches/:id): its outcome, counts, a drawing (workflow_svg.js) and, while it is active, a
 * Cancel button. An active one is read at every poll; an ended one only every
 * WF_ENDED_POLL_MS, since a retried task can still wake it.
 */

const WF_ENDED_POLL_MS = 15000;
const WF_COUNT_ORDER = ["succeeded", "failed", "terminated", "orphaned", "cancelled", "running",
  "claimed", "queued", "blocked", "other"];
const WF_OUTCOME_CLASS = {
  active: "st-running", succeeded: "st-succeeded", failed: "st-failed", cancelled: "st-cancelled",
};

/** The pages of one graph or batch belong under Workflows in the navigation. */
function markWorkflowsNav() {
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.dataset.page === "workflows") a.classList.add("active");
  }
}

const wfRoute = (kind) => (kind === "graph" ? "graphs" : "batches");
const wfMuted = (text) => el("span", { class: "muted" }, text);
const wfWhen = (v) => (v === null || v === undefined ? wfMuted("—") : timeEl(v));

/* ---------- the list ---------- */

PAGES.workflows = {
  title: "Workflows",

  enter(main, ctx) {
    markWorkflowsNav();
    const s = (ctx.state = {});
    s.graphs = gridTable("graphs-table", ["graph", "created", ["tasks", "num"], "cancelled"]);
    s.batches = gridTable("batches-table",
      ["batch", "created", ["tasks", "num"], "done", "callback", "cancelled"]);
    main.append(
      el("div", { class: "page-head" }, el("h1", null, "Workflows"),
        el("span", { class: "hint" }, "task graphs and batches, newest first")),
      wfOpenForm(),
      el("section", { class: "card" }, el("h2", null, "Graphs"), s.graphs.wrap),
      el("section", { class: "card" }, el("h2", null, "Batches"), s.batches.wrap));
  },

  async refresh(ctx) {
    const s = ctx.state;
    const [graphs, batches] = await Promise.all([api("GET", "graphs"), api("GET", "batches")]);
    if (!ctx.alive()) return;
    if (changed(s, "graphs", graphs)) wfFillList(s.graphs.tbody, graphs, "graph");
    if (changed(s, "batches", batches)) wfFillList(s.batches.tbody, batches, "batch");
    ctx.rendered();
  },
};

/** Opens a graph or batch by the id a script or the CLI printed. */
function wfOpenForm() {
  const input = el("input", { id: "wf-open-id", type: "text", placeholder: "graph or batch id",
    autocomplete: "off", spellcheck: "false" });
  const go = (kind) => {
    const id = input.value.trim();
    if (id) location.hash = `#/${wfRoute(kind)}/${encodeURIComponent(id)}`;
  };
  const form = el("form", { id: "wf-open", class: "card form-row", novalidate: true },
    el("label", { class: "field" }, el("span", null, "Open by id"), input),
    el("div", { class: "field submit" },
      el("button", { type: "submit", id: "wf-open-graph", class: "primary" }, "Graph")),
    el("div", { class: "field submit" },
      el("button", { type: "button", id: "wf-open-batch", onclick: () => go("batch") }, "Batch")));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    go("graph");
  });
  return form;
}

function wfFillList(tbody, rows, kind) {
  const list = Array.isArray(rows) ? rows : [];
  if (!list.length) {
    const cols = kind === "graph" ? 4 : 6;
    tbody.replaceChildren(el("tr", { class: "empty" },
      el("td", { colspan: cols }, kind === "graph" ? "No graphs." : "No batches.")));
    return;
  }
  tbody.replaceChildren(...list.map((r) => {
    const id = String(r.id);
    const cells = [
      el("td", { class: "id" },
        el("a", { href: `#/${wfRoute(kind)}/${encodeURIComponent(id)}`, class: "mono" }, id)),
      el("td", null, wfWhen(r.ctime)),
      el("td", { class: "num" }, String(r.size ?? "")),
    ];
    if (kind === "batch") {
      cells.push(el("td", null, wfWhen(r.done)), el("td", { class: "id" }, r.callback
        ? el("a", { href: `#/task/${encodeURIComponent(r.callback)}`, class: "mono" }, String(r.callback))
        : wfMuted("none")));
    }
    cells.push(el("td", null, wfWhen(r.cancelled)));
    return el("tr", { dataset: { id } }, cells);
  }));
}

/* ---------- one graph or batch ---------- */

function workflowPage(kind) {
  const title = kind === "graph" ? "Graph" : "Batch";
  return {
    title,

    enter(main, ctx) {
      if (!ctx.arg) {
        PAGES.workflows.enter(main, ctx);
        return;
      }
      markWorkflowsNav();
      const s = (ctx.state = { id: ctx.arg, fetched: 0 });
      s.msg = msgBox("wf-msg");
      s.badge = el("span", { id: "wf-state", class: "status st-unknown" }, "…");
      s.facts = el("dl", { id: "wf-facts", class: "kv wf-facts" });
      s.counts = el("div", { id: "wf-counts", class: "wf-counts" });
      s.cancel = el("button", { type: "button", id: "wf-cancel", class: "danger", hidden: true,
        onclick: () => cancelWorkflow(ctx, kind) }, `Cancel ${kind}`);
      s.note = el("p", { id: "wf-note", class: "hint" });
      s.canvas = el("div", { id: "wf-canvas", class: "wf-canvas" });
      main.append(
        el("div", { class: "page-head" },
          el("h1", null, `${title} `, el("span", { class: "mono" }, shown(ctx.arg))), s.badge,
          el("a", { href: "#/workflows", class: "back" }, "← all workflows")),
        s.msg,
        el("section", { class: "card wf-summary" }, s.facts, s.counts,
          el("div", { class: "task-actions" }, s.cancel)),
        el("section", { class: "card wf-drawing" }, s.note, s.canvas));
      if (kind === "graph") {
        s.table = gridTable("wf-tasks", ["name", "state", "waiting on", "cancel reason"]);
        main.append(el("section", { class: "card" }, el("h2", null, "tasks"), s.table.wrap));
      }
    },

    async refresh(ctx) {
      if (!ctx.arg) {
        await PAGES.workflows.refresh(ctx);
        return;
      }
      const s = ctx.state;
      if (s.view && s.view.state !== "active" && Date.now() - s.fetched < WF_ENDED_POLL_MS) return;
      const view = await api("GET", `${wfRoute(kind)}/${encodeURIComponent(s.id)}`);
      if (!ctx.alive()) return;
      s.fetched = Date.now();
      s.view = view && typeof view === "object" ? view : {};
      if (changed(s, "view", s.view)) renderWorkflow(s, kind, s.view);
      ctx.rendered();
    },
  };
}

PAGES.graphs = workflowPage("graph");
PAGES.batches = workflowPage("batch");

function renderWorkflow(s, kind, view) {
  const state = String(view.state || "unknown");
  s.badge.className = `status ${WF_OUTCOME_CLASS[state] || "st-unknown"}`;
  s.badge.dataset.state = state;
  s.badge.textContent = state;
  s.cancel.hidden = state !== "active";

  const facts = [["created", wfWhen(view.ctime)], ["tasks", String(view.size ?? "")]];
  if (kind === "batch") {
    const cb = view.callback && typeof view.callback === "object" ? view.callback : null;
    facts.push(["callback", cb
      ? el("span", null, el("a", { href: `#/task/${encodeURIComponent(cb.id)}`, class: "mono" },
        String(cb.id)), " ", wfStateChip(cb.state))
      : wfMuted("none")]);
    facts.push(["done", wfWhen(view.done)]);
  }
  if (view.cancelled) facts.push(["cancelled", wfWhen(view.cancelled)]);
  s.facts.replaceChildren(...facts.flatMap(([k, v]) => [el("dt", null, k), el("dd", null, v)]));

  const counts = view.counts && typeof view.counts === "object" ? view.counts : {};
  const keys = [...WF_COUNT_ORDER, ...Object.keys(counts).filter((k) => !WF_COUNT_ORDER.includes(k)).sort()];
  s.counts.replaceChildren(...keys.filter((k) => counts[k] > 0).map((k) =>
    el("span", { class: `status ${wfStClass(k)}`, dataset: { count: k } }, `${counts[k]} ${k}`)));

  if (kind === "graph") {
    s.note.textContent = `${(view.tasks || []).length} tasks; arrows run from a task to what ` +
      "waits on it, dashed while it still waits; a wide layer wraps into rows. Click a task to open it.";
    s.canvas.replaceChildren(drawGraph(view));
    fillGraphTable(s.table.tbody, view.tasks || []);
  } else {
    const shownCount = (view.tasks || []).length;
    const size = Number(view.size) || shownCount;
    s.note.textContent = (shownCount < size
      ? `The first ${shownCount} of ${size} members are drawn (the counts cover them all). `
      : `${size} member${size === 1 ? "" : "s"}. `) +
      (view.callback ? "Each member has an arrow to the callback, which runs once they have all ended." : "");
    s.canvas.replaceChildren(drawBatch(view));
  }
}

/** A task state's colour class, as the task pages colour statuses. */
const wfStClass = (state) => (WF_STATE_CLASSES.has(state) ? `st-${state}` : "st-unknown");
const WF_STATE_CLASSES = new Set(["queued", "claimed", "running", "succeeded", "failed", "terminated",
  "blocked", "cancelled", "orphaned"]);

function wfStateChip(state) {
  return el("span", { class: `status ${wfStClass(state)}`, dataset: { state: String(state) } },
    String(state ?? "unknown"));
}

function fillGraphTable(tbody, tasks) {
  const names = new Map(tasks.map((t) => [String(t.id), t.name]));
  tbody.replaceChildren(...tasks.map((t) => {
    const waits = (t.waiting_on || []).map((id) => shown(names.get(String(id)) ?? id));
    return el("tr", { dataset: { task: String(t.id) } },
      el("td", { class: "name" },
        el("a", { href: `#/task/${encodeURIComponent(t.id)}` }, shown(t.name ?? t.id))),
      el("td", null, wfStateChip(t.state)),
      el("td", null, waits.length ? waits.join(", ") : wfMuted("—")),
      el("td", { class: "reason" }, t.cancel_reason ? shown(t.cancel_reason) : wfMuted("—")));
  }));
}

async function cancelWorkflow(ctx, kind) {
  const s = ctx.state;
  const question = `Cancel ${kind} ${shown(s.id)}? Its queued and blocked tasks never run; ` +
    "running ones are stopped.";
  if (!(await confirmDialog(question, `Cancel ${kind}`, "Keep"))) return;
  try {
    const r = await api("POST", `${wfRoute(kind)}/${encodeURIComponent(s.id)}/cancel`);
    showMsg(s.msg, `${kind} cancelled: ${r.cancelled} task(s) cancelled, ` +
      `${r.requested} running task(s) asked to stop`, "notice");
  } catch (e) {
    showMsg(s.msg, e.message, "error");
  }
  s.fetched = 0;
  refreshNow();
}
