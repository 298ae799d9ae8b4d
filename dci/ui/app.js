"use strict";
/*
 * Disbatch operator console — core: DOM and format helpers, the API helper, the modal,
 * hash routing and polling. The access token (prompt and storage) is in access.js. The pages
 * live in queues.js (queues, nodes), tasks.js (task search, one task), balance.js and
 * charts.js; each
 * registers itself in PAGES as
 *   { title, enter(main, ctx), refresh(ctx) }
 * enter() builds the page's static parts once; refresh() is called at once and then every
 * POLL_MS, fetches, and re-renders the parts that show server data.
 * Every value from the server reaches the DOM through textContent / text nodes only, and
 * stored names are shown through shown(): control and bidi characters made visible.
 */

const POLL_MS = 2000;
const PAGES = {};

/* ---------- Stored text ---------- */

/*
 * Names reach the database unchecked (ops, older versions). Characters a page hides or acts on
 * instead of showing — controls, bidi overrides and marks (U+202E shows text reversed),
 * invisible format characters — are shown as \u{..} escapes, as core/src/printable.rs does
 * for the CLI and the metrics. Links and API calls keep the value as stored.
 */
const HIDDEN = /[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]/g;
const EDGE_SPACE = /^\s+|\s+$/g;
const MAX_SHOWN = 256;
const escapeChar = (c) => `\\u{${c.codePointAt(0).toString(16)}}`;

/** A stored name as shown: hidden characters and spaces at its ends escaped, cut when absurd. */
function shown(text) {
  const chars = [...String(text ?? "")];
  const cut = chars.length > MAX_SHOWN ? `…[+${chars.length - MAX_SHOWN} chars]` : "";
  const head = chars.slice(0, MAX_SHOWN).join("");
  return head.replace(HIDDEN, escapeChar)
    .replace(EDGE_SPACE, (m) => [...m].map(escapeChar).join("")) + cut;
}

/** JSON text with hidden characters other than line feeds as \uXXXX: the same JSON value. */
function shownJson(text) {
  return text.replace(HIDDEN, (c) => (c === "\n" ? c
    : `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`));
}

/* ---------- DOM helpers ---------- */

/** el("tr", {class: "x", dataset: {queue: n}, onclick: f}, child, "text", [more]) */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else if (k === "value") setValue(node, v);
    else if (k === "checked" || k === "disabled" || k === "hidden") node[k] = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  return node;
}

/** Sets a control's value and mirrors it in an attribute, so isEqualNode sees it. */
function setValue(node, v) {
  node.value = String(v);
  node.setAttribute(node.tagName === "SELECT" ? "data-value" : "value", String(v));
}

/** A <select> from [[value, label], …] or plain values; `selected` picks the value. */
function selectEl(attrs, options, selected) {
  const s = el("select", attrs);
  setOptions(s, options, selected);
  return s;
}

function setOptions(select, options, selected) {
  const opts = options.map((o) => {
    const [value, label] = Array.isArray(o) ? o : [o, o];
    return el("option", { value: String(value) }, String(label));
  });
  select.replaceChildren(...opts);
  if (selected !== undefined && selected !== null) setValue(select, selected);
}

/** Replaces a container's children, unless the new ones are equal (keeps references valid). */
function setContent(container, ...nodes) {
  const next = el("div", null, nodes);
  if (!next.isEqualNode(el("div", null, [...container.childNodes].map((c) => c.cloneNode(true))))) {
    container.replaceChildren(...next.childNodes);
  }
}

/** A message element: `kind` is "error", "notice" or "hint"; empty text hides it. */
function msgBox(id) {
  return el("div", { id, class: "msg", hidden: true, role: "status" });
}

function showMsg(box, text, kind) {
  if (!box) return;
  const lines = Array.isArray(text) ? text : text ? [text] : [];
  box.className = lines.length ? "msg " + (kind || "notice") : "msg";
  box.hidden = !lines.length;
  if (lines.length > 1) box.replaceChildren(el("ul", null, lines.map((l) => el("li", null, l))));
  else box.textContent = lines[0] || "";
}

