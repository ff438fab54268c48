//! Throughput of a semantic SQL query on a Ballista cluster on this machine: one scheduler and 1, 2, ... executor
//! processes (`stretto scheduler`, `stretto executor`), against the same query in one process.
//!
//! The input is the first `rows` bundled reviews in `files` Parquet files (one partition each). The client
//! certifies the pipeline once per run (its memo makes later certifications cheap, and they are reported apart);
//! every executor starts with an empty memo, so its operators really run. All parties share one KV directory (the
//! production layout: a shared store), which the single-process run, first, fills (a cluster's client prefills only
//! the tuples it profiles), so execution pays question passes, not prefill.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The query every run executes.
pub const QUERY: &str = "SELECT reviewid, sem_map('The movie title named in {reviews.reviewtext}') AS title \
                         FROM reviews WHERE sem_filter('{reviews.reviewtext} is clearly positive')";

/// What can go wrong.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct ClusterBench {
    /// The `stretto` binary (its `scheduler` and `executor` subcommands start the cluster).
    pub stretto: PathBuf,
    /// Model home of every party.
    pub model_home: PathBuf,
    /// Reviews queried.
    pub rows: usize,
    /// Parquet files (partitions) they are split into.
    pub files: usize,
    /// Executor counts to measure, in order.
    pub executors: Vec<usize>,
    /// Decoder ladder.
    pub ladder: Vec<String>,
    /// Work folder (input, stores, logs).
    pub work: PathBuf,
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Measure {
    /// `single process` or `N executors`.
    pub setup: String,
    /// Executors (0: the single-process run).
    pub executors: usize,
    /// Rows returned.
    pub rows_out: usize,
    /// Seconds of the whole query, as the client saw it.
    pub total_seconds: f64,
    /// Seconds the client spent certifying (computing the input, KV caches, profiling, optimizing).
    pub certification_seconds: f64,
    /// `total - certification`: executing the certified cascade.
    pub execution_seconds: f64,
    /// Tuples whose first-stage answer was not known before execution: in one process, those profiling had not
    /// paid for (its memo holds the others); on a cluster, those whose answer did not travel with the plan
    /// (executors start with empty memos).
    pub executed_tuples: usize,
    /// `executed_tuples` per second of execution.
    pub tuples_per_second: f64,
    /// Cascade tasks each executor ran (from their task logs).
    pub tasks_per_executor: Vec<usize>,
    /// The certified plan's stages.
    pub plan: String,
}

