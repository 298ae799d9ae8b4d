"use strict";
/* Disbatch operator console — the Tasks search page and the single Task page. */

const PAGE_SIZE = 50;
const CHUNK = 65536;
const STATUS_CHOICES = [
  ["", "any"], ["-2", "queued (-2)"], ["retrying", "retrying"], ["-1", "claimed (-1)"], ["0", "running (0)"],
  ["1", "succeeded (1)"], ["failed", "failed (≥ 2)"], ["discarded", "discarded"], ["2", "status 2"], ["-6", "orphaned (-6)"], ["-5", "cancelled (-5)"],
  ["-4", "blocked (-4)"], ["-3", "terminated (-3)"],
];

/** Queue id → name, from a GET queues answer. */
const queueNames = (queues) => new Map(queues.map((q) => [q.id, q.name]));

/* ---------- Tasks (search) ---------- */

PAGES.tasks = {
  title: "Tasks",

  enter(main, ctx) {
    const p = ctx.params;
    const s = (ctx.state = {
      filter: { queue: p.queue || "", status: p.status || "", node: p.node || "" },
      page: Math.max(1, parseInt(p.page, 10) || 1),
    });
    s.msg = msgBox("tasks-msg");
    s.count = el("span", { id: "task-count", class: "count-total" });
    s.pager = el("div", { class: "pager" });
    s.grid = gridTable("tasks-table", [
      "id", "queue", "status", "node", "ctime", "mtime", "params", "",
    ]);
    main.append(
      el("div", { class: "page-head" }, el("h1", null, "Tasks")),
      taskSearchForm(ctx),
      s.msg,
      el("div", { class: "result-head" }, s.count, s.pager),
      s.grid.wrap,
    );
    takeFlash(s.msg);
  },

  async refresh(ctx) {
    const s = ctx.state;
    const queues = await fetchQueues();
    if (!ctx.alive()) return;
    s.names = queueNames(queues);
    fillQueueSelect(s, queues);
    const problem = searchProblem(s.filter);
    if (problem) {
      s.count.textContent = "";
      s.pager.replaceChildren();
      s.grid.tbody.replaceChildren();
      if (!s.filterShown) showMsg(s.msg, problem.text, problem.kind);
      s.filterShown = true;
      ctx.rendered();
      return;
    }
    if (newestMode(s.filter)) {
      await renderNewest(ctx);
      return;
    }
    const q = taskQuery(s.filter);
    const list = new URLSearchParams(q);
    list.set(".limit", PAGE_SIZE);
    list.set(".skip", (s.page - 1) * PAGE_SIZE);
    list.set(".terse", 1);
    q.set(".count", 1);
    const [tasks, count] = await Promise.all([api("GET", `tasks?${list}`), api("GET", `tasks?${q}`)]);
    if (!ctx.alive()) return;
    const total = count && typeof count.count === "number" ? count.count : 0;
    s.count.textContent = `${total} task${total === 1 ? "" : "s"}`;
    renderPager(ctx, total);
    renderTaskRows(ctx, taskList(tasks));
    ctx.rendered();
  },
};

/** Why a filter cannot be searched (only indexed combinations are allowed), or null. */
function searchProblem(f) {
  // The failures index serves these two words alone.
  if (!f.queue && !f.node && (f.status === "failed" || f.status === "discarded")) return null;
  if (newestMode(f)) return null;
  if (!f.queue && !f.node) {
    return { kind: "error", text: "Status alone is not indexed: choose a queue or a node as well." };
  }
  if (f.queue && f.node && f.status === "") {
    return { kind: "error", text: "Searching by queue and node needs a status too (index node+status+queue)." };
  }
  return null;
}

/** No filter at all: the newest tasks of every queue, read newest first through the _id index. */
function newestMode(f) {
  return !f.queue && !f.node && f.status === "";
}

/*
 * The first page of the newest tasks (`.newest`: the _id index backwards, so a long history
 * costs nothing); no total, which would count every task ever kept.
 */
async function renderNewest(ctx) {
  const s = ctx.state;
  const list = new URLSearchParams({ ".newest": 1, ".limit": PAGE_SIZE, ".terse": 1 });
  const tasks = taskList(await api("GET", `tasks?${list}`));
  if (!ctx.alive()) return;
  s.count.textContent = `the newest ${tasks.length} task${tasks.length === 1 ? "" : "s"} of every queue`;
  s.pager.replaceChildren();
  // Once: a later refresh must not replace what an action said.
  if (!s.hinted && s.msg.hidden) showMsg(s.msg, "Pick a queue, a node or a status to search further.", "hint");
  s.hinted = true;
  renderTaskRows(ctx, tasks);
  ctx.rendered();
}

