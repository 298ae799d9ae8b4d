// Agenda (Node.js, MongoDB; the most used MongoDB-backed job queue) run the way
// `disbatch-bench` runs our fleet: N worker processes on one server, M queued no-op jobs,
// each job running the same no-op plugin executable as a child process (as a DEN runs one
// per task), or nothing at all (`--inproc`, Agenda's own ceiling). Prints one JSON line per
// run. Run it through `scripts/bench-peers`, which installs the pinned packages.
//
//   node agenda.mjs --uri URI --plugin PATH [--inproc] [--workers 1,2,4] [--depth 1000,100000]
//                   [--jobs 1000] [--run-secs 15] [--concurrency 8] [--repeat 3]
//                   [--latency-jobs 200] [--server-pid PID] [--process-every '1 second']
//                   [--lock-limit N] [--polling]
//
// Measured as in tests/src/bench: `depth` jobs queued, a run ends after `jobs` of them or
// `run-secs`; throughput = jobs run ÷ (first start → last finish); idle
// enqueue→start = job start − the moment it was saved, jobs saved one at a time 20 ms apart
// into an idle fleet; requests = commands the workers' drivers sent (command monitoring; the
// driver's own monitoring `hello`s are not commands); CPU from /proc, children included.
// Before the fleets, Agenda's claim query alone (one claimer) gives its own ceiling on this
// server, as disbatch-bench's raw findOneAndUpdate gives ours.
//
// `--lock-limit` (default: the concurrency) caps the jobs a worker locks ahead of running them.
// Agenda's own default, 0, means no cap: a worker then locks its whole backlog one
// findOneAndUpdate at a time before it runs any (on this server, 1 000 queued jobs ran none in
// 15 s), so the default would measure Agenda at its worst rather than as deployed.

import { fork, execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { MongoClient, ObjectId } from 'mongodb';
import { Agenda } from 'agenda';
import { MongoBackend, MongoChangeStreamNotificationChannel } from '@agendajs/mongo-backend';

const JOB = 'noop';

function args(argv) {
  const out = {
    workers: [1, 2, 4],
    depth: [1000],
    jobs: 1000,
    runSecs: 15,
    concurrency: 8,
    latencyJobs: 200,
    repeat: 3,
  };
  let lockLimit;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = () => {
      const x = argv[++i];
      if (x === undefined) throw new Error(`${a} needs a value`);
      return x;
    };
    if (a === '--uri') out.uri = v();
    else if (a === '--workers') out.workers = v().split(',').map(Number);
    else if (a === '--jobs') out.jobs = Number(v());
    else if (a === '--depth') out.depth = v().split(',').map(Number);
    else if (a === '--run-secs') out.runSecs = Number(v());
    else if (a === '--concurrency') out.concurrency = Number(v());
    else if (a === '--plugin') out.plugin = v();
    else if (a === '--inproc') out.inproc = true;
    else if (a === '--polling') out.polling = true;
    else if (a === '--server-pid') out.serverPid = Number(v());
    else if (a === '--latency-jobs') out.latencyJobs = Number(v());
    else if (a === '--repeat') out.repeat = Number(v());
    else if (a === '--process-every') out.processEvery = v();
    else if (a === '--lock-limit') lockLimit = Number(v());
    else if (a === '--worker') out.worker = true;
    else if (a === '--db') out.db = v();
    else throw new Error(`unknown argument ${a}`);
  }
  out.lockLimit = lockLimit ?? out.concurrency;
  if (!Number.isInteger(out.lockLimit) || out.lockLimit < 0) {
    throw new Error(`--lock-limit: not a non-negative integer: ${out.lockLimit}`);
  }
  if (!out.uri) throw new Error('--uri is required');
  if (!out.inproc && !out.plugin && !out.worker) throw new Error('--plugin or --inproc is required');
  const counts = [...out.workers, ...out.depth, out.jobs, out.runSecs, out.concurrency];
  for (const n of [...counts, out.latencyJobs, out.repeat]) {
    if (!Number.isInteger(n) || n < 1) throw new Error(`not a positive integer: ${n}`);
  }
  return out;
}

// ---- worker: one Agenda process ----------------------------------------------------------