/** True while the user edits something inside `container` (so polling must not redraw it). */
function isBusy(container) {
  if (!container) return false;
  const a = document.activeElement;
  if (a && a !== document.body && container.contains(a) && a.matches("input, select, textarea")) {
    return true;
  }
  return !!container.querySelector("[data-dirty]") || container.hasAttribute("data-dirty");
}

/*
 * Polling redraws tables by patching rows in place, keyed by a data attribute: unchanged
 * cells are left alone, a cell the user is editing is skipped, and a cell holding one
 * input or select keeps that element (only its value changes), so neither a person nor a
 * WebDriver test holding a reference loses the field between polls.
 */
function patchRows(tbody, fresh, key) {
  const old = new Map();
  for (const r of tbody.rows) if (r.dataset[key] !== undefined) old.set(r.dataset[key], r);
  const rows = fresh.map((n) => {
    const o = old.get(n.dataset[key]);
    if (!o) return n;
    old.delete(n.dataset[key]);
    return patchRow(o, n);
  });
  const keep = new Set(rows);
  for (const r of [...tbody.rows]) if (!keep.has(r)) r.remove();
  let prev = null;
  for (const r of rows) {
    const want = prev ? prev.nextSibling : tbody.firstChild;
    if (want !== r) tbody.insertBefore(r, want);
    prev = r;
  }
}

function patchRow(o, n) {
  if (o.cells.length !== n.cells.length) {
    o.replaceWith(n);
    return n;
  }
  syncAttributes(o, n);
  const fresh = [...n.cells];
  [...o.cells].forEach((cell, i) => patchCell(cell, fresh[i]));
  return o;
}

function patchCell(o, n) {
  if (o.isEqualNode(n) || isBusy(o)) return;
  const oc = o.querySelectorAll("input, select");
  const nc = n.querySelectorAll("input, select");
  const same = oc.length === 1 && nc.length === 1 && oc[0].tagName === nc[0].tagName &&
    oc[0].className === nc[0].className && oc[0].parentNode === o && nc[0].parentNode === n &&
    (oc[0].tagName !== "SELECT" || optionsSig(oc[0]) === optionsSig(nc[0]));
  if (!same) {
    o.replaceWith(n);
    return;
  }
  const [ctl, next] = [oc[0], nc[0]];
  syncAttributes(ctl, next);
  ctl.value = next.value;
  syncAttributes(o, n);
  for (const c of [...o.childNodes]) if (c !== ctl) c.remove();
  let seen = false;
  for (const c of [...n.childNodes]) {
    if (c === next) seen = true;
    else if (seen) o.append(c);
    else o.insertBefore(c, ctl);
  }
}

const optionsSig = (select) => [...select.options].map((op) => `${op.value}\u0000${op.text}`).join("\u0001");

function syncAttributes(o, n) {
  for (const a of [...o.attributes]) if (!n.hasAttribute(a.name)) o.removeAttribute(a.name);
  for (const a of n.attributes) if (o.getAttribute(a.name) !== a.value) o.setAttribute(a.name, a.value);
  if ("disabled" in n) o.disabled = n.disabled;
}

/** True when `data` differs from what was last rendered under `key` (and remembers it). */
function changed(state, key, data) {
  const sig = JSON.stringify(data);
  if (state["sig:" + key] === sig) return false;
  state["sig:" + key] = sig;
  return true;
}

/* ---------- formatting ---------- */

const pad2 = (n) => String(n).padStart(2, "0");

function fmtClock(d) {
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}

function fmtLocal(d) {
  if (!(d instanceof Date) || isNaN(d)) return "";
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${fmtClock(d)}`;
}

/** Task times: "YYYY-MM-DDTHH:MM:SS" (UTC) or epoch seconds → Date (or null). */
function parseTaskTime(v) {
  if (v === null || v === undefined || v === "") return null;
  if (typeof v === "number") return new Date(v * 1000);
  if (typeof v === "object" && v.$date) return new Date(v.$date);
  const d = new Date(/[zZ]|[+-]\d\d:?\d\d$/.test(v) ? v : v + "Z");
  return isNaN(d) ? null : d;
}

/** A time cell: local time, UTC original in the tooltip. */
function timeEl(v) {
  const d = parseTaskTime(v);
  if (!d) return el("span", { class: "muted" }, v === null || v === undefined ? "—" : String(v));
  return el("time", { datetime: d.toISOString(), title: d.toISOString().replace(".000Z", "Z") },
    fmtLocal(d));
}

function fmtAgo(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 120) return `${s}s ago`;
  if (s < 7200) return `${Math.round(s / 60)}m ago`;
  if (s < 172800) return `${Math.round(s / 3600)}h ago`;
  return `${Math.round(s / 86400)}d ago`;
}

function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1048576) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1048576).toFixed(1)} MiB`;
}