/** A task's params on one line, cut to `max` characters (the task page shows them whole). */
function paramsCell(params) {
  if (params === undefined || params === null) return el("td", { class: "params muted" }, "—");
  const text = JSON.stringify(params);
  const max = 80;
  const cut = text.length > max ? `${text.slice(0, max - 1)}…` : text;
  return el("td", { class: "params mono", title: text.length > 2000 ? `${text.slice(0, 2000)}…` : text },
    shown(cut));
}

function taskQuery(f) {
  const q = new URLSearchParams();
  if (f.queue) q.set("queue", f.queue);
  if (f.status !== "") q.set("status", f.status);
  if (f.node) q.set("node", f.node);
  return q;
}

function taskSearchForm(ctx) {
  const s = ctx.state;
  const f = s.filter;
  s.queueSelect = el("select", { id: "search-queue" }, el("option", { value: "" }, "any"));
  const status = selectEl({ id: "search-status" }, STATUS_CHOICES, f.status);
  if (status.value !== f.status) {            // a status code not in the list (e.g. 3)
    status.append(el("option", { value: f.status }, `status ${f.status}`));
    status.value = f.status;
  }
  const node = el("input", { id: "search-node", type: "text", value: f.node, placeholder: "any",
    autocomplete: "off" });
  const field = (label, input) => el("label", { class: "field" }, el("span", null, label), input);
  const form = el("form", { id: "task-search", class: "card form-row", novalidate: true },
    field("Queue", s.queueSelect), field("Status", status), field("Node", node),
    el("div", { class: "field submit" },
      el("button", { id: "search-submit", type: "submit", class: "primary" }, "Search")));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const next = { queue: s.queueSelect.value, status: status.value, node: node.value.trim() };
    const problem = searchProblem(next);
    if (problem && problem.kind === "error") {
      showMsg(s.msg, problem.text, "error");
      return;
    }
    const target = hashFor("tasks", next);
    if (location.hash === target) refreshNow();
    else location.hash = target;
  });
  return form;
}

/** Queue options (value = queue id); a hash naming a queue by name is mapped to its id. */
function fillQueueSelect(s, queues) {
  const select = s.queueSelect;
  if (isBusy(select.parentNode)) return;
  const want = select.options.length > 1 ? select.value : s.filter.queue;
  const byName = queues.find((q) => q.name === want);
  const chosen = byName ? byName.id : want;
  if (byName && s.filter.queue === want) s.filter.queue = byName.id;
  const opts = [["", "any"], ...queues.map((q) => [q.id, shown(q.name)])];
  if (chosen && !queues.some((q) => q.id === chosen)) opts.push([chosen, `${chosen} (unknown)`]);
  const sig = JSON.stringify(opts);
  if (sig !== s.queueSig) {
    setOptions(select, opts, chosen);
    s.queueSig = sig;
  }
}

function renderPager(ctx, total) {
  const s = ctx.state;
  const pages = Math.max(1, Math.ceil(total / PAGE_SIZE));
  if (!changed(s, "pager", pages)) return;
  const go = (page) => { location.hash = hashFor("tasks", { ...s.filter, page: page > 1 ? page : "" }); };
  s.pager.replaceChildren(
    el("button", { type: "button", id: "tasks-prev", class: "prev", disabled: s.page <= 1,
      onclick: () => go(s.page - 1) }, "‹ Prev"),
    el("span", { id: "tasks-page", class: "page-of" }, `page ${s.page} of ${pages}`),
    el("button", { type: "button", id: "tasks-next", class: "next", disabled: s.page >= pages,
      onclick: () => go(s.page + 1) }, "Next ›"));
}

function renderTaskRows(ctx, tasks) {
  const { tbody } = ctx.state.grid;
  if (!tasks.length) {
    tbody.replaceChildren(el("tr", { class: "empty" }, el("td", { colspan: 8 }, "No matching tasks.")));
    return;
  }
  patchRows(tbody, tasks.map((t) => taskRow(ctx, t)), "task");
}

function taskRow(ctx, t) {
  const s = ctx.state;
  const id = oidOf(t._id);
  const queue = oidOf(t.queue);
  const act = (action) => async () => {
    try {
      await api("POST", `tasks/${encodeURIComponent(id)}/${action}`);
      showMsg(s.msg, `task ${id} ${action === "cancel" ? "cancelled" : "queued for retry"}`, "notice");
    } catch (e) {
      showMsg(s.msg, `task ${id}: ${e.message}`, "error");
    }
    refreshNow();
  };
  return el("tr", { dataset: { task: id } },
    el("td", { class: "id mono" }, el("a", { href: `#/task/${encodeURIComponent(id)}` }, id)),
    el("td", { class: "queue" }, shown(s.names.get(queue) || queue || "—")),
    el("td", null, statusEl(t.status)),
    el("td", { class: "node" }, t.node ? shown(t.node) : el("span", { class: "muted" }, "—")),
    el("td", { class: "ctime" }, timeEl(t.ctime)),
    el("td", { class: "mtime" }, timeEl(t.mtime)),
    paramsCell(t.params),
    el("td", { class: "actions" },
      canCancel(t.status) ? el("button", { type: "button", class: "cancel", onclick: act("cancel") }, "Cancel") : null,
      canRetry(t.status) ? el("button", { type: "button", class: "retry", onclick: act("retry") }, "Retry") : null));
}

