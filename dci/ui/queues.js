"use strict";
/* Disbatch operator console — the Queues and Nodes pages (helpers in app.js). */

const SORTS = [["default", "default"], ["fifo", "fifo"], ["lifo", "lifo"], ["priority", "priority"]];
const QUEUE_NAME = /^[\p{Alphabetic}\p{N}_-]+$/u;   // Disbatch's ^[\w-]+$ (Unicode \w)

/*
 * The count columns: class, the status a click lists, and the count from `by_status` (every
 * status group apart) or the queue row. Disbatch's own `queued` field counts every status ≤ -2,
 * cancelled and orphaned too; here "queued" is -2 alone. Running is claimed (-1) plus running
 * (0). Retrying (of the queued: waiting out a retry's backoff) and discarded (of the failed:
 * given up on) are the retry policy's, as Oban's retryable and discarded. They come right
 * after the name, so a phone shows them before the settings.
 */
const COUNT_COLUMNS = [
  ["queued", -2, (b) => b.queued],
  ["retrying", "retrying", (b, q) => q.retrying],
  ["blocked", -4, (b) => b.blocked],
  ["running", 0, (b) => b.claimed + b.running],
  ["succeeded", 1, (b) => b.succeeded],
  ["failed", "failed", (b) => b.failed],   // every status ≥ 2, as the count counts
  ["discarded", "discarded", (b, q) => q.discarded],
  ["cancelled", -5, (b) => b.cancelled],
  ["orphaned", -6, (b) => b.orphaned],
];

/* ---------- Queues ---------- */

PAGES.queues = {
  title: "Queues",

  enter(main, ctx) {
    const s = (ctx.state = { plugins: null });
    s.msg = msgBox("queues-msg");
    s.grid = gridTable("queues-table", [
      "name", ...COUNT_COLUMNS.map(([cls]) => [cls, "num"]), "plugin", ["threads", "num"], "sort", "",
    ]);
    main.append(
      el("div", { class: "page-head" }, el("h1", null, "Queues")),
      s.msg,
      s.grid.wrap,
      newQueueForm(ctx),
      settingsCard(ctx),   // queue_settings.js
      limitsCard(ctx),   // limits.js
    );
    takeFlash(s.msg);
  },

  async refresh(ctx) {
    const s = ctx.state;
    const [queues, plugins] = await Promise.all([
      fetchQueues(),
      s.plugins ? Promise.resolve(s.plugins) : api("GET", "plugins"),
    ]);
    if (!ctx.alive()) return;
    s.plugins = Array.isArray(plugins) ? plugins : [];
    fillPluginSelect(s.newPlugin, s.plugins);
    renderQueueRows(ctx, queues);
    fillSettings(ctx, queues);
    await renderLimits(ctx, queues);
    if (!ctx.alive()) return;
    ctx.rendered();
  },
};

function fillPluginSelect(select, plugins) {
  if (select.options.length || isBusy(select.parentNode)) return;
  setOptions(select, plugins.length ? plugins : [["", "(no plugins configured)"]]);
}

function renderQueueRows(ctx, queues) {
  const { tbody } = ctx.state.grid;
  if (!queues.length) {
    tbody.replaceChildren(el("tr", { class: "empty" },
      el("td", { colspan: COUNT_COLUMNS.length + 5 }, "No queues yet — create one below.")));
    return;
  }
  ctx.state.latest = new Map(queues.map((q) => [q.id, q]));
  patchRows(tbody, queues.map((q) => queueRow(ctx, q)), "queue");
}