const oidOf = (v) => (v && typeof v === "object" && "$oid" in v ? v.$oid : v);

/* ---------- task statuses ---------- */

const STATUSES = {
  "-6": ["orphaned", "st-orphaned"],
  "-5": ["cancelled", "st-cancelled"],
  "-4": ["blocked", "st-blocked"],
  "-3": ["terminated", "st-terminated"],
  "-2": ["queued", "st-queued"],
  "-1": ["claimed", "st-claimed"],
  "0": ["running", "st-running"],
  "1": ["succeeded", "st-succeeded"],
};

function statusInfo(code) {
  if (typeof code === "number" && code >= 2) return ["failed", "st-failed"];
  return STATUSES[String(code)] || [`status ${code}`, "st-unknown"];
}

function statusEl(code, id) {
  const [label, cls] = statusInfo(code);
  return el("span", { id, class: `status ${cls}`, title: `status ${code}`, dataset: { status: String(code) } },
    label);
}

const canCancel = (s) => s === -2 || s === -4;
const canRetry = (s) => s >= 1 || s === -6 || s === -5 || s === -3;
const canDelete = (s) => s !== -1 && s !== 0;

/* ---------- API ---------- */

/** The message of an error body: `error` (or balance's `status`) plus useful details. */
function errorText(res, data, text) {
  if (data && typeof data === "object" && !Array.isArray(data)) {
    let m = data.error || data.status;
    if (m) {
      const extra = ["param", "plugin", "invalid_params"]
        .filter((k) => data[k] !== undefined)
        .map((k) => `${k}: ${Array.isArray(data[k]) ? data[k].join(", ") : data[k]}`);
      if (extra.length) m += ` (${extra.join("; ")})`;
      return String(m);
    }
  }
  const snippet = (text || "").trim().slice(0, 200);
  return `HTTP ${res.status} ${res.statusText}${snippet ? ": " + snippet : ""}`;
}

/** An Error for a failed answer; 401 opens the token prompt, 403 says the role is too low. */
function failure(res, data, text) {
  let message = errorText(res, data, text);
  if (res.status === 401) {
    // A refusal of a token already replaced (a poll sent before the new one was saved)
    // must not reopen the prompt over the console the new token has loaded.
    if (res.sentToken === undefined || res.sentToken === storedToken()) askToken(message);
    message = `an access token is needed (${message})`;
  } else if (res.status === 403) {
    message = `Your token's role cannot do this (${message})`;
  }
  const err = new Error(message);
  err.status = res.status;
  err.data = data;
  return err;
}

/** fetch with the access token, if any; a network failure becomes a readable Error. */
async function send(path, opts) {
  opts.headers = withToken(opts.headers || {});
  const sentToken = storedToken();
  try {
    const res = await fetch(path, opts);
    res.sentToken = sentToken;
    return res;
  } catch (e) {
    throw new Error(`cannot reach the server (${e.message})`);
  }
}

/** api("POST", "queues", {…}) → parsed JSON, or throws Error(server message). */
async function api(method, path, body) {
  const opts = { method, headers: { Accept: "application/json" }, cache: "no-store" };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const res = await send(path, opts);
  const text = await res.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch (e) {
      if (res.ok) throw new Error(`${method} ${path}: the answer is not JSON`);
    }
  }
  if (!res.ok) throw failure(res, data, text);
  return data;
}

/** A text resource (task output): { text, bytes, total } with total from X-Total-Length. */
async function apiText(path) {
  const res = await send(path, { cache: "no-store" });
  const buf = await res.arrayBuffer();
  const text = new TextDecoder("utf-8").decode(buf);
  if (!res.ok) {
    let data = null;
    try { data = JSON.parse(text); } catch (e) { /* not JSON */ }
    throw failure(res, data, text);
  }
  const header = res.headers.get("X-Total-Length");
  const total = header !== null && /^\d+$/.test(header) ? Number(header) : null;
  return { text, bytes: buf.byteLength, total };
}

