"use strict";
/*
 * Disbatch operator console — a task's attempt history (GET tasks/:id/attempts), shown on the
 * task page: one row per run, oldest first, with the node, how it ended and, for an attempt
 * that recovery took (lease passed, runner died, node silent), why; and the result panel: the
 * output the newest attempt wrote in its result file.
 */

const ATTEMPTS_CAP = 1000;   // the server answers at most the newest 1000

/** Outcome → status colour class, as the task statuses are coloured. */
const OUTCOME_CLASS = {
  running: "st-running",
  claimed: "st-claimed",
  succeeded: "st-succeeded",
  failed: "st-failed",
  timed_out: "st-failed",
  retry: "st-queued",
  cancelled: "st-cancelled",
  lost: "st-orphaned",
  discarded: "st-unknown",
};

/** How long an attempt took, from the API's UTC date texts; "" when unknown. */
function attemptTook(a) {
  const start = parseTaskTime(a.start);
  const end = parseTaskTime(a.end);
  if (!start || !end) return "";
  const s = Math.max(0, Math.round((end - start) / 1000));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function attemptRow(a, n) {
  const id = oidOf(a._id) || String(n);
  const text = (v) => (v === null || v === undefined ? el("span", { class: "muted" }, "—") : shown(v));
  const outcome = a.outcome === null || a.outcome === undefined ? "—" : String(a.outcome);
  return el("tr", { dataset: { attempt: id } },
    el("td", { class: "num" }, String(n)),
    el("td", { class: "start" }, timeEl(a.start)),
    el("td", { class: "end" }, a.end ? timeEl(a.end) : el("span", { class: "muted" }, "—")),
    el("td", { class: "num took" }, attemptTook(a)),
    el("td", { class: "node" }, text(a.node)),
    el("td", { class: "num pid" }, text(a.pid)),
    el("td", { class: "outcome" }, el("span", {
      class: `status ${OUTCOME_CLASS[outcome] || "st-unknown"}`, dataset: { outcome },
    }, shown(outcome))),
    el("td", { class: "num exit" }, text(a.exit_code)),
    el("td", { class: "num signal" }, text(a.signal)),
    el("td", { class: "reason" }, text(a.reason)));
}

/** The attempts section of the task page: { root, refresh(task, changed) }; `onList` gets
 * each list read. */
function attemptsPanel(ctx, onList) {
  const grid = gridTable("task-attempts", [
    ["#", "num"], "started", "ended", ["took", "num"], "node", ["pid", "num"], "outcome",
    ["exit", "num"], ["signal", "num"], "reason",
  ]);
  const note = el("span", { id: "task-attempts-note", class: "muted" });
  const root = el("section", { class: "card attempts-panel" },
    el("div", { class: "output-head" }, el("h2", null, "attempts"), note),
    grid.wrap);
  let loaded = false;
  let open = false;   // a record still says "running"
  let settle = 0;     // polls to read again after a change: a record may land just after it

  /** Reloads once, when the task changed (an attempt starts or ends with it) and for a few
   * polls after, and while a record is open. */
  async function refresh(task, changed) {
    if (changed) settle = 3;
    else if (settle > 0) settle -= 1;
    if (loaded && !changed && !open && settle === 0) return;
    const list = await api("GET", `tasks/${encodeURIComponent(ctx.state.id)}/attempts`);
    if (!ctx.alive()) return;
    loaded = true;
    onList(list);
    const rows = Array.isArray(list) ? list.slice() : [];
    open = rows.some((a) => !a.end || a.outcome === "running");
    // A run's record is written when it ends: the one under way is shown from the task.
    if (!open && (task.status === 0 || task.status === -1)) {
      rows.push({ _id: "current", node: task.node, start: task.mtime, end: null,
        outcome: task.status === 0 ? "running" : "claimed" });
    }
    note.textContent = Array.isArray(list) && list.length >= ATTEMPTS_CAP
      ? `the newest ${ATTEMPTS_CAP} (older ones are not shown)`
      : `${rows.length} attempt${rows.length === 1 ? "" : "s"}`;
    if (!rows.length) {
      grid.tbody.replaceChildren(el("tr", { class: "empty" },
        el("td", { colspan: 10 }, "Not run yet.")));
      return;
    }
    patchRows(grid.tbody, rows.map((a, i) => attemptRow(a, i + 1)), "attempt");
  }

  return { root, refresh };
}

/** At most this many characters of a result's output are drawn; the link has it all. */
const RESULT_SHOWN = 256 * 1024;

/** The result section of the task page: { root, show(list) }, shown from the attempts the
 * attempts panel reads (GET tasks/:id/attempts carries each one's output, bounded): the task
 * document would bring its whole stdout along. */
function resultPanel(ctx) {
  const body = el("div", { id: "task-result" });
  const note = el("span", { id: "task-result-note", class: "muted" });
  const root = el("section", { class: "card result-panel" },
    el("div", { class: "output-head" }, el("h2", null, "result"), note),
    body);
  const has = (v) => v !== null && v !== undefined;

  function show(list) {
    const rows = Array.isArray(list) ? list : [];
    let newest = null;
    for (let i = rows.length - 1; i >= 0 && !newest; i -= 1) {
      if (has(rows[i].output) || has(rows[i].output_omitted)) newest = rows[i];
    }
    const attempt = newest ? oidOf(newest._id) : null;
    // Links are relative, as the console's own requests are: it may be served under a prefix.
    const wholeUrl = `tasks/${encodeURIComponent(ctx.state.id)}/result?attempt=${encodeURIComponent(String(attempt))}`;
    const whole = () => el("a", { href: wholeUrl, target: "_blank", rel: "noopener" }, "open it whole");
    note.textContent = newest ? `the output of attempt ${attempt}` : "";
    if (!newest) {
      setContent(body, el("p", { class: "muted" },
        "no output: no attempt of this task wrote one in its result file"));
      return;
    }
    const omitted = newest.output_omitted;
    if (has(omitted)) {
      const bytes = Number(omitted.bytes) || 0;
      setContent(body, el("p", null,
        `${bytes} bytes of JSON (${fmtBytes(bytes)}), too large to show here: `, whole()));
      return;
    }
    let text = shownJson(JSON.stringify(newest.output, null, 2));
    const cut = text.length > RESULT_SHOWN;
    if (cut) text = text.slice(0, RESULT_SHOWN);
    setContent(body, el("pre", { class: "json" }, text),
      cut ? el("p", { class: "muted" }, `the first ${RESULT_SHOWN} characters are shown: `, whole())
        : null);
  }

  return { root, show };
}
