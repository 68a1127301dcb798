// The Node peers for bench/claim.py and bench/latency.py, installed from npm by
// `npm ci --prefix bench/node` (node_modules is not committed).
//
//   node peers.mjs setup  graphile|pgboss URL
//   node peers.mjs drain  graphile|pgboss URL JOBS MODE   -> one JSON line {count, first, last}
//   node peers.mjs serve  graphile|pgboss URL [POLL_MS]   -> READY, then "START <time>" per job
//
// drain: enqueue JOBS no-op jobs in bulk (not timed), then work them; `first` is the wall-clock
// start of the first job, `last` the end of the last one. MODE is the peer's one-at-a-time or
// batched configuration, as each documents it.
import { run, runMigrations, makeWorkerUtils } from "graphile-worker";
import PgBoss from "pg-boss";

const [action, peer, url, ...rest] = process.argv.slice(2);
const now = () => (performance.timeOrigin + performance.now()) / 1000;
const quiet = { scope: () => quiet, error: () => {}, warn: () => {}, info: () => {}, debug: () => {} };

function marks() {
  return {
    count: 0,
    first: 0,
    last: 0,
    started() { if (!this.count) this.first = now(); },
    ended() { this.count += 1; this.last = now(); },
  };
}

async function graphile() {
  const { Logger } = await import("graphile-worker");
  const logger = new Logger(() => () => {});
  if (action === "setup") {
    await runMigrations({ connectionString: url, logger });
    return;
  }
  if (action === "serve") {
    const pollInterval = Number(rest[0] ?? 2000);
    const runner = await run({
      connectionString: url, concurrency: 1, pollInterval, noHandleSignals: false, logger,
      taskList: { noop: async () => { console.log(`START ${now().toFixed(6)}`); } },
    });
    console.log("READY");
    await runner.promise;
    return;
  }
  const jobs = Number(rest[0]);
  const mode = rest[1];
  const utils = await makeWorkerUtils({ connectionString: url, logger });
  for (let start = 0; start < jobs; start += 1000) {
    const specs = [];
    for (let i = start; i < Math.min(start + 1000, jobs); i++) specs.push({ identifier: "noop", payload: { seq: i } });
    await utils.addJobs(specs);
  }
  await utils.release();
  const m = marks();
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  // single: one worker, one job at a time (its default fetch per job, complete per job).
  // batch: its documented batching, a local queue and batched completions.
  const worker = mode === "batch"
    ? { localQueue: { size: 100 }, completeJobBatchDelay: 0 }
    : {};
  const runner = await run({
    preset: { worker: { connectionString: url, concurrentJobs: 1, pollInterval: 2000, ...worker } },
    noHandleSignals: true,
    logger,
    taskList: {
      noop: async () => {
        m.started();
        m.ended();
        if (m.count === jobs) done();
      },
    },
  });
  await finished;
  await runner.stop();
  console.log(JSON.stringify({ count: m.count, first: m.first, last: m.last }));
}

async function pgboss() {
  const boss = new PgBoss({ connectionString: url, supervise: false, schedule: false, max: 4 });
  boss.on("error", (err) => console.error(err.message));
  await boss.start();
  if (action === "setup") {
    await boss.createQueue("noop");
    await boss.stop({ graceful: false, wait: true });
    return;
  }
  if (action === "serve") {
    const pollingIntervalSeconds = Number(rest[0] ?? 2000) / 1000;
    await boss.work("noop", { batchSize: 1, pollingIntervalSeconds }, async () => {
      console.log(`START ${now().toFixed(6)}`);
    });
    console.log("READY");
    await new Promise((resolve) => process.on("SIGTERM", resolve));
    await boss.stop({ graceful: false, wait: true });
    return;
  }
  const jobs = Number(rest[0]);
  const mode = rest[1];
  for (let start = 0; start < jobs; start += 1000) {
    const batch = [];
    for (let i = start; i < Math.min(start + 1000, jobs); i++) batch.push({ name: "noop", data: { seq: i } });
    await boss.insert(batch);
  }
  const m = marks();
  if (mode === "work") {
    // work() as documented for throughput: batches, polled at its minimum interval (0.5 s).
    let done;
    const finished = new Promise((resolve) => { done = resolve; });
    await boss.work("noop", { batchSize: 100, pollingIntervalSeconds: 0.5 }, async (batch) => {
      m.started();
      for (let i = 0; i < batch.length; i++) m.ended();
      if (m.count >= jobs) done();
    });
    await finished;
  } else {
    // fetch() then complete(): one job (single) or a batch of 100 (batch) per round.
    const batchSize = mode === "batch" ? 100 : 1;
    for (;;) {
      const batch = await boss.fetch("noop", { batchSize });
      if (!batch || batch.length === 0) break;
      m.started();
      for (let i = 0; i < batch.length; i++) m.ended();
      await boss.complete("noop", batch.map((j) => j.id));
    }
  }
  await boss.stop({ graceful: false, wait: true });
  console.log(JSON.stringify({ count: m.count, first: m.first, last: m.last }));
}

await (peer === "graphile" ? graphile() : pgboss());
process.exit(0);