/** GET queues → [{id, name, …}] sorted by name. */
async function fetchQueues() {
  const qs = await api("GET", "queues");
  return (Array.isArray(qs) ? qs : []).slice().sort((a, b) => String(a.name).localeCompare(String(b.name)));
}

/** Task search answers: an array, one object (`.limit 1`) or `{}` (legacy empty answer). */
function taskList(data) {
  if (Array.isArray(data)) return data;
  if (data && typeof data === "object" && data._id) return [data];
  return [];
}

/* ---------- confirmation modal ---------- */

let confirmResolve = null;

/** An in-page modal (not window.confirm): resolves true on #confirm-yes. */
function confirmDialog(text, yesLabel, noLabel) {
  const modal = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-yes").textContent = yesLabel || "Delete";
  document.getElementById("confirm-no").textContent = noLabel || "Cancel";
  if (confirmResolve) confirmResolve(false);
  modal.hidden = false;
  document.getElementById("confirm-no").focus();
  return new Promise((resolve) => { confirmResolve = resolve; });
}

function closeConfirm(answer) {
  document.getElementById("confirm").hidden = true;
  const r = confirmResolve;
  confirmResolve = null;
  if (r) r(answer);
}

const modalOpen = () => !document.getElementById("confirm").hidden;

/* ---------- header ---------- */

function markUpdated() {
  const u = document.getElementById("updated");
  u.className = "conn ok";
  u.textContent = `updated ${fmtClock(new Date())}`;
  u.title = "";
}

function markError(e) {
  const u = document.getElementById("updated");
  u.className = "conn conn-error";
  u.textContent = `⚠ ${e.message}`;
  u.title = `last attempt ${fmtClock(new Date())}`;
}

let infoLoaded = false;
let dbName = "";

function setTitle() {
  const page = current ? current.page.title : "";
  document.title = [page, "Disbatch", dbName && `(${dbName})`].filter(Boolean).join(" — ").replace(" — (", " (");
}

async function loadInfo() {
  if (infoLoaded) return;
  try {
    const info = await api("GET", "info");
    document.getElementById("db-name").textContent = info && info.database ? info.database : "";
    dbName = info && info.database ? String(info.database) : "";
    infoLoaded = true;
    setTitle();
  } catch (e) {
    /* the poll indicator reports connection problems */
  }
}

/* ---------- routing and polling ---------- */

let current = null;   // { name, page, ctx }
let generation = 0;
let inFlight = false;
let again = false;
let flash = null;     // a message for the next page: { text, kind }

/** "#/tasks?queue=x&page=2" → { name: "tasks", arg: undefined, params: {queue, page} } */
function parseHash() {
  const h = location.hash.replace(/^#\/?/, "");
  const [path, query] = h.split("?");
  const decode = (x) => { try { return decodeURIComponent(x); } catch (e) { return x; } };
  const parts = path.split("/").filter(Boolean).map(decode);
  const params = Object.fromEntries(new URLSearchParams(query || ""));
  return { name: parts[0] || "queues", arg: parts[1], params };
}

function hashFor(name, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") q.set(k, v);
  }
  const s = q.toString();
  return `#/${name}${s ? "?" + s : ""}`;
}

/** Show `text` on the next page rendered (e.g. after deleting a task). */
function setFlash(text, kind) {
  flash = { text, kind: kind || "notice" };
}

function takeFlash(box) {
  if (flash) showMsg(box, flash.text, flash.kind);
  flash = null;
}

function navigate() {
  const route = parseHash();
  let name = route.name;
  if (!PAGES[name]) name = "queues";
  const page = PAGES[name];
  const gen = ++generation;
  const ctx = {
    gen,
    arg: route.arg,
    params: route.params,
    loaded: false,
    alive: () => generation === gen,
    /** Call after each successful render; marks the page loaded for tests. */
    rendered() {
      if (!ctx.alive()) return;
      ctx.loaded = true;
      document.body.dataset.loaded = "1";
      showMsg(document.getElementById("page-error"), "");
    },
  };
  current = { name, page, ctx };
  document.body.dataset.page = name;
  delete document.body.dataset.loaded;
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.page === name || (name === "task" && a.dataset.page === "tasks"));
  }
  const main = document.getElementById("main");
  main.replaceChildren(msgBox("page-error"));
  setTitle();
  page.enter(main, ctx);
  refreshNow();
}

