"use strict";
/* Disbatch operator console — flow limits: each limited queue's limits and budget on the
 * Queues page, a form to set them, and why a queued task waits on the Task page. */

const LIMIT_FIELDS = ["rate_limit", "concurrency", "unique"];

/** Whether a queue (a row of GET queues) has a limit that holds its claims. */
function limitsClaims(q) {
  return !!(q && (q.rate_limit || q.concurrency));
}

/** The card under the queue table: one block per limited queue, and the form. */
function limitsCard(ctx) {
  const s = ctx.state;
  s.limitsList = el("div", { id: "queue-limits-list" });
  s.limitsMsg = msgBox("queue-limits-msg");
  s.limitsQueue = el("select", { id: "limits-queue", "aria-label": "queue" });
  const inputs = Object.fromEntries(LIMIT_FIELDS.map((f) => [f, el("input", {
    id: `limits-${f.replace("_", "-")}`, type: "text", size: 34, autocomplete: "off", spellcheck: "false",
    placeholder: {
      rate_limit: '{"starts": 50, "per_s": 10, "partition": "params.customer"}',
      concurrency: '{"key": "params.account", "max": 1, "ordered": true}',
      unique: '{"key": "params.id", "states": ["queued", "running"], "for_s": 0}',
    }[f],
  })]));
  const force = el("input", { id: "limits-force", type: "checkbox" });
  const field = (label, input) => el("label", { class: "field" }, el("span", null, label), input);
  const form = el("form", { id: "limits-form", class: "form-row", novalidate: true },
    el("h2", null, "Set flow limits"),
    field("Queue", s.limitsQueue),
    LIMIT_FIELDS.map((f) => field(f, inputs[f])),
    el("label", { class: "field check" }, force, "force (live Perl nodes would claim past it)"),
    el("div", { class: "field submit" }, el("button", { type: "submit", id: "limits-submit" }, "Save limits")),
    s.limitsMsg);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = {};
    const errors = [];
    for (const f of LIMIT_FIELDS) {
      const text = inputs[f].value.trim();
      if (text === "") continue;                      // left as it is
      if (text === "null" || text === "none") { body[f] = null; continue; }
      try {
        body[f] = JSON.parse(text);
      } catch (err) {
        errors.push(`${f} must be a JSON object, or null to remove it`);
      }
    }
    if (!s.limitsQueue.value) errors.push("choose a queue");
    if (!errors.length && !Object.keys(body).length) errors.push("fill in a limit (null removes one)");
    if (errors.length) { showMsg(s.limitsMsg, errors, "error"); return; }
    if (force.checked) body.force = true;
    try {
      await api("POST", `queues/${encodeURIComponent(s.limitsQueue.value)}`, body);
      showMsg(s.limitsMsg, `limits of queue ${shown(s.limitsQueue.selectedOptions[0].textContent)} saved`, "notice");
      for (const f of LIMIT_FIELDS) inputs[f].value = "";
      force.checked = false;
    } catch (err) {
      showMsg(s.limitsMsg, err.message, "error");
    }
    refreshNow();
  });
  return el("section", { id: "queue-limits", class: "card" },
    el("h2", null, "Flow limits"),
    el("p", { class: "hint" }, "Rate limits, per-key concurrency and unique tasks, with the budget now."),
    s.limitsList, form);
}

/** Redraws the limited queues' blocks, each from GET queues/:id (limits, budget, held). */
async function renderLimits(ctx, queues) {
  const s = ctx.state;
  if (!isBusy(s.limitsQueue.parentNode)) {
    setOptions(s.limitsQueue, queues.map((q) => [q.id, shown(q.name)]), s.limitsQueue.value || undefined);
  }
  const limited = queues.filter((q) => LIMIT_FIELDS.some((f) => q[f]));
  const views = await Promise.all(limited.map((q) => (limitsClaims(q)
    ? api("GET", `queues/${encodeURIComponent(q.id)}`).catch(() => q) : Promise.resolve(q))));
  if (!ctx.alive()) return;
  if (!views.length) {
    setContent(s.limitsList, el("p", { class: "muted" }, "No queue has flow limits."));
    return;
  }
  setContent(s.limitsList, ...views.map(limitsBlock));
}

function limitsBlock(q) {
  const flow = q.flow || {};
  const rows = [];
  const row = (name, ...text) => rows.push(el("dt", null, name), el("dd", null, ...text));
  if (q.rate_limit) {
    const r = q.rate_limit;
    row("rate_limit", `${r.starts} starts per ${r.per_s} s`,
      r.partition ? `, per value of ${shown(r.partition)} (at most ${r.max_partitions ?? 10000} live)` : "");
    const b = flow.rate_limit;
    if (b && b.used !== undefined) {
      row("budget", `${b.used} used, ${b.left} left`, b.next_free ? ["; next start frees ", timeEl(b.next_free)] : "");
    } else if (b) {
      const busiest = (b.busiest || []).map((p) => `${shownJson(JSON.stringify(p.partition))}: ${p.used} used`);
      row("budget", `${b.live_partitions} live partition(s), ${b.exhausted_partitions} with no start left`,
        busiest.length ? `; busiest ${busiest.join(", ")}` : "");
    }
  }
  if (q.concurrency) {
    const c = q.concurrency;
    row("concurrency", `at most ${c.max ?? 1} running per value of ${shown(c.key)}${c.ordered ? ", ordered" : ""}`);
    const b = flow.concurrency;
    if (b) {
      const keys = (b.at_max || []).map((k) => shownJson(JSON.stringify(k.key)));
      row("keys", `${b.holding} slot(s) held by ${b.keys} key(s); ${b.keys_at_max} at max`,
        keys.length ? ` (${keys.join(", ")})` : "");
    }
  }
  if (q.unique) {
    const u = q.unique;
    row("unique", `per value of ${shown(u.key)} while ${(u.states || ["queued", "running"]).join(", ")}`,
      u.for_s ? ` or ${u.for_s} s after creation` : "");
  }
  if (flow.held) {
    const h = flow.held;
    row("held", `rate_limit ${h.rate_limit}, partition_limit ${h.partition_limit}, ` +
      `concurrency ${h.concurrency}, ordered ${h.ordered}`,
      el("span", { class: "muted" }, ` (of ${h.scanned} claimable${h.capped ? ", the oldest only" : ""})`));
  }
  if (flow.error) row("problem", el("span", { class: "msg error" }, shown(flow.error)));
  return el("div", { class: "queue-limits", dataset: { queue: q.name } },
    el("h3", null, shown(q.name)), el("dl", { class: "kv" }, rows));
}

/** The Task page's `held` line: only a queued task of a queue whose limits hold claims. */
async function renderHeld(ctx, task, queues) {
  const s = ctx.state;
  const q = queues.find((x) => x.id === oidOf(task.queue));
  let held = null;
  if (task.status === -2 && limitsClaims(q)) {
    const full = await api("GET", `tasks/${encodeURIComponent(s.id)}`).catch(() => null);
    held = full && full.held ? full.held : null;
  }
  if (!ctx.alive()) return;
  s.heldDt.hidden = s.held.hidden = !held;
  if (!held) { s.held.replaceChildren(); return; }
  setContent(s.held, el("span", { class: "badge" }, held.limit), " ", shown(held.reason),
    held.until ? [" — until ", timeEl(held.until)] : "");
}
