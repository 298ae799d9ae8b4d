// What every peer's bench shares: options, the worker processes and their reports, and the
// figures, all taken the way tests/src/bench takes ours (see BENCHMARKS.md).

import { fork, execFile } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function pct(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : NaN;
}
const median = (xs) => pct(xs, 50);

const TICKS = 100; // USER_HZ on Linux

function statFields(pid) {
  const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // Fields after the parenthesised command name: [1] is the parent's pid, [11..14] utime,
  // stime, cutime, cstime.
  return s.slice(s.lastIndexOf(')') + 2).split(' ');
}

/** CPU of a process and of the children it has reaped, in ms. */
export function cpuMs(pid) {
  const f = statFields(pid);
  return ((Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) * 1000) / TICKS;
}

/**
 * CPU of a server that forks a process per connection (PostgreSQL): the parent, what it reaped,
 * and its live children, in ms.
 */
export function treeCpuMs(pid) {
  let total = cpuMs(pid);
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name) || Number(name) === pid) continue;
    try {
      const f = statFields(name);
      if (Number(f[1]) === pid) total += cpuMs(name);
    } catch {
      // The process ended while we looked.
    }
  }
  return total;
}

function hwmMiB(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmHWM:\s+(\d+) kB/);
  return m ? Number(m[1]) / 1024 : NaN;
}

/**
 * The options every peer takes, plus the peer's own `flags` ({'--name': 'key'} for a value,
 * {'--name': true} for a switch, stored as the camel-cased name).
 */
export function parseArgs(argv, flags = {}) {
  const out = {
    workers: [1, 2, 4],
    depth: [1000],
    jobs: 1000,
    runSecs: 15,
    concurrency: 8,
    latencyJobs: 200,
    latencyGapMs: 20,
    repeat: 3,
  };
  const camel = (a) => a.slice(2).replace(/-(.)/g, (_, c) => c.toUpperCase());
  const ints = (x) => x.split(',').map(Number);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = () => {
      const x = argv[++i];
      if (x === undefined) throw new Error(`${a} needs a value`);
      return x;
    };
    if (a === '--uri') out.uri = v();
    else if (a === '--workers') out.workers = ints(v());
    else if (a === '--depth') out.depth = ints(v());
    else if (a === '--jobs') out.jobs = Number(v());
    else if (a === '--run-secs') out.runSecs = Number(v());
    else if (a === '--concurrency') out.concurrency = Number(v());
    else if (a === '--latency-jobs') out.latencyJobs = Number(v());
    else if (a === '--latency-gap-ms') out.latencyGapMs = Number(v());
    else if (a === '--repeat') out.repeat = Number(v());
    else if (a === '--plugin') out.plugin = v();
    else if (a === '--inproc') out.inproc = true;
    else if (a === '--server-pid') out.serverPid = Number(v());
    else if (a === '--worker') out.worker = true;
    else if (a === '--db') out.db = v();
    else if (flags[a] === true) out[camel(a)] = true;
    else if (flags[a] !== undefined) out[camel(a)] = v();
    else throw new Error(`unknown argument ${a}`);
  }
  if (!out.uri) throw new Error('--uri is required');
  if (!out.inproc && !out.plugin) throw new Error('--plugin or --inproc is required');
  const counts = [...out.workers, ...out.depth, out.jobs, out.runSecs, out.concurrency];
  for (const n of [...counts, out.latencyJobs, out.latencyGapMs, out.repeat]) {
    if (!Number.isInteger(n) || n < 1) throw new Error(`not a positive integer: ${n}`);
  }
  return out;
}

/** The job itself: the no-op plugin as a child process, or nothing (`--inproc`). */
function runJob(opt) {
  if (opt.inproc) return Promise.resolve();
  return new Promise((resolve, reject) =>
    execFile(opt.plugin, [], (e) => (e ? reject(e) : resolve())),
  );
}

// ---- inside a worker process ---------------------------------------------------------------

/**
 * Connects a worker to its coordinator: `job(saved)` runs one job and reports it (a failed one
 * is counted, then rethrown to the peer), `count` and `took` a request to the database by
 * command and its round-trip ms. `stop` is the peer's own shutdown.
 */
export function workerChannel(opt, stop) {
  // The coordinator is gone (it failed or was killed): nobody is left to measure.
  process.on('disconnect', () => process.exit(1));
  let events = [];
  let failed = 0;
  let requests = 0;
  const byCommand = {};
  const entry = (name) => (byCommand[name] ??= { n: 0, ms: 0 });
  const flush = () => {
    if ((events.length || failed) && process.connected) process.send({ events, failed });
    events = [];
    failed = 0;
  };
  setInterval(flush, 50).unref();
  process.on('message', async (m) => {
    if (m === 'requests') process.send({ requests, byCommand });
    if (m === 'stop') {
      // Requests still in flight fail once the client closes; the worker is leaving anyway.
      process.on('uncaughtException', () => process.exit(0));
      process.on('unhandledRejection', () => process.exit(0));
      flush();
      await stop();
      process.exit(0);
    }
  });
  return {
    job: async (saved) => {
      const start = Date.now();
      try {
        await runJob(opt);
      } catch (e) {
        failed++;
        throw e;
      }
      events.push({ saved, start, end: Date.now() });
    },
    count: (command) => {
      requests++;
      entry(command).n++;
    },
    took: (command, ms) => (entry(command).ms += ms),
    ready: () => process.send({ ready: true }),
  };
}