/** Run the current page's refresh; a call while one runs schedules one more run. */
async function refreshNow() {
  if (inFlight) {
    again = true;
    return;
  }
  inFlight = true;
  try {
    do {
      again = false;
      const cur = current;
      loadInfo();
      try {
        await cur.page.refresh(cur.ctx);
        if (cur.ctx.alive()) markUpdated();
      } catch (e) {
        if (!cur.ctx.alive()) continue;
        markError(e);
        // A 401 has the token prompt to explain it; saying it twice is noise.
        if (!cur.ctx.loaded && e.status !== 401) {
          showMsg(document.getElementById("page-error"), e.message, "error");
        }
      }
    } while (again);
  } finally {
    inFlight = false;
  }
}

function tick() {
  if (!current || inFlight || modalOpen() || document.hidden) return;
  refreshNow();
}

function start() {
  document.getElementById("token-form").addEventListener("submit", submitToken);
  document.getElementById("token-clear").addEventListener("click", forgetToken);
  document.getElementById("token-clear").hidden = !storedToken();
  document.getElementById("confirm-yes").addEventListener("click", () => closeConfirm(true));
  document.getElementById("confirm-no").addEventListener("click", () => closeConfirm(false));
  document.getElementById("confirm").addEventListener("click", (e) => {
    if (e.target.id === "confirm") closeConfirm(false);
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && modalOpen()) closeConfirm(false);
  });
  window.addEventListener("hashchange", navigate);
  navigate();
  setInterval(tick, POLL_MS);
}

document.addEventListener("DOMContentLoaded", start);

/* ---------- shared widgets ---------- */

/** A table inside a horizontally scrolling wrapper: { wrap, table, tbody }. */
function gridTable(id, headers) {
  const tbody = el("tbody");
  const table = el("table", { id, class: "grid" },
    el("thead", null, el("tr", null, headers.map((h) =>
      Array.isArray(h) ? el("th", { class: h[1] }, h[0]) : el("th", null, h)))),
    tbody);
  return { wrap: el("div", { class: "table-wrap" }, table), table, tbody };
}

/**
 * Inline edit of a text input: Enter or blur saves through `save(value)` when the value
 * changed; Escape reverts. `check(value)` returns an error text or null (an invalid value
 * stays in the field). While the value differs from the saved one the input carries
 * data-dirty, so polling leaves its table alone.
 */
function inlineEdit(input, { check, save, onError }) {
  input.dataset.orig = input.value;
  let saving = false;
  const commit = async (fromBlur) => {
    const value = input.value.trim();
    if (saving) return;
    if (value === input.dataset.orig) {
      delete input.dataset.dirty;
      return;
    }
    input.dataset.dirty = "1";
    const problem = check ? check(value) : null;
    if (problem) {
      // Keep what was typed (still dirty, so polling leaves it); a blank left by clearing
      // the field before typing is not worth a message yet.
      if (!(fromBlur && value === "")) onError(problem);
      return;
    }
    saving = true;
    input.disabled = true;
    try {
      await save(value);
      input.dataset.orig = value;
    } catch (e) {
      onError(e.message);
      input.value = input.dataset.orig;
    } finally {
      saving = false;
      input.disabled = false;
      delete input.dataset.dirty;
      if (!fromBlur) input.blur();
      refreshNow();
    }
  };
  input.addEventListener("input", () => {
    if (input.value !== input.dataset.orig) input.dataset.dirty = "1";
    else delete input.dataset.dirty;
  });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      e.preventDefault();
      commit(false);
    } else if (e.key === "Escape") {
      input.value = input.dataset.orig;
      delete input.dataset.dirty;
      input.blur();
    }
  });
  input.addEventListener("blur", () => commit(true));
  return input;
}

const isCount = (v) => /^\d+$/.test(v);