fn plan_of(r: &stretto_sql::SqlResult) -> String {
    r.pipelines()
        .iter()
        .filter_map(|p| p.plan.as_ref())
        .map(|p| p.stages.iter().map(|s| s.physical.as_str()).collect::<Vec<_>>().join(" → "))
        .collect::<Vec<_>>()
        .join("; ")
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16, Error> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) -> Result<(), Error> {
    let t0 = Instant::now();
    while !ready() {
        if t0.elapsed() > Duration::from_secs(120) {
            return Err(format!("timed out waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

fn certification_seconds(r: &stretto_sql::SqlResult) -> f64 {
    r.pipelines().iter().flat_map(|p| p.timings.iter()).filter(|(k, _)| k.as_str() != "execution").map(|(_, v)| v).sum()
}

fn session(b: &ClusterBench, memo: &Path) -> Result<stretto::Session, Error> {
    Ok(stretto::Session::builder(b.model_home.clone())
        .kv_dir(b.work.join("kv"))
        .memo_dir(memo)
        .ladder(b.ladder.clone())
        .models(std::iter::once("minilm".to_string()).chain(b.ladder.iter().cloned()))
        .progress(false)
        // Every configuration certifies through the client's memo, which the first one fills: the later ones must
        // price profiling as the first did, or they could choose another plan than the one the summary prints.
        .price_memo_hits(true)
        .build()?)
}

/// Writes the input and returns (the folder of parts, the one-file copy).
fn write_input(b: &ClusterBench, session: &stretto::Session) -> Result<(PathBuf, PathBuf), Error> {
    let ctx = stretto_sql::SqlContext::new(session)?;
    let batch = ctx
        .sql(&format!("SELECT reviewid, reviewtext FROM movie.reviews ORDER BY reviewid LIMIT {}", b.rows))?
        .collect()?
        .batch()?;
    let parts = b.work.join("reviews");
    if parts.exists() {
        std::fs::remove_dir_all(&parts)?;
    }
    std::fs::create_dir_all(&parts)?;
    let n = batch.num_rows();
    let per = n.div_ceil(b.files.max(1));
    for (i, start) in (0..n).step_by(per.max(1)).enumerate() {
        let path = parts.join(format!("part-{i:03}.parquet"));
        stretto::io::write(&batch.slice(start, per.min(n - start)), &path, stretto::FileFormat::Parquet)?;
    }
    let all = b.work.join("all.parquet");
    stretto::io::write(&batch, &all, stretto::FileFormat::Parquet)?;
    Ok((parts, all))
}

/// Runs every configuration and returns the measures, the single-process run first.
pub fn run(b: &ClusterBench) -> Result<Vec<Measure>, Error> {
    std::fs::create_dir_all(&b.work)?;
    let client = session(b, &b.work.join("memo-client"))?;
    let (parts, all) = write_input(b, &client)?;
    let mut out = Vec::new();

    // One process, with an empty memo of its own for execution (certification answers memoised apart).
    {
        let memo = b.work.join("memo-single");
        let _ = std::fs::remove_dir_all(&memo);
        let local = stretto_sql::SqlContext::new(&session(b, &memo)?)?;
        local.register_file("reviews", &all)?;
        let t0 = Instant::now();
        let r = local.sql(QUERY)?.collect()?;
        let total = t0.elapsed().as_secs_f64();
        let exec = r.pipelines().iter().filter_map(|p| p.timings.get("execution")).sum::<f64>();
        // The tuples whose first stage's answer profiling had not paid for (execution reads those from the memo).
        let executed = b
            .rows
            .saturating_sub(r.pipelines().iter().filter_map(|p| p.stages.first()).map(|s| s.reused).sum::<usize>());
        out.push(Measure {
            setup: "single process".into(),
            executors: 0,
            rows_out: r.num_rows(),
            total_seconds: total,
            certification_seconds: total - exec,
            execution_seconds: exec,
            executed_tuples: executed,
            tuples_per_second: executed as f64 / exec.max(1e-9),
            tasks_per_executor: vec![],
            plan: plan_of(&r),
        });
        eprintln!("single process: {:.1} s in all, {exec:.1} s executing", total);
    }

    for &n in &b.executors {
        let run_dir = b.work.join(format!("cluster-{n}"));
        let _ = std::fs::remove_dir_all(&run_dir);
        std::fs::create_dir_all(&run_dir)?;
        let port = free_port()?;
        let scheduler = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(run_dir.join("scheduler.log"))?;
        let _s = Proc(
            Command::new(&b.stretto)
                .args(["scheduler", "--port", &port.to_string()])
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        );
        wait_for("the scheduler", || std::net::TcpStream::connect(&scheduler).is_ok())?;
        let mut executors = Vec::new();
        for i in 0..n {
            let work = run_dir.join(format!("executor-{i}"));
            std::fs::create_dir_all(&work)?;
            let log_path = run_dir.join(format!("executor-{i}.log"));
            let log = std::fs::File::create(&log_path)?;
            let child = Command::new(&b.stretto)
                .arg("executor")
                .args(["--scheduler", &scheduler, "--id", &format!("executor-{i}")])
                .args(["--port", &free_port()?.to_string(), "--grpc-port", &free_port()?.to_string()])
                .arg("--work-dir")
                .arg(&work)
                .arg("--model-home")
                .arg(&b.model_home)
                .arg("--kv-dir")
                .arg(b.work.join("kv"))
                .arg("--memo-dir")
                .arg(work.join("memo"))
                .args(["--ladder", &b.ladder.join(","), "--models", &format!("minilm,{}", b.ladder.join(","))])
                // The bench waits for the executor's "Connected to scheduler" line.
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?;
            executors.push((Proc(child), work, log_path));
        }
        for (_, _, log) in &executors {
            wait_for("an executor to connect", || {
                std::fs::read_to_string(log).map(|t| t.contains("Connected to scheduler")).unwrap_or(false)
            })?;
        }
        std::thread::sleep(Duration::from_secs(1));
        let ctx = stretto_ballista::ClusterContext::connect(&client, &scheduler)?;
        ctx.register_file("reviews", &parts)?;
        // One partition per file.
        ctx.sql(&format!("SET datafusion.execution.target_partitions = {}", b.files.max(1)))?;
        let t0 = Instant::now();
        let r = ctx.sql(QUERY)?;
        let total = t0.elapsed().as_secs_f64();
        let cert = certification_seconds(&r);
        let tasks: Vec<usize> = executors
            .iter()
            .map(|(_, w, _)| {
                std::fs::read_to_string(w.join("stretto-tasks.jsonl")).map(|t| t.lines().count()).unwrap_or(0)
            })
            .collect();
        let exec = total - cert;
        // The tuples whose first stage's answer did not travel with the plan.
        let executed = b.rows.saturating_sub(
            r.pipelines()
                .iter()
                .filter_map(|p| p.shipped_answers.get(&p.plan.as_ref()?.stages.first()?.physical))
                .sum::<usize>(),
        );
        eprintln!(
            "{n} executor(s): {total:.1} s in all, {cert:.1} s certifying, {exec:.1} s executing, tasks {tasks:?}"
        );
        out.push(Measure {
            setup: format!("{n} executor{}", if n == 1 { "" } else { "s" }),
            executors: n,
            rows_out: r.num_rows(),
            total_seconds: total,
            certification_seconds: cert,
            execution_seconds: exec,
            executed_tuples: executed,
            tuples_per_second: executed as f64 / exec.max(1e-9),
            tasks_per_executor: tasks,
            plan: plan_of(&r),
        });
    }
    Ok(out)
}

/// The measures as a Markdown table.
pub fn summary(b: &ClusterBench, measures: &[Measure]) -> String {
    let mut s = format!(
        "# Cluster throughput on this machine\n\n`stretto bench cluster --rows {} --files {} --executors {}` (ladder {}); \
         query:\n\n```sql\n{QUERY}\n```\n\n",
        b.rows,
        b.files,
        b.executors.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(","),
        b.ladder.join(", ")
    );
    if let Some(m) = measures.first() {
        s.push_str(&format!("Certified plan: `{}`. ", m.plan));
    }
    s.push_str(
        "One process runs its models with ONNX Runtime's default threads; an executor with one thread (`stretto \
         executor --threads 1`, the default: one executor per core). Every executor loads its models on its first \
         task, inside the execution time. Executed tuples: those whose first-stage answer was not known before \
         execution (one process memoised what profiling paid for; the client sends the executors the answers it \
         knows with the plan).\n\n\
         | setup | rows out | total s | certification s | execution s | executed tuples | tuples/s executing | tasks per executor |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for m in measures {
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {} | {:.2} | {} |\n",
            m.setup,
            m.rows_out,
            m.total_seconds,
            m.certification_seconds,
            m.execution_seconds,
            m.executed_tuples,
            m.tuples_per_second,
            if m.tasks_per_executor.is_empty() {
                "-".to_string()
            } else {
                m.tasks_per_executor.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" / ")
            }
        ));
    }
    s
}