// ---- in the coordinator --------------------------------------------------------------------

// Workers still running: a failed run must not leave them polling the server.
const liveWorkers = new Set();
function killWorkers() {
  for (const w of liveWorkers) w.kill('SIGKILL');
}

/** Starts `n` worker processes of `script` with `args` and waits until each is ready. */
async function startFleet(script, args, n) {
  const events = [];
  const failures = { count: 0 };
  const workers = [];
  for (let i = 0; i < n; i++) {
    const child = fork(script, ['--worker', ...args], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    liveWorkers.add(child);
    child.on('exit', () => liveWorkers.delete(child));
    const ready = new Promise((resolve, reject) => {
      child.on('message', (m) => {
        if (m.ready) resolve();
        if (m.events) events.push(...m.events);
        if (m.failed) failures.count += m.failed;
      });
      child.on('exit', (code) => reject(new Error(`worker exited ${code}`)));
    });
    workers.push({ child, ready });
  }
  await Promise.all(workers.map((w) => w.ready));
  const ask = (w) =>
    new Promise((resolve) => {
      const on = (m) => {
        if (m.requests !== undefined) {
          w.child.off('message', on);
          resolve(m);
        }
      };
      w.child.on('message', on);
      w.child.send('requests');
    });
  const requests = async () => {
    const xs = await Promise.all(workers.map(ask));
    const by = {};
    for (const x of xs) {
      for (const [k, v] of Object.entries(x.byCommand)) {
        by[k] ??= { n: 0, ms: 0 };
        by[k].n += v.n;
        by[k].ms += v.ms;
      }
    }
    return { total: xs.reduce((a, x) => a + x.requests, 0), by };
  };
  const cpu = () => workers.reduce((a, w) => a + cpuMs(w.child.pid), 0);
  const stop = async () => {
    const peak = Math.max(...workers.map((w) => hwmMiB(w.child.pid)));
    await Promise.all(
      workers.map(
        (w) =>
          new Promise((resolve) => {
            w.child.removeAllListeners('exit');
            w.child.on('exit', resolve);
            w.child.send('stop');
          }),
      ),
    );
    return peak;
  };
  return { events, failures, requests, cpu, stop };
}

/** Resolves once `n` jobs ran, or at `deadline` (ms since the epoch) with however many did. */
async function waitFor(events, n, deadline) {
  while (events.length < n && Date.now() < deadline) await sleep(20);
}

/**
 * Throughput from a backlog: `fleet` already started on `depth` queued jobs; the run ends after
 * `jobs` of them or `run-secs`, as ours do. `serverCpu` reads the server's CPU (ms) or NaN.
 */
async function measureRun(opt, fleet, depth, serverCpu) {
  const serverBefore = serverCpu();
  const cpuBefore = fleet.cpu();
  const reqBefore = await fleet.requests();
  await waitFor(fleet.events, Math.min(opt.jobs, depth), Date.now() + opt.runSecs * 1000);
  const ran = fleet.events.length;
  const reqAfter = await fleet.requests();
  const cpuAfter = fleet.cpu();
  const serverAfter = serverCpu();
  // No job in the whole run is a result too (a deep backlog can be that slow): 0 jobs/s, and
  // the per-job figures are then null.
  const first = Math.min(...fleet.events.map((e) => e.start));
  const last = Math.max(...fleet.events.map((e) => e.end));
  return {
    tasks_run: ran,
    failed_jobs: fleet.failures.count,
    drained: ran >= depth,
    tasks_per_s: ran === 0 ? 0 : ran / ((last - first) / 1000),
    requests_per_task: (reqAfter.total - reqBefore.total) / ran,
    // command: [per job, driver ms per job]
    by_command: Object.fromEntries(
      Object.entries(reqAfter.by).map(([k, v]) => {
        const b = reqBefore.by[k] ?? { n: 0, ms: 0 };
        return [k, [(v.n - b.n) / ran, (v.ms - b.ms) / ran]];
      }),
    ),
    worker_cpu_ms_per_task: (cpuAfter - cpuBefore) / ran,
    server_cpu_ms_per_task: (serverAfter - serverBefore) / ran,
  };
}

/**
 * An idle fleet on an empty queue: its own cost over 10 s, then `latency-jobs` jobs saved one
 * at a time by `save(savedAtMs)`, `latency-gap-ms` apart (enqueue→start). The default, 20 ms,
 * is disbatch-bench's; a fleet that runs fewer than 50 jobs a second needs a longer gap, or
 * the figure is its backlog's wait, not its wake-up.
 */
async function measureIdle(opt, fleet, save, serverCpu) {
  await sleep(1000);
  const cpu0 = fleet.cpu();
  const req0 = await fleet.requests();
  const srv0 = serverCpu();
  const idleMs = 10_000;
  await sleep(idleMs);
  const result = {
    worker_idle_cpu_pct: ((fleet.cpu() - cpu0) / idleMs) * 100,
    idle_requests_per_s: ((await fleet.requests()).total - req0.total) / (idleMs / 1000),
    server_idle_cpu_pct: ((serverCpu() - srv0) / idleMs) * 100,
  };
  for (let i = 0; i < opt.latencyJobs; i++) {
    await save(Date.now());
    await sleep(opt.latencyGapMs);
  }
  await waitFor(fleet.events, opt.latencyJobs, Date.now() + 120_000);
  if (fleet.events.length < opt.latencyJobs) {
    throw new Error(`idle fleet: ${fleet.events.length} of ${opt.latencyJobs} jobs ran in 120 s`);
  }
  const lat = fleet.events.map((e) => e.start - e.saved);
  result.start_p50_ms = pct(lat, 50);
  result.start_p99_ms = pct(lat, 99);
  result.latency_gap_ms = opt.latencyGapMs;
  return result;
}

/**
 * One claimer's claims, timed: `claimOnce()` claims one job and resolves whether it found one.
 * Up to 1 000 claims (or the whole backlog), at most 5 s.
 */
async function timeClaims(depth, claimOnce, serverCpu) {
  const times = [];
  const serverBefore = serverCpu();
  const t0 = Date.now();
  while (times.length < Math.min(depth, 1000) && Date.now() - t0 < 5000) {
    const c0 = performance.now();
    if (!(await claimOnce())) break;
    times.push(performance.now() - c0);
  }
  const secs = (Date.now() - t0) / 1000;
  return {
    claims: times.length,
    claims_per_s: times.length / secs,
    p50_ms: pct(times, 50),
    p99_ms: pct(times, 99),
    server_cpu_ms_per_claim: (serverCpu() - serverBefore) / times.length,
  };
}

/**
 * A peer's whole matrix, one JSON line each: its claim alone at each depth, then for each
 * worker count `repeat` runs at each depth and an idle fleet. Each measurement gets a store of
 * its own (a database or schema, named here). The peer supplies:
 *   name, settings (its options worth printing), script (its file, run again as each worker),
 *   serverCpu() (ms, or NaN), workerArgs(store), and
 *   fresh(store) → { enqueue(depth), save(savedAtMs), claimOnce() → found a job?, drop() }.
 */
export async function runMatrix(opt, peer) {
  const tag = `peer_${peer.name.replace(/\W/g, '')}_${process.pid}`;
  for (const depth of opt.depth) {
    const store = await peer.fresh(`${tag}_claim_${depth}`);
    await store.enqueue(depth);
    const alone = await timeClaims(depth, store.claimOnce, peer.serverCpu);
    await store.drop();
    console.log(JSON.stringify({ peer: peer.name, claim_alone: true, ...peer.settings, depth, ...alone }));
  }
  const mode = opt.inproc ? 'in-process no-op' : 'no-op plugin per job';
  for (const workers of opt.workers) {
    for (const depth of opt.depth) {
      const runs = [];
      for (let r = 0; r < opt.repeat; r++) {
        const name = `${tag}_${workers}_${depth}_${r}`;
        const store = await peer.fresh(name);
        await store.enqueue(depth);
        const fleet = await startFleet(peer.script, peer.workerArgs(name), workers);
        const result = await measureRun(opt, fleet, depth, peer.serverCpu);
        result.worker_peak_rss_mib = await fleet.stop();
        await store.drop();
        runs.push(result);
      }
      const head = { peer: peer.name, mode, ...peer.settings, workers, concurrency: opt.concurrency, depth };
      console.log(summarize(head, runs));
    }
    const name = `${tag}_${workers}_idle`;
    const store = await peer.fresh(name);
    const fleet = await startFleet(peer.script, peer.workerArgs(name), workers);
    const idle = await measureIdle(opt, fleet, store.save, peer.serverCpu);
    await fleet.stop();
    await store.drop();
    console.log(JSON.stringify({ peer: peer.name, idle_fleet: true, workers, ...idle }));
  }
}

/** One JSON line for `runs` of one configuration: medians, and the throughput's range. */
function summarize(head, runs) {
  const keys = Object.keys(runs[0]).filter((k) => k !== 'drained' && k !== 'by_command');
  const med = Object.fromEntries(keys.map((k) => [k, median(runs.map((x) => x[k]))]));
  const tput = runs.map((x) => x.tasks_per_s);
  return JSON.stringify({
    ...head,
    runs: runs.length,
    drained_runs: runs.filter((x) => x.drained).length,
    tasks_per_s_min: Math.min(...tput),
    tasks_per_s_max: Math.max(...tput),
    ...med,
    by_command_last_run: runs[runs.length - 1].by_command,
  });
}

/** Runs `main`; on failure says why, ends every worker and exits 1. */
export function runMain(name, main) {
  main().catch((e) => {
    console.error(`${name} bench: ${e.stack ?? e}`);
    killWorkers();
    process.exit(1);
  });
}