async function worker(opt) {
  const client = new MongoClient(opt.uri, { monitorCommands: true, appName: 'agenda-worker' });
  let requests = 0;
  // Per command: how many, and the driver's round-trip time, to show where a job's cost goes.
  const byCommand = {};
  const entry = (name) => (byCommand[name] ??= { n: 0, ms: 0 });
  client.on('commandStarted', (e) => {
    requests++;
    entry(e.commandName).n++;
  });
  client.on('commandSucceeded', (e) => (entry(e.commandName).ms += e.duration));
  client.on('commandFailed', (e) => (entry(e.commandName).ms += e.duration));
  await client.connect();
  const db = client.db(opt.db);
  const agenda = new Agenda({
    backend: new MongoBackend({ mongo: db }),
    // Change-stream wake-ups, as our DENs use; --polling is Agenda's default (processEvery).
    notificationChannel: opt.polling ? undefined : new MongoChangeStreamNotificationChannel({ db }),
    processEvery: opt.processEvery ?? '1 second',
    maxConcurrency: opt.concurrency,
    defaultConcurrency: opt.concurrency,
    lockLimit: opt.lockLimit,
    defaultLockLimit: opt.lockLimit,
  });
  // The coordinator is gone (it failed or was killed): nobody is left to measure.
  process.on('disconnect', () => process.exit(1));
  let events = [];
  const flush = () => {
    if (events.length && process.connected) process.send({ events });
    events = [];
  };
  setInterval(flush, 50).unref();
  agenda.define(
    JOB,
    async (job) => {
      const start = Date.now();
      if (!opt.inproc) {
        await new Promise((resolve, reject) =>
          execFile(opt.plugin, [], (e) => (e ? reject(e) : resolve())),
        );
      }
      events.push({ saved: job.attrs.data.saved, start, end: Date.now() });
    },
    { concurrency: opt.concurrency, lockLimit: opt.lockLimit },
  );
  process.on('message', async (m) => {
    if (m === 'requests') process.send({ requests, byCommand });
    if (m === 'stop') {
      // Claims still in flight fail once the client closes; the worker is leaving anyway.
      process.on('uncaughtException', () => process.exit(0));
      process.on('unhandledRejection', () => process.exit(0));
      flush();
      await agenda.stop();
      await client.close();
      process.exit(0);
    }
  });
  await agenda.start();
  process.send({ ready: true });
}

// ---- coordinator ---------------------------------------------------------------------------

const ticks = 100; // USER_HZ on Linux
function cpuMs(pid) {
  // utime stime cutime cstime: fields 14-17, after the parenthesised command name.
  const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
  return ((Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) * 1000) / ticks;
}
function hwmMiB(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmHWM:\s+(\d+) kB/);
  return m ? Number(m[1]) / 1024 : NaN;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : NaN;
};
const median = (xs) => pct(xs, 50);

// Workers still running: a failed run must not leave them polling the server.
const liveWorkers = new Set();