function queueRow(ctx, q) {
  const s = ctx.state;
  const fail = (text) => showMsg(s.msg, `queue ${q.name}: ${text}`, "error");
  const ok = (text) => showMsg(s.msg, `queue ${shown(q.name)}: ${text}`, "notice");
  const update = async (field, value) => {
    await api("POST", `queues/${encodeURIComponent(q.id)}`, { [field]: value });
    ok(`${field} set to ${value}`);
  };
  const paused = q.paused_threads !== undefined && q.paused_threads !== null;

  const threads = inlineEdit(
    el("input", {
      class: "threads", type: "text", inputmode: "numeric", size: 4,
      value: q.threads === null || q.threads === undefined ? "" : String(q.threads),
      "aria-label": `threads of ${shown(q.name)}`,
    }),
    {
      check: (v) => (isCount(v) ? null : `threads must be a non-negative integer, not "${v}"`),
      save: (v) => update("threads", Number(v)),
      onError: fail,
    },
  );

  const plugins = ctx.state.plugins.slice();
  if (q.plugin && !plugins.includes(q.plugin)) plugins.unshift(q.plugin);
  const plugin = selectEl({ class: "plugin", "aria-label": `plugin of ${shown(q.name)}` },
    plugins.map((p) => [p, shown(p)]), q.plugin);
  const sort = selectEl({ class: "sort", "aria-label": `sort of ${shown(q.name)}` }, SORTS, q.sort || "default");
  for (const [select, field] of [[plugin, "plugin"], [sort, "sort"]]) {
    select.addEventListener("change", async () => {
      if (field === "plugin" && !(await confirmDialog(
        `Change the plugin of queue "${shown(q.name)}" from ${shown(select.dataset.value)} to ` +
        `${shown(select.value)}? Its tasks not yet run will run with ${shown(select.value)}.`,
        "Change plugin"))) {
        select.value = select.dataset.value;
        select.blur();
        return;
      }
      select.disabled = true;
      try {
        await update(field, select.value);
        setValue(select, select.value);
      } catch (e) {
        fail(e.message);
        select.value = select.dataset.value;
      }
      select.disabled = false;
      select.blur();
      refreshNow();
    });
  }

  const link = (status) => `#/tasks?${new URLSearchParams(
    status === undefined ? { queue: q.id } : { queue: q.id, status })}`;
  const by = q.by_status || {};
  const count = (cls, status, of) => {
    const n = of(by, q);
    if (typeof n !== "number" || Number.isNaN(n)) return el("td", { class: `num ${cls}` }, "–");
    return el("td", { class: `num ${cls}` },
      el("a", { href: link(status), class: `count st-${cls}${n ? "" : " zero"}` }, String(n)));
  };

  const actions = el("td", { class: "actions" });
  if (paused) {
    actions.append(el("button", {
      type: "button", class: "resume", title: `restore ${q.paused_threads} threads`,
      onclick: () => queueAction(ctx, q, "resume"),
    }, "Resume"));
  } else {
    actions.append(el("button", {
      type: "button", class: "pause", disabled: !(q.threads > 0),
      title: q.threads > 0 ? "set threads to 0, remembering the current value" : "no threads to pause",
      onclick: () => queueAction(ctx, q, "pause"),
    }, "Pause"));
  }
  const waiting = (by.queued || 0) + (by.blocked || 0);
  actions.append(
    el("button", {
      type: "button", class: "retry-failed", disabled: !(by.failed > 0),
      title: by.failed > 0 ? "requeue the failed tasks (status ≥ 2)" : "no failed tasks",
      onclick: () => bulkAction(ctx, q.id, "retry"),
    }, "Retry failed"),
    el("button", {
      type: "button", class: "cancel-queued", disabled: !(waiting > 0),
      title: waiting > 0 ? "cancel the queued and blocked tasks" : "no queued or blocked tasks",
      onclick: () => bulkAction(ctx, q.id, "cancel"),
    }, "Cancel queued"),
    el("button", {
      type: "button", class: "delete danger", onclick: () => deleteQueue(ctx, q),
    }, "Delete"));

  return el("tr", { dataset: { queue: q.name, id: q.id }, class: paused ? "paused" : null },
    el("td", { class: "name" }, el("a", { href: link(), class: "queue-link" }, shown(q.name)),
      scheduleNote(q, paused || !(q.threads > 0))),
    COUNT_COLUMNS.map(([cls, status, of]) => count(cls, status, of)),
    el("td", { class: "col-plugin" }, plugin),
    el("td", { class: "col-threads num" }, threads,
      paused ? el("span", { class: "paused-note" }, ` paused (was ${q.paused_threads})`) : null),
    el("td", { class: "col-sort" }, sort),
    actions);
}

/**
 * Under a scheduled queue's name: its next tick, in UTC and on its zone's wall clock (the
 * browser's own zone may be neither), or why the leader skips it.
 */
function scheduleNote(q, paused) {   // paused: no threads, so its ticks pass without tasks
  if (!q.scheduled) return null;
  const title = `schedule ${shown(q.schedule || "")}` +
    (q.schedule_tz ? ` in ${shown(q.schedule_tz)}` : " in UTC") +
    (paused ? "; paused: its ticks pass without tasks" : "");
  if (q.schedule_error) {
    return el("div", { class: "schedule-next schedule-bad", title },
      `schedule not run: ${shown(q.schedule_error)}`);
  }
  const next = q.schedule_next;
  if (!next) return el("div", { class: "schedule-next", title }, "scheduled: no tick within a year");
  const utc = String(next.utc).replace("T", " ").replace(/Z$/, " UTC");
  const local = next.zone === "UTC" ? null
    : `${String(next.local).replace("T", " ").replace(/[+-]\d\d:\d\d$/, "")} ${next.zone}`;
  return el("div", { class: "schedule-next", title },
    "next ", el("time", { datetime: next.utc }, utc),
    local ? el("span", { class: "muted" }, ` (${local})`) : null,
    paused ? el("span", { class: "muted" }, " · paused") : null);
}

