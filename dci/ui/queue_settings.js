"use strict";
/* Disbatch operator console — the Queues page's settings card: every run setting of a queue
 * (retry policy, worker, timeouts, schedule, work-spec fields), shown as stored and changed in
 * one request. threads, sort and plugin are edited in the queue's row, flow limits in their
 * card. */

/*
 * Each setting, the role the access page names for it, and what it takes (the server checks
 * it with the reader every node uses; this is only the hint).
 */
const QUEUE_SETTINGS = [
  ["retry", "operate", '{"max_attempts": 20, "backoff": "exponential", "base_s": 15, "max_s": 21600, "jitter": 0.1, "on": ["failed", "crashed", "timeout", "lost"]}'],
  ["timeout", "operate", "seconds; none: no limit"],
  ["kill_grace", "operate", "seconds between SIGTERM and SIGKILL (5)"],
  ["lease", "operate", "seconds (30)"],
  ["on_lost", "operate", '"orphan" or "requeue"'],
  ["max_retries", "operate", "retries a plugin may ask for"],
  ["on_dependency_failure", "operate", '"cancel" or "run"'],
  ["priority", "operate", "work-spec priority"],
  ["weight", "operate", "work-spec weight"],
  ["max_getwork", "operate", "tasks per claim"],
  ["worker_idle_s", "operate", "seconds (60)"],
  ["worker_max_tasks", "operate", "0: no limit"],
  ["worker_max_rss_mb", "operate", "0: no limit"],
  ["worker_start_s", "operate", "seconds (30)"],
  ["schedule", "operate", '"*/5 * * * *"'],
  ["schedule_tz", "operate", '"UTC"'],
  ["schedule_params", "operate", '{"source": "cron"}'],
  ["schedule_missed", "operate", '"skip" or "once"'],
  ["retain", "admin", '{"succeeded_s": 86400, "failed_s": 604800, "cancelled_s": 86400}: seconds ended tasks are kept; null: for ever'],
  ["worker", "admin", '"process" or "persistent"'],
  ["config", "admin", "an object handed to the plugin"],
  ["then", "admin", "the queue its tasks' outputs go to"],
  ["continuous", "admin", "true or false"],
  ["interval", "admin", "seconds"],
  ["runtime", "admin", "work-spec runtime"],
  ["min_gb", "admin", "GB a node needs"],
];

/** A stored value as the card shows it: JSON, with strings bare, as the CLI reads them back. */
function settingText(v) {
  if (v === undefined || v === null) return "";
  return typeof v === "string" ? v : JSON.stringify(v);
}

/**
 * What the text typed for a setting sends: JSON where it parses (`30`, `true`, `{...}`), else
 * the text itself; empty removes the setting (its default applies again).
 */
function settingValue(text) {
  if (text === "") return null;
  try {
    return JSON.parse(text);
  } catch (e) {
    return text;
  }
}

/** The card; `fillSettings` keeps its queue list current. */
function settingsCard(ctx) {
  const s = ctx.state;
  s.settingsMsg = msgBox("queue-settings-msg");
  s.settingsQueue = el("select", { id: "settings-queue", "aria-label": "queue" });
  s.settingsInputs = Object.fromEntries(QUEUE_SETTINGS.map(([f, role, hint]) => [f, el("input", {
    id: `setting-${f}`, type: "text", size: 30, autocomplete: "off", spellcheck: "false",
    placeholder: hint, dataset: { field: f }, title: `${f}: ${hint} (${role} role)`,
  })]));
  const loadQueue = (stored) => {
    const q = stored && stored.id ? stored : s.latest && s.latest.get(s.settingsQueue.value);
    s.settingsShown = {};
    for (const [f] of QUEUE_SETTINGS) {
      const text = settingText(q ? q[f] : undefined);
      s.settingsShown[f] = text;
      s.settingsInputs[f].value = text;
    }
  };
  s.settingsQueue.addEventListener("change", () => loadQueue());
  const field = ([f, role]) => el("label", { class: "field" },
    el("span", null, f, role === "admin" ? el("span", { class: "muted" }, " (admin)") : null),
    s.settingsInputs[f]);
  const submit = el("button", { type: "submit", id: "settings-submit" }, "Save settings");
  const form = el("form", { id: "settings-form", class: "form-row", novalidate: true },
    el("label", { class: "field" }, el("span", null, "Queue"), s.settingsQueue),
    QUEUE_SETTINGS.map(field),
    el("div", { class: "field submit" }, submit,
      el("button", { type: "button", id: "settings-reload", onclick: () => loadQueue() }, "Reload")),
    s.settingsMsg);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const id = s.settingsQueue.value;
    if (!id) { showMsg(s.settingsMsg, "choose a queue", "error"); return; }
    const body = {};
    for (const [f] of QUEUE_SETTINGS) {
      const text = s.settingsInputs[f].value.trim();
      if (text !== s.settingsShown[f]) body[f] = settingValue(text);
    }
    const changed = Object.keys(body);
    if (!changed.length) { showMsg(s.settingsMsg, "nothing changed", "notice"); return; }
    const name = shown(s.settingsQueue.selectedOptions[0].textContent);
    submit.disabled = true;
    try {
      await api("POST", `queues/${encodeURIComponent(id)}`, body);
      // As the server stored it (its JSON types, numbers as numbers), not as typed.
      const stored = await api("GET", `queues/${encodeURIComponent(id)}`).catch(() => null);
      if (stored && s.settingsQueue.value === id) loadQueue(stored);
      showMsg(s.settingsMsg, `queue ${name}: ${changed.join(", ")} saved`, "notice");
    } catch (err) {
      showMsg(s.settingsMsg, `queue ${name}: ${err.message}; nothing was changed`, "error");
    }
    submit.disabled = false;
    refreshNow();
  });
  s.settingsLoad = loadQueue;
  return el("section", { id: "queue-settings", class: "card" },
    el("h2", null, "Queue settings"),
    el("p", { class: "hint" }, "Every run setting of a queue as stored; values are JSON where " +
      "they parse, else text; an empty field removes the setting, so its default applies. " +
      "Only changed fields are sent, in one request: all are saved or none."),
    form);
}

/** Keeps the queue list current; the fields are loaded when a queue is picked, not on refresh. */
function fillSettings(ctx, queues) {
  const s = ctx.state;
  if (isBusy(s.settingsQueue.parentNode)) return;
  const before = s.settingsQueue.value;
  setOptions(s.settingsQueue, queues.map((q) => [q.id, shown(q.name)]), before || undefined);
  if (s.settingsQueue.value !== before || !s.settingsShown) s.settingsLoad();
}
