"use strict";
/* Disbatch operator console — the QueueBalance page (Disbatch's balance page). */

const DAYS = [["*", "Daily (*)"], ["0", "Sun (0)"], ["1", "Mon (1)"], ["2", "Tue (2)"],
  ["3", "Wed (3)"], ["4", "Thu (4)"], ["5", "Fri (5)"], ["6", "Sat (6)"]];
const DISABLE_FOR = [["", "none"], ["5", "5 min"], ["15", "15 min"], ["60", "1 h"],
  ["240", "4 h"], ["1440", "24 h"]];
const HHMM = /^([01]\d|2[0-3]):[0-5]\d$/;

PAGES.balance = {
  title: "Balance",

  enter(main, ctx) {
    const s = (ctx.state = { known: [] });
    s.banners = el("div", { id: "balance-banners" });
    s.msg = msgBox("balance-msg");
    s.json = el("pre", { id: "balance-json", class: "json", hidden: true });
    main.append(
      el("div", { class: "page-head" }, el("h1", null, "Queue balance")),
      s.banners,
      balanceForm(ctx),
    );
  },

  async refresh(ctx) {
    const s = ctx.state;
    const doc = await api("GET", "balance");
    if (!ctx.alive()) return;
    s.doc = doc || {};
    s.known = Array.isArray(s.doc.known_queues) ? s.doc.known_queues.slice().sort() : [];
    renderBanners(s);
    s.knownEl.textContent = s.known.length ? s.known.map(shown).join(", ") : "(no queues)";
    renderDisabledState(s);
    if (!isBusy(s.form)) fillBalanceForm(s);
    ctx.rendered();
  },
};

function renderBanners(s) {
  const settings = s.doc.settings || {};
  const banners = [];
  if (settings.enabled === false) {
    banners.push(el("div", { class: "banner warn", id: "balance-not-enabled" },
      "QueueBalance is NOT ENABLED (config balance.enabled is false): these settings are stored but not applied."));
  }
  if (settings.pretend === true) {
    banners.push(el("div", { class: "banner info", id: "balance-pretend" },
      "QueueBalance is in PRETEND mode: it logs what it would do but changes nothing."));
  }
  if (s.doc.notice) banners.push(el("div", { class: "banner info" }, s.doc.notice));
  s.banners.replaceChildren(...banners);
}

function renderDisabledState(s) {
  const d = s.doc.disabled;
  const now = Date.now() / 1000;
  if (typeof d === "number" && d > now) {
    const until = new Date(d * 1000);
    s.disabledState.className = "disabled-state off";
    s.disabledState.textContent = `Balancing is disabled until ${fmtLocal(until)} ` +
      `(${Math.ceil((d - now) / 60)} min left).`;
  } else {
    s.disabledState.className = "disabled-state on";
    s.disabledState.textContent = "Balancing is not disabled.";
  }
}

/* ---------- the form ---------- */

function balanceForm(ctx) {
  const s = ctx.state;
  s.tiers = el("div", { id: "balance-tiers", class: "rows" });
  s.limits = el("div", { id: "balance-limits", class: "rows" });
  s.knownEl = el("span", { id: "balance-known", class: "mono" });
  s.disabledState = el("p", { class: "disabled-state" });
  s.disableFor = selectEl({ id: "balance-disable-for" }, DISABLE_FOR, "");
  s.reenable = el("input", { id: "balance-reenable", type: "checkbox" });
  s.dirtyNote = el("span", { class: "hint", hidden: true },
    "unsaved changes — this form no longer refreshes; Reload discards them");

  const button = (id, label, onclick, cls) => el("button", { type: "button", id, class: cls, onclick }, label);
  s.form = el("form", { id: "balance-form", novalidate: true },
    el("fieldset", { class: "card" },
      el("legend", null, "Priority tiers"),
      el("p", { class: "hint" }, "Comma-separated queue names per tier. Known queues: ", s.knownEl),
      s.tiers,
      button("add-tier", "+ Add tier", () => { addTierRow(s, ""); markDirty(s); })),
    el("fieldset", { class: "card" },
      el("legend", null, "Time-of-day limits"),
      el("p", { class: "hint" }, "From each time on (HH:MM, 24 h), run at most this many tasks in total."),
      s.limits,
      button("add-limit", "+ Add limit", () => { addLimitRow(s, "*", "", ""); markDirty(s); })),
    el("fieldset", { class: "card" },
      el("legend", null, "Disable"),
      s.disabledState,
      el("div", { class: "form-row" },
        el("label", { class: "field" }, el("span", null, "Disable for"), s.disableFor),
        el("label", { class: "field check" }, s.reenable, el("span", null, "Re-enable now")))),
    el("div", { class: "form-actions" },
      button("balance-test", "Test", () => testBalance(s)),
      el("button", { type: "submit", id: "balance-save", class: "primary" }, "Save"),
      button("balance-reload", "Reload", () => reloadBalance(s)),
      s.dirtyNote),
    s.msg,
    s.json);
  s.form.addEventListener("input", () => markDirty(s));
  s.form.addEventListener("change", () => markDirty(s));
  s.form.addEventListener("submit", (e) => {
    e.preventDefault();
    saveBalance(s);
  });
  return s.form;
}

function markDirty(s) {
  s.form.dataset.dirty = "1";
  s.dirtyNote.hidden = false;
}

function clearDirty(s) {
  delete s.form.dataset.dirty;
  s.dirtyNote.hidden = true;
}

function reloadBalance(s) {
  clearDirty(s);
  s.sig = null;
  s.disableFor.value = "";
  s.reenable.checked = false;
  showMsg(s.msg, "");
  s.json.hidden = true;
  if (document.activeElement) document.activeElement.blur();
  refreshNow();
}