/**
 * "Retry failed" (POST queues/:id/retry with status "failed": every status ≥ 2) and "Cancel queued" (POST
 * queues/:id/cancel: queued and blocked), each after a confirmation naming the count the
 * page shows now (read at click time: polling may have kept an older button).
 */
async function bulkAction(ctx, id, action) {
  const s = ctx.state;
  const q = (s.latest && s.latest.get(id)) || { id, name: id, by_status: {} };
  const by = q.by_status || {};
  const name = shown(q.name);
  const [question, yes, body] = action === "retry"
    ? [`Retry the ${by.failed} failed task(s) of queue "${name}"? They are queued again.`,
      "Retry failed", { status: "failed" }]
    : [`Cancel the ${(by.queued || 0) + (by.blocked || 0)} queued and blocked task(s) of queue ` +
      `"${name}"? Running tasks are left alone.`, "Cancel queued", undefined];
  if (!(await confirmDialog(question, yes))) return;
  try {
    const r = await api("POST", `queues/${encodeURIComponent(id)}/${action}`, body);
    const n = r && r["MongoDB::UpdateResult"] ? r["MongoDB::UpdateResult"].modified_count : "?";
    showMsg(s.msg, `queue ${name}: ${n} task(s) ${action === "retry" ? "queued again" : "cancelled"}`,
      "notice");
  } catch (e) {
    showMsg(s.msg, `queue ${name}: ${e.message}`, "error");
  }
  refreshNow();
}

async function queueAction(ctx, q, action) {
  const s = ctx.state;
  try {
    await api("POST", `queues/${encodeURIComponent(q.id)}/${action}`);
    showMsg(s.msg, `queue ${shown(q.name)} ${action === "pause" ? "paused" : "resumed"}`, "notice");
  } catch (e) {
    showMsg(s.msg, `queue ${shown(q.name)}: ${e.message}`, "error");
  }
  refreshNow();
}

async function deleteQueue(ctx, q) {
  const s = ctx.state;
  const yes = await confirmDialog(`Delete queue "${shown(q.name)}"? Its tasks are kept.`, "Delete queue");
  if (!yes) return;
  try {
    await api("DELETE", `queues/${encodeURIComponent(q.id)}`);
    showMsg(s.msg, `queue ${shown(q.name)} deleted`, "notice");
  } catch (e) {
    showMsg(s.msg, `queue ${shown(q.name)}: ${e.message}`, "error");
  }
  refreshNow();
}

function newQueueForm(ctx) {
  const s = ctx.state;
  const msg = msgBox("new-queue-msg");
  const name = el("input", { id: "new-queue-name", type: "text", required: true, autocomplete: "off",
    placeholder: "name" });
  s.newPlugin = el("select", { id: "new-queue-plugin" });
  const threads = el("input", { id: "new-queue-threads", type: "text", inputmode: "numeric", size: 4,
    placeholder: "0" });
  const sort = selectEl({ id: "new-queue-sort" }, SORTS, "default");
  const submit = el("button", { id: "new-queue-submit", type: "submit", class: "primary" }, "Create queue");
  const field = (label, input) => el("label", { class: "field" }, el("span", null, label), input);

  const form = el("form", { id: "new-queue", class: "card form-row", novalidate: true },
    el("h2", null, "New queue"),
    field("Name", name), field("Plugin", s.newPlugin), field("Threads", threads), field("Sort", sort),
    el("div", { class: "field submit" }, submit),
    msg);

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { name: name.value.trim(), plugin: s.newPlugin.value, sort: sort.value };
    const t = threads.value.trim();
    const errors = [];
    if (!body.name) errors.push("name is required");
    else if (!QUEUE_NAME.test(body.name)) {
      errors.push("name may contain only letters, digits, _ and - (^[\\w-]+$)");
    }
    if (!body.plugin) errors.push("plugin is required");
    if (t !== "" && !isCount(t)) errors.push(`threads must be a non-negative integer, not "${t}"`);
    if (errors.length) {
      showMsg(msg, errors, "error");
      return;
    }
    if (t !== "") body.threads = Number(t);
    submit.disabled = true;
    try {
      await api("POST", "queues", body);
      showMsg(msg, `queue ${body.name} created`, "notice");
      name.value = "";
      threads.value = "";
    } catch (err) {
      showMsg(msg, err.message, "error");
    }
    submit.disabled = false;
    refreshNow();
  });
  return form;
}

/* ---------- Nodes ---------- */

