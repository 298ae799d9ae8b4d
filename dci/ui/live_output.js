"use strict";
/* Disbatch operator console — live output: while a task runs, its page tails stdout and
   stderr from GET tasks/:id/stdout|stderr (X-Disbatch-Output: live), appending new text about
   once a second; when the task ends, the panel shows the stored output again. Text goes in
   as text nodes only. */

const LIVE_MS = 1000;
/** The most a live panel holds; older text is dropped from the top. */
const LIVE_KEEP = 256 * 1024;

/**
 * Called on each refresh of an output panel (`view`: its pre, range, storage and pager).
 * While the task runs it takes the panel over and returns true; once the task runs no
 * longer it stops and returns false, so the panel loads the stored output.
 */
function liveOutput(ctx, stream, task, view) {
  const key = `live-${stream}`;
  const st = ctx.state[key] || (ctx.state[key] = { on: false });
  if (task.status !== 0) {
    if (st.on) stopLive(st, view);
    return false;
  }
  if (!st.on) startLive(ctx, stream, st, view);
  view.storage.textContent = "live, while the task runs";
  return true;
}

function startLive(ctx, stream, st, view) {
  Object.assign(st, { on: true, have: 0, run: (st.run || 0) + 1, decoder: new TextDecoder("utf-8") });
  const run = st.run;
  const still = () => st.on && st.run === run && ctx.alive();
  view.pre.textContent = "";
  view.pre.classList.add("empty");
  if (view.pager) view.pager.hidden = true;
  view.range.textContent = "live";
  const path = `tasks/${encodeURIComponent(ctx.state.id)}/${stream}`;
  (async () => {
    while (still()) {
      try {
        const res = await send(`${path}?offset=${st.have}`, { cache: "no-store" });
        const buf = await res.arrayBuffer();
        if (!still()) return;
        if (res.ok && res.headers.get("X-Disbatch-Output") === "live") showLive(st, view, res, buf);
      } catch (e) {
        /* the page's own refresh reports a lost server */
      }
      await new Promise((done) => setTimeout(done, LIVE_MS));
    }
  })();
}

function stopLive(st, view) {
  st.on = false;
  if (view.pager) view.pager.hidden = false;
}

function liveNumber(res, name) {
  const v = res.headers.get(name);
  return v !== null && /^\d+$/.test(v) ? Number(v) : 0;
}

/** Appends what came since the last poll; says how much the live copy skipped. */
function showLive(st, view, res, buf) {
  const skipped = liveNumber(res, "X-Disbatch-Output-Skipped");
  const total = liveNumber(res, "X-Total-Length");
  if (skipped > st.have) {
    st.have = skipped;
    st.decoder = new TextDecoder("utf-8");
    view.pre.textContent = `[… ${fmtBytes(skipped)} not kept while the task runs …]\n`;
  }
  const text = st.decoder.decode(buf, { stream: true });
  st.have += buf.byteLength;
  if (text) {
    const pre = view.pre;
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(document.createTextNode(text));
    pre.classList.remove("empty");
    if (pre.textContent.length > LIVE_KEEP) pre.textContent = pre.textContent.slice(-LIVE_KEEP);
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }
  view.range.textContent = `live: ${fmtBytes(total)} so far` +
    (skipped > 0 ? `, the last ${fmtBytes(total - skipped)} kept` : "");
}