/* ---------- Task (one) ---------- */

PAGES.task = {
  title: "Task",

  enter(main, ctx) {
    const id = ctx.arg || "";
    const s = (ctx.state = { id, lastKey: null, lastStatus: undefined });
    s.msg = msgBox("task-msg");
    const dd = (key) => (s[key] = el("dd", { id: `task-${key}` }));
    s.actions = el("div", { class: "task-actions" });
    s.info = el("dl", { class: "card kv" },
      el("dt", null, "id"), el("dd", { id: "task-id", class: "mono" }, id),
      el("dt", null, "queue"), dd("queue"),
      el("dt", null, "status"), dd("status-cell"),
      s.heldDt = el("dt", { hidden: true }, "held"), dd("held"),
      el("dt", null, "node"), dd("node"),
      el("dt", null, "ctime"), dd("ctime"),
      el("dt", null, "mtime"), dd("mtime"),
      s.attemptsDt = el("dt", { hidden: true }, "attempts"), dd("attempts"),
      el("dt", null, "params"), el("dd", null, s.params = el("pre", { id: "task-params", class: "json" })));
    s.attempts.hidden = true;
    s.held.hidden = true;
    s.panels = ["stdout", "stderr"].map((stream) => outputPanel(ctx, stream));
    s.result = resultPanel(ctx);      // attempts.js
    s.history = attemptsPanel(ctx, s.result.show);
    main.append(
      el("div", { class: "page-head" }, el("h1", null, "Task ", el("span", { class: "mono" }, id)),
        el("a", { href: "#/tasks", id: "task-back", class: "back" }, "← tasks")),
      s.msg, s.actions, s.info, s.result.root, s.history.root, ...s.panels.map((p) => p.root));
  },

  async refresh(ctx) {
    const s = ctx.state;
    const [queues, found] = await Promise.all([
      fetchQueues(),
      api("GET", `tasks?${new URLSearchParams({ id: s.id, ".terse": 1 })}`),
    ]);
    if (!ctx.alive()) return;
    const task = taskList(found)[0];
    if (!task) throw new Error(`no task with id ${s.id}`);
    renderTask(ctx, task, queueNames(queues));
    await renderHeld(ctx, task, queues);   // limits.js
    if (!ctx.alive()) return;
    const key = `${task.status}|${task.mtime}|${JSON.stringify(task.stdout)}|${JSON.stringify(task.stderr)}`;
    const changed = key !== s.lastKey;
    s.lastKey = key;
    await Promise.all([...s.panels.map((p) => p.refresh(task, changed)), s.history.refresh(task, changed)]);
    ctx.rendered();
  },
};

function renderTask(ctx, t, names) {
  const s = ctx.state;
  const queue = oidOf(t.queue);
  const name = names.get(queue);
  setContent(s.queue, queue
    ? el("a", { href: hashFor("tasks", { queue }) }, name ? shown(name) : `${queue} (deleted queue)`)
    : "—");
  setContent(s["status-cell"], statusEl(t.status, "task-status"));
  s.node.textContent = t.node ? shown(t.node) : "—";
  setContent(s.ctime, timeEl(t.ctime));
  setContent(s.mtime, timeEl(t.mtime));
  const hasAttempts = t.attempts !== undefined && t.attempts !== null;
  s.attempts.hidden = s.attemptsDt.hidden = !hasAttempts;
  s.attempts.textContent = hasAttempts ? String(t.attempts) : "";
  const params = shownJson(JSON.stringify(t.params ?? null, null, 2));
  if (s.params.textContent !== params) s.params.textContent = params;
  if (s.lastStatus !== t.status) {
    s.lastStatus = t.status;
    renderTaskActions(ctx, t);
  }
}