/** Fills the rows from the balance document (only while the user has not edited them). */
function fillBalanceForm(s) {
  const doc = s.doc;
  const sig = JSON.stringify([doc.queues, doc.max_tasks]);
  if (sig === s.sig) return;                         // unchanged: keep the DOM (and clicks) stable
  s.sig = sig;
  s.tiers.replaceChildren();
  const tiers = Array.isArray(doc.queues) && doc.queues.length ? doc.queues : [[]];
  for (const tier of tiers) addTierRow(s, (Array.isArray(tier) ? tier : [tier]).join(", "));
  s.limits.replaceChildren();
  const order = (k) => (k[0] === "*" ? "-" : k[0]) + k.slice(1);
  const keys = Object.keys(doc.max_tasks || {}).sort((a, b) => order(a).localeCompare(order(b)));
  for (const key of keys) {
    const [day, time] = key.split(" ");
    addLimitRow(s, day, time || "", String(doc.max_tasks[key]));
  }
}

function addTierRow(s, value) {
  const input = el("input", { type: "text", class: "bal-tier", value, autocomplete: "off",
    placeholder: "queue-a, queue-b" });
  const row = el("div", { class: "row tier-row" },
    el("span", { class: "tier-label" }),
    input,
    el("button", { type: "button", class: "remove-tier", title: "remove this tier",
      onclick: () => { row.remove(); relabelTiers(s); markDirty(s); } }, "✕"));
  s.tiers.append(row);
  relabelTiers(s);
}

function relabelTiers(s) {
  [...s.tiers.children].forEach((row, i) => {
    row.querySelector(".tier-label").textContent =
      i === 0 ? "Tier 0 — default priority" : `Tier ${i} — higher priority`;
    row.dataset.tier = String(i);
  });
}

function addLimitRow(s, day, time, max) {
  const row = el("div", { class: "row limit-row" },
    selectEl({ class: "bal-day", "aria-label": "day" }, DAYS, DAYS.some((d) => d[0] === day) ? day : "*"),
    el("input", { type: "text", class: "bal-time", value: time, placeholder: "HH:MM", size: 5,
      autocomplete: "off", "aria-label": "time" }),
    el("label", { class: "inline" }, "max ",
      el("input", { type: "text", class: "bal-max", value: max, inputmode: "numeric", size: 5,
        autocomplete: "off", "aria-label": "max tasks" })),
    el("button", { type: "button", class: "remove-limit", title: "remove this limit",
      onclick: () => { row.remove(); markDirty(s); } }, "✕"));
  s.limits.append(row);
}

/* ---------- validation and saving ---------- */

/** The POST body from the form, with Disbatch's checks: { body, errors }. */
function collectBalance(s) {
  const errors = [];
  const seen = new Map();
  const queues = [...s.tiers.querySelectorAll(".bal-tier")].map((input, i) => {
    const names = input.value.split(",").map((n) => n.trim()).filter(Boolean);
    for (const name of names) {
      if (!QUEUE_NAME.test(name)) errors.push(`tier ${i}: "${name}" is not a valid queue name (^[\\w-]+$)`);
      else if (!s.known.includes(name)) errors.push(`tier ${i}: unknown queue "${name}"`);
      if (seen.has(name)) errors.push(`queue "${name}" appears more than once (tiers ${seen.get(name)} and ${i})`);
      else seen.set(name, i);
    }
    return names;
  });
  while (queues.length && !queues[queues.length - 1].length) queues.pop();

  const max_tasks = {};
  [...s.limits.querySelectorAll(".limit-row")].forEach((row, i) => {
    const day = row.querySelector(".bal-day").value;
    const time = row.querySelector(".bal-time").value.trim();
    const max = row.querySelector(".bal-max").value.trim();
    if (!time && !max) return;                       // an empty row is ignored
    const where = `limit ${i + 1}`;
    if (!HHMM.test(time)) errors.push(`${where}: time "${time}" must be HH:MM (00:00–23:59)`);
    if (!isCount(max)) errors.push(`${where}: max "${max}" must be a non-negative integer`);
    const key = `${day} ${time}`;
    if (HHMM.test(time) && key in max_tasks) errors.push(`${where}: "${key}" is listed more than once`);
    if (isCount(max)) max_tasks[key] = Number(max);
  });

  const body = { max_tasks, queues };
  const minutes = s.disableFor.value;
  if (minutes && s.reenable.checked) errors.push("choose either “disable for” or “re-enable now”, not both");
  else if (s.reenable.checked) body.disabled = null;
  else if (minutes) body.disabled = Math.floor(Date.now() / 1000) + Number(minutes) * 60;
  return { body, errors };
}

function testBalance(s) {
  const { body, errors } = collectBalance(s);
  s.json.textContent = JSON.stringify(body, null, 2);
  s.json.hidden = false;
  if (errors.length) showMsg(s.msg, errors, "error");
  else showMsg(s.msg, "The form is valid; this JSON would be sent.", "notice");
}

async function saveBalance(s) {
  const { body, errors } = collectBalance(s);
  if (errors.length) {
    showMsg(s.msg, errors, "error");
    return;
  }
  const save = document.getElementById("balance-save");
  save.disabled = true;
  try {
    const r = await api("POST", "balance", body);
    const text = r && r.status ? r.status : "saved";
    if (/^fail/i.test(text)) {
      showMsg(s.msg, text, "error");
    } else {
      showMsg(s.msg, text, "notice");
      clearDirty(s);
      s.sig = null;
      s.disableFor.value = "";
      s.reenable.checked = false;
      s.json.hidden = true;
      if (document.activeElement && s.form.contains(document.activeElement)) document.activeElement.blur();
    }
  } catch (e) {
    showMsg(s.msg, e.message, "error");
  }
  save.disabled = false;
  refreshNow();
}
