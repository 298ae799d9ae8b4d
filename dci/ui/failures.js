"use strict";
/* Disbatch operator console — the Failures page: the fleet's newest failed and discarded tasks. */

const FAILURES_SHOWN = 50;

PAGES.failures = {
  title: "Failures",

  enter(main, ctx) {
    const s = (ctx.state = {});
    s.msg = msgBox("failures-msg");
    s.grid = gridTable("failures-table", [
      "id", "queue", ["status", "num"], "discarded", ["attempts", "num"], "ended", "reason", "",
    ]);
    main.append(
      el("div", { class: "page-head" }, el("h1", null, "Failures"),
        el("p", { class: "muted" },
          `The newest ${FAILURES_SHOWN} failed tasks (status ≥ 2) of every queue, discarded ones among them, newest first.`)),
      s.msg,
      s.grid.wrap,
    );
    takeFlash(s.msg);
  },

  async refresh(ctx) {
    const s = ctx.state;
    const data = await api("GET", `failures?limit=${FAILURES_SHOWN}`);
    if (!ctx.alive()) return;
    const rows = data && Array.isArray(data.failures) ? data.failures : [];
    if (!rows.length) {
      s.grid.tbody.replaceChildren(
        el("tr", { class: "empty" }, el("td", { colspan: 8 }, "No failed tasks.")));
    } else {
      patchRows(s.grid.tbody, rows.map((f) => failureRow(ctx, f)), "task");
    }
    ctx.rendered();
  },
};

function failureRow(ctx, f) {
  const s = ctx.state;
  const act = (action, done) => async () => {
    try {
      await api("POST", `tasks/${encodeURIComponent(f.id)}/${action}`);
      showMsg(s.msg, `task ${f.id} ${done}`, "notice");
    } catch (e) {
      showMsg(s.msg, `task ${f.id}: ${e.message}`, "error");
    }
    refreshNow();
  };
  const muted = (text) => el("span", { class: "muted" }, text);
  return el("tr", { dataset: { task: f.id } },
    el("td", { class: "id mono" }, el("a", { href: `#/task/${encodeURIComponent(f.id)}` }, f.id)),
    el("td", { class: "queue" }, shown(f.queue || f.queue_id || "—")),
    el("td", { class: "num" }, statusEl(f.status)),
    el("td", { class: "discarded" }, f.discarded ? "discarded" : muted("—")),
    el("td", { class: "num attempts" }, f.attempts == null ? muted("—") : String(f.attempts)),
    el("td", { class: "ended" }, timeEl(f.last_attempt_end || f.mtime)),
    el("td", { class: "reason" }, f.reason ? shown(f.reason) : muted("—")),
    el("td", { class: "actions" },
      el("button", { type: "button", class: "retry", onclick: act("retry", "queued for retry") }, "Retry"),
      f.discarded ? null : el("button", {
        type: "button", class: "discard", title: "give up on it: listed and counted as discarded",
        onclick: act("discard", "discarded"),
      }, "Discard")));
}