function renderTaskActions(ctx, t) {
  const s = ctx.state;
  const path = `tasks/${encodeURIComponent(s.id)}`;
  const post = (action, done) => async () => {
    try {
      await api("POST", `${path}/${action}`);
      showMsg(s.msg, done, "notice");
    } catch (e) {
      showMsg(s.msg, e.message, "error");
    }
    s.lastStatus = undefined;
    refreshNow();
  };
  const remove = async () => {
    if (!(await confirmDialog(`Delete task ${s.id} and its output?`, "Delete task"))) return;
    try {
      await api("DELETE", path);
      setFlash(`task ${s.id} deleted`);
      location.hash = hashFor("tasks", { queue: oidOf(t.queue) });
    } catch (e) {
      showMsg(s.msg, e.message, "error");
    }
  };
  const running = t.status === -1 || t.status === 0;
  const cancel = async () => {
    const question = running
      ? `Cancel running task ${s.id}? Its plugin is stopped (SIGTERM, then SIGKILL) and the task recorded as cancelled.`
      : `Cancel task ${s.id}? It will not run.`;
    if (!(await confirmDialog(question, "Cancel task", running ? "Keep running" : "Keep it"))) return;
    await post("cancel", running ? "cancel requested: the node stops the plugin" : "task cancelled")();
  };
  s.actions.replaceChildren(...[
    canCancel(t.status) || running ? el("button", { type: "button", id: "task-cancel", class: "cancel",
      onclick: cancel }, "Cancel") : null,
    canRetry(t.status) ? el("button", { type: "button", id: "task-retry", class: "retry",
      onclick: post("retry", "task queued for retry") }, "Retry") : null,
    canDelete(t.status) ? el("button", { type: "button", id: "task-delete", class: "delete danger",
      onclick: remove }, "Delete") : null,
  ].filter(Boolean));
}

/** Where a task's output lives, from the task document (terse). */
function storageText(v) {
  if (v === null || v === undefined) return "no output stored";
  if (typeof v === "object" && v.$oid) return `stored in GridFS (file ${v.$oid})`;
  if (v === "") return "inline (empty)";
  return "inline in the task document";
}

/** A stdout/stderr panel that shows CHUNK bytes at a time, with paging. */
function outputPanel(ctx, stream) {
  const p = { offset: 0, bytes: 0, total: null, loaded: false };
  const pre = el("pre", { id: `task-${stream}`, class: "output" });
  const storage = el("span", { class: "storage muted" });
  const range = el("span", { class: "range" });
  const btn = (cls, label, title, go) => el("button", { type: "button", class: cls, title,
    onclick: () => load(go()).catch((e) => showMsg(ctx.state.msg, `${stream}: ${e.message}`, "error")) }, label);
  const first = btn("first", "⇤ Start", "first bytes", () => 0);
  const older = btn("older", "‹ Older", "previous 64 KiB", () => Math.max(0, p.offset - CHUNK));
  const newer = btn("newer", "Newer ›", "next 64 KiB", () => p.offset + p.bytes);
  const last = btn("last", "End ⇥", "last 64 KiB", () => Math.max(0, (p.total || 0) - CHUNK));
  const raw = el("a", { class: "raw", href: `tasks/${encodeURIComponent(ctx.state.id)}/${stream}`,
    target: "_blank", rel: "noopener" }, "raw");

  async function load(offset) {
    const url = `tasks/${encodeURIComponent(ctx.state.id)}/${stream}?offset=${offset}&length=${CHUNK}`;
    let r = await apiText(url);
    if (!ctx.alive()) return;
    if (r.total !== null && offset > 0 && offset >= r.total) {   // the output shrank (retry)
      offset = Math.max(0, r.total - CHUNK);
      r = await apiText(`tasks/${encodeURIComponent(ctx.state.id)}/${stream}?offset=${offset}&length=${CHUNK}`);
      if (!ctx.alive()) return;
    }
    Object.assign(p, { offset, bytes: r.bytes, total: r.total ?? offset + r.bytes, loaded: true });
    if (pre.textContent !== r.text) pre.textContent = r.text;
    pre.classList.toggle("empty", !r.text);
    range.textContent = p.total === 0 ? "empty"
      : `showing bytes ${p.offset}–${p.offset + p.bytes} of ${p.total} (${fmtBytes(p.total)})`;
    first.disabled = older.disabled = p.offset <= 0;
    newer.disabled = last.disabled = p.offset + p.bytes >= p.total;
  }

  /** Reload when the task changed, or while it runs and the view is at the end. */
  async function refresh(task, changed) {
    storage.textContent = storageText(task[stream]);
    if (liveOutput(ctx, stream, task, { pre, range, storage, pager: first.parentNode })) return; // live_output.js
    const atEnd = p.offset + p.bytes >= (p.total || 0);
    const live = task.status === 0 || task.status === -1;
    if (!p.loaded || changed || (live && atEnd)) await load(p.offset);
  }

  const root = el("section", { class: "card output-panel", dataset: { stream } },
    el("div", { class: "output-head" }, el("h2", null, stream), storage, range,
      el("span", { class: "pager" }, first, older, newer, last, raw)),
    pre);
  return { root, refresh };
}
