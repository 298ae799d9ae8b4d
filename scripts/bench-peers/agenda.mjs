// Agenda (Node.js, MongoDB; the most used MongoDB-backed job queue) run the way
// `disbatch-bench` runs our fleet: N worker processes on one server, M queued no-op jobs,
// each job running the same no-op plugin executable as a child process (as a DEN runs one
// per task), or nothing at all (`--inproc`). Prints one JSON line per configuration. Run it
// through `scripts/bench-peers/run`, which installs the pinned packages.
//
//   node agenda.mjs --uri URI --plugin PATH [--inproc] [--workers 1,2,4] [--depth 1000,100000]
//                   [--jobs 1000] [--run-secs 15] [--concurrency 8] [--repeat 3]
//                   [--latency-jobs 200] [--latency-gap-ms 20] [--server-pid PID] [--lock-limit N]
//                   [--polling]
//
// How each figure is taken: common.mjs. Requests are the commands the workers' drivers sent
// (command monitoring; the driver's own monitoring `hello`s are not commands). Before the
// fleets, Agenda's claim query alone (one claimer) gives its own ceiling on this server, as
// disbatch-bench's raw findOneAndUpdate gives ours.
//
// `--lock-limit` (default: the concurrency) caps the jobs a worker locks ahead of running them.
// Agenda's own default, 0, means no cap: a worker then locks its whole backlog one
// findOneAndUpdate at a time before it runs any (on this server, 1 000 queued jobs ran none in
// 15 s), so the default would measure Agenda at its worst rather than as deployed.
// `--polling` leaves out the change-stream notification channel: Agenda's default wake-ups,
// a scan every second.

import { fileURLToPath } from 'node:url';
import { MongoClient, ObjectId } from 'mongodb';
import { Agenda } from 'agenda';
import { MongoBackend, MongoChangeStreamNotificationChannel } from '@agendajs/mongo-backend';
import { cpuMs, parseArgs, runMain, runMatrix, workerChannel } from './common.mjs';

const JOB = 'noop';

function options(argv) {
  const opt = parseArgs(argv, { '--lock-limit': 'lockLimit', '--polling': true });
  opt.lockLimit = opt.lockLimit === undefined ? opt.concurrency : Number(opt.lockLimit);
  if (!Number.isInteger(opt.lockLimit) || opt.lockLimit < 0) {
    throw new Error(`--lock-limit: not a non-negative integer: ${opt.lockLimit}`);
  }
  return opt;
}

// ---- worker: one Agenda process ------------------------------------------------------------

async function worker(opt) {
  const client = new MongoClient(opt.uri, { monitorCommands: true, appName: 'agenda-worker' });
  let agenda;
  const channel = workerChannel(opt, async () => {
    await agenda.stop();
    await client.close();
  });
  client.on('commandStarted', (e) => channel.count(e.commandName));
  client.on('commandSucceeded', (e) => channel.took(e.commandName, e.duration));
  client.on('commandFailed', (e) => channel.took(e.commandName, e.duration));
  await client.connect();
  const db = client.db(opt.db);
  agenda = new Agenda({
    backend: new MongoBackend({ mongo: db }),
    // Change-stream wake-ups, as our DENs use, unless --polling.
    notificationChannel: opt.polling ? undefined : new MongoChangeStreamNotificationChannel({ db }),
    processEvery: '1 second',
    maxConcurrency: opt.concurrency,
    defaultConcurrency: opt.concurrency,
    lockLimit: opt.lockLimit,
    defaultLockLimit: opt.lockLimit,
  });
  agenda.define(JOB, (job) => channel.job(job.attrs.data.saved), {
    concurrency: opt.concurrency,
    lockLimit: opt.lockLimit,
  });
  await agenda.start();
  channel.ready();
}

// ---- coordinator ---------------------------------------------------------------------------

function workerArgs(opt, dbName) {
  const a = ['--uri', opt.uri, '--db', dbName, '--concurrency', String(opt.concurrency)];
  a.push('--lock-limit', String(opt.lockLimit));
  a.push(...(opt.inproc ? ['--inproc'] : ['--plugin', opt.plugin]));
  if (opt.polling) a.push('--polling');
  return a;
}

// An empty database of its own for one measurement, with an Agenda that saves jobs into it
// without processing any.
async function freshDatabase(client, dbName) {
  const db = client.db(dbName);
  await db.dropDatabase();
  const saver = new Agenda({ backend: new MongoBackend({ mongo: db }) });
  saver.define(JOB, async () => {});
  await saver.ready;
  const jobs = db.collection('agendaJobs');
  return {
    enqueue: (depth) => enqueue(jobs, saver, depth, Date.now()),
    save: (saved) => saver.now(JOB, { saved }),
    claimOnce: () => claimOnce(jobs),
    drop: async () => {
      await saver.stop();
      await db.dropDatabase();
    },
  };
}

// Queues `depth` jobs as Agenda stores them: one saved by Agenda itself, the rest copies of
// its document (Agenda saves one insert at a time; copies keep a 100 000-deep queue quick).
async function enqueue(jobs, saver, depth, saved) {
  const first = await saver.now(JOB, { saved });
  const doc = await jobs.findOne({ _id: new ObjectId(String(first.attrs._id)) });
  if (!doc) throw new Error('the job Agenda saved is not in agendaJobs');
  delete doc._id;
  for (let i = 1; i < depth; i += 10_000) {
    const k = Math.min(10_000, depth - i);
    await jobs.insertMany(Array.from({ length: k }, () => ({ ...doc })));
  }
}

// Agenda's claim, for its ceiling here: the findOneAndUpdate of
// MongoJobRepository.getNextJobToRun (@agendajs/mongo-backend 4.0.3) with its sort and index.
async function claimOnce(jobs) {
  const now = new Date();
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
    { returnDocument: 'after', sort: { nextRunAt: 1, priority: -1 } },
  );
  return job !== null;
}

async function coordinator(opt) {
  const client = new MongoClient(opt.uri);
  await client.connect();
  await runMatrix(opt, {
    name: 'agenda',
    settings: { wakeups: opt.polling ? 'polling' : 'change stream', lock_limit: opt.lockLimit },
    script: fileURLToPath(import.meta.url),
    serverCpu: () => (opt.serverPid ? cpuMs(opt.serverPid) : NaN),
    workerArgs: (dbName) => workerArgs(opt, dbName),
    fresh: (dbName) => freshDatabase(client, dbName),
  });
  await client.close();
}

const opt = options(process.argv.slice(2));
runMain('agenda', () => (opt.worker ? worker(opt) : coordinator(opt)));