PAGES.nodes = {
  title: "Nodes",

  enter(main, ctx) {
    const s = (ctx.state = {});
    s.msg = msgBox("nodes-msg");
    s.grid = gridTable("nodes-table", [
      "node", "state", "last seen", ["clock", "num"], ["running", "num"], ["maxthreads", "num"], "",
    ]);
    main.append(
      el("div", { class: "page-head" }, el("h1", null, "Nodes"),
        el("p", { class: "hint" }, "maxthreads: blank = unlimited; Enter or leaving the field saves.")),
      s.msg,
      s.grid.wrap,
    );
  },

  async refresh(ctx) {
    const nodes = await api("GET", "nodes");
    if (!ctx.alive()) return;
    const s = ctx.state;
    const list = Array.isArray(nodes) ? nodes : [];
    if (list.length) patchRows(s.grid.tbody, list.map((n) => nodeRow(ctx, n)), "node");
    else {
      s.grid.tbody.replaceChildren(el("tr", { class: "empty" },
        el("td", { colspan: 7 }, "No nodes have registered.")));
    }
    ctx.rendered();
  },
};

function nodeRow(ctx, n) {
  const s = ctx.state;
  const name = n.node || n.id || oidOf(n._id);
  const ident = n.id || oidOf(n._id) || name;
  const fail = (text) => showMsg(s.msg, `node ${shown(name)}: ${text}`, "error");
  const max = inlineEdit(
    el("input", {
      class: "maxthreads", type: "text", inputmode: "numeric", size: 5, placeholder: "unlimited",
      value: n.maxthreads === null || n.maxthreads === undefined ? "" : String(n.maxthreads),
      "aria-label": `maxthreads of ${shown(name)}`,
    }),
    {
      check: (v) => (v === "" || isCount(v) ? null
        : `maxthreads must be a non-negative integer or blank (unlimited), not "${v}"`),
      save: async (v) => {
        const value = v === "" ? null : Number(v);
        await api("POST", `nodes/${encodeURIComponent(ident)}`, { maxthreads: value });
        showMsg(s.msg, `node ${shown(name)}: maxthreads set to ${value === null ? "unlimited" : value}`, "notice");
      },
      onError: fail,
    },
  );
  const seen = typeof n.timestamp === "number" ? new Date(n.timestamp) : null;
  return el("tr", { dataset: { node: name } },
    el("td", { class: "name" }, shown(name)),
    el("td", { class: "state" }, el("span", { class: `badge ${n.live ? "live" : "stale"}` },
      n.live ? "live" : "stale")),
    el("td", { class: "last-seen" }, seen
      ? [el("time", { datetime: seen.toISOString() }, fmtLocal(seen)), " ",
        el("span", { class: "muted" }, `(${fmtAgo(Date.now() - seen.getTime())})`)]
      : el("span", { class: "muted" }, "never")),
    clockCell(n.clock_offset_ms),
    el("td", { class: "num col-running" }, String(n.running ?? 0)),
    el("td", { class: "num col-maxthreads" }, max),
    el("td", { class: "actions" }, n.live ? null : el("button", {
      type: "button", class: "forget danger", title: "delete this stale node's document",
      onclick: () => forgetNode(ctx, ident, name),
    }, "Forget")));
}

/**
 * Beyond this offset (ms) a node's clock is marked: its DEN warns, and it does not lead the
 * fleet's maintenance while a node with a sane clock is live.
 */
const CLOCK_BOUND_MS = 2000;

/**
 * A node's clock offset as its DEN last measured it (its host clock minus the database
 * server's, ms): signed seconds with one decimal, marked when over the bound. Blank for a node
 * that reports none (a Perl Disbatch 4 node).
 */
function clockCell(ms) {
  if (typeof ms !== "number" || !Number.isFinite(ms)) return el("td", { class: "num col-clock" });
  const secs = (Math.abs(ms) / 1000).toFixed(1);
  const off = Math.abs(ms) > CLOCK_BOUND_MS;
  let title = `this host's clock is ${secs} s ${ms < 0 ? "behind" : "ahead of"} the database's`;
  if (off) {
    title += `: more than ${CLOCK_BOUND_MS / 1000} s off, so this node does not lead the ` +
      "fleet's maintenance while a node with a sane clock is live";
  }
  return el("td", { class: `num col-clock${off ? " clock-off" : ""}`, title },
    `${ms < 0 ? "-" : "+"}${secs}s`);
}

/** DELETE nodes/:id after a confirmation; the server refuses a live node or one with tasks. */
async function forgetNode(ctx, ident, name) {
  const s = ctx.state;
  const question = `Forget node "${shown(name)}"? Its document is deleted; ` +
    "a node that heartbeats again is listed again.";
  if (!(await confirmDialog(question, "Forget node"))) return;
  try {
    await api("DELETE", `nodes/${encodeURIComponent(ident)}`);
    showMsg(s.msg, `node ${shown(name)} forgotten`, "notice");
  } catch (e) {
    showMsg(s.msg, `node ${shown(name)}: ${e.message}`, "error");
  }
  refreshNow();
}
