// pg-boss (Node.js, PostgreSQL; the most used PostgreSQL-backed job queue on npm) run the way
// `disbatch-bench` runs our fleet: N worker processes on a local PostgreSQL, M queued no-op
// jobs, each running the same no-op plugin executable as a child process (as a DEN runs one
// per task), or nothing at all (`--inproc`). Prints one JSON line per configuration. Run it
// through `scripts/bench-peers/run pgboss`, which installs the pinned packages and starts the
// PostgreSQL server.
//
//   node pgboss.mjs --uri postgres://... --plugin PATH [--inproc] [--workers 1,2,4]
//                   [--depth 1000,100000] [--jobs 1000] [--run-secs 15] [--concurrency 8]
//                   [--repeat 3] [--latency-jobs 200] [--latency-gap-ms 20] [--server-pid POSTMASTER_PID]
//                   [--polling-secs 0.5] [--no-analyze]
//
// How each figure is taken: common.mjs. Requests are the SQL statements pg-boss sent. A
// worker's concurrency is `concurrency` pg-boss workers (`work()` calls) of batch size 1, each
// fetching its next job as soon as it finished one and polling every `--polling-secs` (default
// 0.5, pg-boss's minimum and fastest; its default is 2) when the queue is empty: pg-boss
// wakes no worker across processes. The server's CPU is the postmaster's and its backends'.
// A pg-boss 10 work() loop waits out the rest of its polling interval after every fetch, jobs
// or not, so a worker runs at most concurrency ÷ polling interval jobs a second (16 with the
// defaults here): raising that means more loops or bigger batches, i.e. more jobs at once.
// Before the fleets, pg-boss's fetch alone (one claimer) gives its ceiling on this server.

import { fileURLToPath } from 'node:url';
import PgBoss from 'pg-boss';
import pg from 'pg';
import { parseArgs, runMain, runMatrix, treeCpuMs, workerChannel } from './common.mjs';

const QUEUE = 'noop';

function options(argv) {
  const opt = parseArgs(argv, { '--polling-secs': 'pollingSecs', '--no-analyze': true });
  opt.pollingSecs = opt.pollingSecs === undefined ? 0.5 : Number(opt.pollingSecs);
  if (!(opt.pollingSecs >= 0.5)) throw new Error(`--polling-secs: at least 0.5 (pg-boss's minimum)`);
  return opt;
}

// A statement's kind, for the per-command split: pg-boss's statements are long CTEs.
function kind(text) {
  if (/SKIP LOCKED/i.test(text)) return 'fetch';
  if (/'completed'/.test(text)) return 'complete';
  return (text.trim().match(/^\w+/)?.[0] ?? '?').toLowerCase();
}

function newBoss(opt, schema, extra = {}) {
  return new PgBoss({ connectionString: opt.uri, schema, ...extra });
}

// ---- worker: one pg-boss process -----------------------------------------------------------

async function worker(opt) {
  const boss = newBoss(opt, opt.db, { max: opt.concurrency + 2 });
  const channel = workerChannel(opt, () => boss.stop({ graceful: true, wait: true, timeout: 5000 }));
  const db = boss.getDb();
  const executeSql = db.executeSql.bind(db);
  db.executeSql = async (text, values) => {
    const what = kind(text);
    channel.count(what);
    const t0 = performance.now();
    try {
      return await executeSql(text, values);
    } finally {
      channel.took(what, performance.now() - t0);
    }
  };
  boss.on('error', (e) => console.error(`pg-boss worker: ${e.message ?? e}`));
  await boss.start();
  for (let i = 0; i < opt.concurrency; i++) {
    const options = { batchSize: 1, pollingIntervalSeconds: opt.pollingSecs };
    await boss.work(QUEUE, options, ([job]) => channel.job(job.data.saved));
  }
  channel.ready();
}

// ---- coordinator ---------------------------------------------------------------------------

function workerArgs(opt, schema) {
  const a = ['--uri', opt.uri, '--db', schema, '--concurrency', String(opt.concurrency)];
  a.push('--polling-secs', String(opt.pollingSecs));
  a.push(...(opt.inproc ? ['--inproc'] : ['--plugin', opt.plugin]));
  return a;
}

// A schema of its own for one measurement, with pg-boss's tables and the queue, and a pg-boss
// that sends jobs into it without working any.
async function freshSchema(opt, pool, schema) {
  await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  const saver = newBoss(opt, schema, { supervise: false, schedule: false });
  saver.on('error', (e) => console.error(`pg-boss saver: ${e.message ?? e}`));
  await saver.start();
  await saver.createQueue(QUEUE);
  return {
    enqueue: (depth) => enqueue(opt, pool, schema, saver, depth, Date.now()),
    save: (saved) => saver.send(QUEUE, { saved }),
    // pg-boss's fetch: its SKIP LOCKED claim of one job.
    claimOnce: async () => (await saver.fetch(QUEUE, { batchSize: 1 })).length > 0,
    drop: async () => {
      await saver.stop({ graceful: false, wait: true });
      await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    },
  };
}

// Queues `depth` jobs in batches, then has PostgreSQL gather the job table's statistics, as
// autovacuum would within its first minute (unless --no-analyze), so pg-boss is not measured
// on a plan made without any. (At 100 000 queued its fetch took 241 ms a claim without them and
// 263 ms with them: they are not what makes it slow there.)
async function enqueue(opt, pool, schema, saver, depth, saved) {
  for (let i = 0; i < depth; i += 10_000) {
    const k = Math.min(10_000, depth - i);
    await saver.insert(Array.from({ length: k }, () => ({ name: QUEUE, data: { saved } })));
  }
  if (!opt.noAnalyze) await pool.query(`ANALYZE ${schema}.job`);
}

async function coordinator(opt) {
  const pool = new pg.Pool({ connectionString: opt.uri, max: 2 });
  await runMatrix(opt, {
    name: 'pg-boss',
    settings: { polling_secs: opt.pollingSecs, analyzed: !opt.noAnalyze },
    script: fileURLToPath(import.meta.url),
    serverCpu: () => (opt.serverPid ? treeCpuMs(opt.serverPid) : NaN),
    workerArgs: (schema) => workerArgs(opt, schema),
    fresh: (schema) => freshSchema(opt, pool, schema),
  });
  await pool.end();
}

const opt = options(process.argv.slice(2));
runMain('pg-boss', () => (opt.worker ? worker(opt) : coordinator(opt)));