async function startFleet(opt, dbName, n) {
  const me = fileURLToPath(import.meta.url);
  const events = [];
  const workers = [];
  for (let i = 0; i < n; i++) {
    const a = ['--worker', '--uri', opt.uri, '--db', dbName, '--concurrency', String(opt.concurrency)];
    a.push('--lock-limit', String(opt.lockLimit));
    if (opt.inproc) a.push('--inproc');
    if (opt.polling) a.push('--polling');
    else a.push('--plugin', opt.plugin);
    if (opt.processEvery) a.push('--process-every', opt.processEvery);
    const child = fork(me, a, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    liveWorkers.add(child);
    child.on('exit', () => liveWorkers.delete(child));
    const ready = new Promise((resolve, reject) => {
      child.on('message', (m) => {
        if (m.ready) resolve();
        if (m.events) events.push(...m.events);
      });
      child.on('exit', (code) => reject(new Error(`worker exited ${code}`)));
    });
    workers.push({ child, ready });
  }
  await Promise.all(workers.map((w) => w.ready));
  const requests = () =>
    Promise.all(
      workers.map(
        (w) =>
          new Promise((resolve) => {
            const on = (m) => {
              if (m.requests !== undefined) {
                w.child.off('message', on);
                resolve(m);
              }
            };
            w.child.on('message', on);
            w.child.send('requests');
          }),
      ),
    ).then((xs) => {
      const by = {};
      for (const x of xs) {
        for (const [k, v] of Object.entries(x.byCommand)) {
          by[k] ??= { n: 0, ms: 0 };
          by[k].n += v.n;
          by[k].ms += v.ms;
        }
      }
      return { total: xs.reduce((a, x) => a + x.requests, 0), by };
    });
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
  return { events, requests, cpu, stop };
}

// Resolves once `n` jobs ran, or at `deadline` (ms since the epoch) with however many did.
async function waitFor(events, n, deadline) {
  while (events.length < n && Date.now() < deadline) await sleep(20);
}

// An empty database of its own for one measurement, and an Agenda that saves jobs into it
// without processing any.
async function freshDatabase(client, dbName) {
  const db = client.db(dbName);
  await db.dropDatabase();
  const saver = new Agenda({ backend: new MongoBackend({ mongo: db }) });
  saver.define(JOB, async () => {});
  await saver.ready;
  return { db, saver };
}

// Queues `depth` jobs as Agenda stores them: one saved by Agenda itself, the rest copies of
// its document (Agenda saves one insert at a time; copies keep a 100 000-deep queue quick).
async function enqueue(db, saver, depth, saved) {
  const first = await saver.now(JOB, { saved });
  const doc = await db.collection('agendaJobs').findOne({ _id: new ObjectId(String(first.attrs._id)) });
  if (!doc) throw new Error('the job Agenda saved is not in agendaJobs');
  delete doc._id;
  for (let i = 1; i < depth; i += 10_000) {
    const k = Math.min(10_000, depth - i);
    await db.collection('agendaJobs').insertMany(Array.from({ length: k }, () => ({ ...doc })));
  }
}

// Throughput from a backlog of `depth`: a run ends after `jobs` jobs or `run-secs`, as ours do.
async function oneRun(opt, client, n, depth, run) {
  const dbName = `peer_agenda_${process.pid}_${n}_${depth}_${run}`;
  const { db, saver } = await freshDatabase(client, dbName);
  await enqueue(db, saver, depth, Date.now());
  const target = Math.min(opt.jobs, depth);
  const serverBefore = opt.serverPid ? cpuMs(opt.serverPid) : NaN;
  const fleet = await startFleet(opt, dbName, n);
  const cpuBefore = fleet.cpu();
  const reqBefore = await fleet.requests();
  await waitFor(fleet.events, target, Date.now() + opt.runSecs * 1000);
  const ran = fleet.events.length;
  const reqAfter = await fleet.requests();
  const cpuAfter = fleet.cpu();
  const serverAfter = opt.serverPid ? cpuMs(opt.serverPid) : NaN;
  // No job in the whole run is a result too (a deep backlog can be that slow): 0 jobs/s, and
  // the per-job figures are then null.
  const first = Math.min(...fleet.events.map((e) => e.start));
  const last = Math.max(...fleet.events.map((e) => e.end));
  const result = {
    tasks_run: ran,
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
  result.worker_peak_rss_mib = await fleet.stop();
  await saver.stop();
  await db.dropDatabase();
  return result;
}

// An idle fleet on an empty queue: its own cost over 10 s, then `latency-jobs` jobs saved one
// at a time, 20 ms apart (enqueue→start). Its own database, so no backlog a throughput run
// left behind is counted as latency.
async function idleRun(opt, client, n) {
  const dbName = `peer_agenda_${process.pid}_${n}_idle`;
  const { db, saver } = await freshDatabase(client, dbName);
  const fleet = await startFleet(opt, dbName, n);
  await sleep(1000);
  const idleCpu0 = fleet.cpu();
  const idleReq0 = await fleet.requests();
  const idleSrv0 = opt.serverPid ? cpuMs(opt.serverPid) : NaN;
  const idleMs = 10_000;
  await sleep(idleMs);
  const result = {
    worker_idle_cpu_pct: ((fleet.cpu() - idleCpu0) / idleMs) * 100,
    idle_requests_per_s: ((await fleet.requests()).total - idleReq0.total) / (idleMs / 1000),
  };
  if (opt.serverPid) result.server_idle_cpu_pct = ((cpuMs(opt.serverPid) - idleSrv0) / idleMs) * 100;
  for (let i = 0; i < opt.latencyJobs; i++) {
    await saver.now(JOB, { saved: Date.now() });
    await sleep(20);
  }
  await waitFor(fleet.events, opt.latencyJobs, Date.now() + 120_000);
  if (fleet.events.length < opt.latencyJobs) throw new Error('idle-fleet jobs did not all run');
  const lat = fleet.events.map((e) => e.start - e.saved);
  result.start_p50_ms = pct(lat, 50);
  result.start_p99_ms = pct(lat, 99);
  await fleet.stop();
  await saver.stop();
  await db.dropDatabase();
  return result;
}

// Agenda's claim alone, its ceiling here: the findOneAndUpdate of
// MongoJobRepository.getNextJobToRun (@agendajs/mongo-backend 4.0.3) with its sort and index,
// one claimer, on a backlog of `depth`, drained up to 1 000 claims or sampled for 5 s.
async function claimAlone(opt, client, depth) {
  const dbName = `peer_agenda_${process.pid}_claim_${depth}`;
  const { db, saver } = await freshDatabase(client, dbName);
  await enqueue(db, saver, depth, Date.now());
  const jobs = db.collection('agendaJobs');
  const sort = { nextRunAt: 1, priority: -1 };
  const times = [];
  const serverBefore = opt.serverPid ? cpuMs(opt.serverPid) : NaN;
  const t0 = Date.now();
  while (times.length < Math.min(depth, 1000) && Date.now() - t0 < 5000) {
    const now = new Date();
    const c0 = performance.now();
    const job = await jobs.findOneAndUpdate(
      {
        name: JOB,
        disabled: { $ne: true },
        $or: [
          { lockedAt: { $eq: null }, nextRunAt: { $lte: now } },
          { lockedAt: { $lte: new Date(now.getTime() - 600_000) } },
        ],
      },
      { $set: { lockedAt: now, lastModifiedBy: null } },
      { returnDocument: 'after', sort },
    );
    if (!job) break;
    times.push(performance.now() - c0);
  }
  const secs = (Date.now() - t0) / 1000;
  const serverAfter = opt.serverPid ? cpuMs(opt.serverPid) : NaN;
  await saver.stop();
  await db.dropDatabase();
  return {
    claims: times.length,
    claims_per_s: times.length / secs,
    p50_ms: pct(times, 50),
    p99_ms: pct(times, 99),
    server_cpu_ms_per_claim: (serverAfter - serverBefore) / times.length,
  };
}

async function coordinator(opt) {
  const client = new MongoClient(opt.uri);
  await client.connect();
  for (const depth of opt.depth) {
    const alone = await claimAlone(opt, client, depth);
    console.log(JSON.stringify({ peer: 'agenda', claim_alone: true, depth, ...alone }));
  }
  for (const n of opt.workers) {
    for (const depth of opt.depth) {
      const runs = [];
      for (let r = 0; r < opt.repeat; r++) runs.push(await oneRun(opt, client, n, depth, r));
      const keys = Object.keys(runs[0]).filter((k) => k !== 'drained' && k !== 'by_command');
      const med = Object.fromEntries(keys.map((k) => [k, median(runs.map((x) => x[k]))]));
      const tput = runs.map((x) => x.tasks_per_s);
      console.log(
        JSON.stringify({
          peer: 'agenda',
          mode: opt.inproc ? 'in-process no-op' : 'no-op plugin per job',
          wakeups: opt.polling ? 'polling' : 'change stream',
          workers: n,
          concurrency: opt.concurrency,
          lock_limit: opt.lockLimit,
          depth,
          runs: opt.repeat,
          drained_runs: runs.filter((x) => x.drained).length,
          tasks_per_s_min: Math.min(...tput),
          tasks_per_s_max: Math.max(...tput),
          ...med,
          by_command_last_run: runs[runs.length - 1].by_command,
        }),
      );
    }
    const idle = await idleRun(opt, client, n);
    console.log(JSON.stringify({ peer: 'agenda', idle_fleet: true, workers: n, ...idle }));
  }
  await client.close();
}

const opt = args(process.argv.slice(2));
(opt.worker ? worker(opt) : coordinator(opt)).catch((e) => {
  console.error(`agenda bench: ${e.stack ?? e}`);
  for (const w of liveWorkers) w.kill('SIGKILL');
  process.exit(1);
});
