//! A real cluster on loopback: a `stretto-scheduler` and two `stretto-executor` processes. A semantic SQL query
//! with a filter and a map over a four-file (four-partition) input returns exactly the rows of the single-process
//! run, the executors never compute an answer the client's profiling paid for, both executors run cascade tasks, a
//! `LIMIT` is certified for and stops the partitions early, and an executor killed mid-query gives an error or a
//! complete result, never a partial one.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::DataType;
use stretto::Session;
use stretto_ballista::ClusterContext;
use stretto_sql::{SqlContext, SqlResult};

const ROWS: usize = 32;
const FILES: usize = 4;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A child process killed when the test ends, whatever happens.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(bin: &str, args: &[String], log: &Path) -> Proc {
    let log = std::fs::File::create(log).unwrap();
    let child = Command::new(bin)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    Proc(child)
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ready() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

struct Cluster {
    scheduler: String,
    executors: Vec<(Proc, PathBuf)>,
    _scheduler: Proc,
}

fn start_cluster(dir: &Path) -> Cluster {
    let port = free_port();
    let scheduler = format!("127.0.0.1:{port}");
    let s = spawn(
        env!("CARGO_BIN_EXE_stretto-scheduler"),
        &[
            "--port".into(),
            port.to_string(),
            "--executor-timeout-seconds".into(),
            "6".into(),
            "--expire-dead-executor-interval-seconds".into(),
            "2".into(),
        ],
        &dir.join("scheduler.log"),
    );
    wait_for("the scheduler's port", Duration::from_secs(60), || std::net::TcpStream::connect(&scheduler).is_ok());
    let home = stretto::core::context::default_home();
    let mut executors = Vec::new();
    for i in 0..2 {
        let work = dir.join(format!("executor-{i}"));
        std::fs::create_dir_all(&work).unwrap();
        let args: Vec<String> = [
            "--scheduler",
            &scheduler,
            "--port",
            &free_port().to_string(),
            "--grpc-port",
            &free_port().to_string(),
            "--id",
            &format!("executor-{i}"),
            "--heartbeat-seconds",
            "2",
            "--work-dir",
            work.to_str().unwrap(),
            "--model-home",
            home.to_str().unwrap(),
            "--kv-dir",
            work.join("kv").to_str().unwrap(),
            "--memo-dir",
            work.join("memo").to_str().unwrap(),
            "--ladder",
            "smollm2-135m",
            "--models",
            "smollm2-135m,minilm",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = dir.join(format!("executor-{i}.log"));
        executors.push((spawn(env!("CARGO_BIN_EXE_stretto-executor"), &args, &log), work));
    }
    Cluster { scheduler, executors, _scheduler: s }
}

/// Lines of an executor's task log.
fn tasks(work: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(work.join("stretto-tasks.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The items whose KV caches are under `dir`: the distinct names of its `.safetensors` records (an item's name is
/// the hash of its text, the same in every compression profile's folder).
fn kv_items(dir: &Path) -> std::collections::HashSet<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Default::default() };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .flat_map(|p| {
            if p.is_dir() {
                kv_items(&p)
            } else if p.extension().is_some_and(|e| e == "safetensors") {
                p.file_stem().map(|s| s.to_string_lossy().into_owned()).into_iter().collect()
            } else {
                Default::default()
            }
        })
        .collect()
}

/// A client session whose KV caches and memo are in `dir`.
fn session_in(dir: &Path) -> Session {
    Session::builder(stretto::core::context::default_home())
        .kv_dir(dir.join("kv"))
        .memo_dir(dir.join("memo"))
        .ladder(["smollm2-135m"])
        .models(["smollm2-135m", "minilm"])
        .progress(false)
        .build()
        .expect("session builds")
}

/// The keys of every answer the memo files in `dir` hold.
fn memo_keys(dir: &Path) -> std::collections::HashSet<String> {
    let Ok(files) = std::fs::read_dir(dir) else { return Default::default() };
    files
        .filter_map(|f| f.ok().map(|f| f.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl") && !p.ends_with(stretto::core::memo::COSTS_FILE))
        .flat_map(|p| std::fs::read_to_string(p).unwrap().lines().map(str::to_string).collect::<Vec<_>>())
        .map(|l| serde_json::from_str::<serde_json::Value>(&l).unwrap()["key"].as_str().unwrap().to_string())
        .collect()
}

/// The first `ROWS` bundled reviews as `FILES` Parquet files (one partition each) and as one file.
fn write_input(session: &Session, dir: &Path) -> (PathBuf, PathBuf) {
    let ctx = SqlContext::new(session).unwrap();
    let batch = ctx
        .sql(&format!("SELECT reviewid, reviewtext FROM movie.reviews ORDER BY reviewid LIMIT {ROWS}"))
        .unwrap()
        .collect()
        .unwrap()
        .batch()
        .unwrap();
    let parts = dir.join("reviews");
    std::fs::create_dir_all(&parts).unwrap();
    let per = ROWS / FILES;
    for i in 0..FILES {
        let path = parts.join(format!("part-{i}.parquet"));
        stretto::io::write(&batch.slice(i * per, per), &path, stretto::FileFormat::Parquet).unwrap();
    }
    let all = dir.join("all.parquet");
    stretto::io::write(&batch, &all, stretto::FileFormat::Parquet).unwrap();
    (parts, all)
}

/// The rows as sorted text lines.
fn rows(r: &SqlResult) -> Vec<String> {
    let b: RecordBatch = r.batch().unwrap();
    let mut out: Vec<String> = (0..b.num_rows())
        .map(|i| {
            b.columns()
                .iter()
                .map(|c| {
                    let c = arrow::compute::cast(c, &DataType::Utf8).unwrap();
                    let c = c.as_string::<i32>();
                    if c.is_valid(i) {
                        c.value(i).to_string()
                    } else {
                        String::new()
                    }
                })
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .collect();
    out.sort();
    out
}

const QUERY: &str = "SELECT reviewid, sem_map('The movie title named in {reviews.reviewtext}') AS title \
                     FROM reviews WHERE sem_filter('{reviews.reviewtext} is clearly positive')";

const LIMITED: &str =
    "SELECT reviewid FROM reviews WHERE sem_filter('{reviews.reviewtext} is clearly positive') LIMIT 2";

#[test]
fn a_cluster_runs_the_certified_pipeline_on_every_partition_and_never_returns_a_partial_result() {
    let dir = tempfile::tempdir().unwrap();
    let session = session_in(dir.path());
    let (parts, all) = write_input(&session, dir.path());
    let cluster = start_cluster(dir.path());

    // The query on the cluster: certified here, executed there.
    let ctx = ClusterContext::connect(&session, &cluster.scheduler).unwrap();
    ctx.register_file("reviews", &parts).unwrap();
    let got = ctx.sql(QUERY).unwrap_or_else(|e| panic!("cluster query failed: {e}\n{}", logs(dir.path())));
    let run = &got.pipelines()[0];
    assert_eq!(run.input_rows, ROWS, "the client certified on the whole input");
    assert!(run.plan.is_some() && run.bounds.is_some(), "{run:?}");
    // The client prefilled only what its profiling read: the executors prefill the rest as they reach it.
    let prefilled = kv_items(&dir.path().join("kv")).len();
    assert!(prefilled < ROWS / 4, "the client prefilled the KV caches of {prefilled} of {ROWS} input items");

    // The answers the client's profiling paid for travelled with the plan: no executor asked for one again.
    assert!(run.shipped_answers.values().sum::<usize>() > 0, "{run:?}");
    let client = memo_keys(&dir.path().join("memo"));
    assert!(!client.is_empty());
    for (i, (_, work)) in cluster.executors.iter().enumerate() {
        let again = memo_keys(&work.join("memo")).intersection(&client).count();
        assert_eq!(again, 0, "executor {i} computed answers the client's profiling had paid for");
    }

    // The single-process run gives the same rows.
    let local = SqlContext::new(&session).unwrap();
    local.register_file("reviews", &all).unwrap();
    let expected = local.sql(QUERY).unwrap().collect().unwrap();
    assert!(expected.num_rows() > 0 && expected.num_rows() < ROWS, "{} rows", expected.num_rows());
    assert_eq!(rows(&got), rows(&expected), "{}", logs(dir.path()));

    // Both executors ran cascade tasks, and together every partition once.
    let counts: Vec<Vec<serde_json::Value>> = cluster.executors.iter().map(|(_, w)| tasks(w)).collect();
    for (i, c) in counts.iter().enumerate() {
        assert!(!c.is_empty(), "executor {i} ran no cascade task\n{}", logs(dir.path()));
    }
    let rows_in: u64 = counts.iter().flatten().map(|t| t["rows_in"].as_u64().unwrap()).sum();
    assert_eq!(rows_in as usize, ROWS, "{counts:?}");
    assert!(counts.iter().flatten().all(|t| t["ended"] == "input"), "{counts:?}");

    // A LIMIT, from a client with empty caches: it certifies knowing the limit (so it prefills only the items its
    // profiling reads, not every input item), and each partition's cascade stops once it has the rows wanted.
    let before: Vec<usize> = cluster.executors.iter().map(|(_, w)| tasks(w).len()).collect();
    let fresh = dir.path().join("limit");
    let limit_ctx = ClusterContext::connect(&session_in(&fresh), &cluster.scheduler).unwrap();
    limit_ctx.register_file("reviews", &parts).unwrap();
    let limited = limit_ctx.sql(LIMITED).unwrap_or_else(|e| panic!("cluster query failed: {e}\n{}", logs(dir.path())));
    assert_eq!(limited.pipelines()[0].fetch, Some(2), "certified for the LIMIT");
    let prefilled = kv_items(&fresh.join("kv")).len();
    assert!(prefilled < ROWS / 4, "the client prefilled {prefilled} of {ROWS} items for a LIMIT 2");
    let all: std::collections::HashSet<String> =
        rows(&local.sql(&LIMITED.replace(" LIMIT 2", "")).unwrap().collect().unwrap()).into_iter().collect();
    let got = rows(&limited);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.iter().all(|r| all.contains(r)), "{got:?} are not all rows of the query without its LIMIT");
    let limited_tasks: Vec<serde_json::Value> =
        cluster.executors.iter().zip(&before).flat_map(|((_, w), &n)| tasks(w).into_iter().skip(n)).collect();
    assert_eq!(limited_tasks.len(), FILES, "a task per partition: {limited_tasks:?}");
    let rows_in: u64 = limited_tasks.iter().map(|t| t["rows_in"].as_u64().unwrap()).sum();
    assert!(rows_in < ROWS as u64, "the partitions ran {rows_in} of {ROWS} tuples for a LIMIT 2: {limited_tasks:?}");
    assert!(limited_tasks.iter().any(|t| t["ended"] == "fetch"), "{limited_tasks:?}");
    // A partition stops at its fetch, or runs its whole input where it finds fewer rows.
    let whole = (ROWS / FILES) as u64;
    assert!(
        limited_tasks.iter().all(|t| t["ended"] == "fetch" || (t["ended"] == "input" && t["rows_in"] == whole)),
        "{limited_tasks:?}"
    );

    // An executor killed mid-query: an error, or a complete result (the task ran again elsewhere).
    let second = QUERY.replace("The movie title named in", "The name of the lead actor mentioned in");
    let expected = local.sql(&second).unwrap().collect().unwrap();
    let mut survivors = cluster.executors;
    let (mut victim, victim_dir) = survivors.remove(0);
    let before = tasks(&victim_dir).len();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done2 = done.clone();
    let killer = std::thread::spawn(move || {
        // Kill once the victim has finished a task of this query (it then holds results and more work).
        while tasks(&victim_dir).len() == before {
            if done2.load(std::sync::atomic::Ordering::SeqCst) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        victim.0.kill().unwrap();
        victim.0.wait().unwrap();
        true
    });
    let outcome = ctx.sql(&second);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let killed = killer.join().unwrap();
    assert!(killed, "the victim ran no task of the second query before it ended\n{}", logs(dir.path()));
    match outcome {
        Ok(r) => assert_eq!(rows(&r), rows(&expected), "a result after a lost executor must be complete"),
        Err(e) => eprintln!("the query failed after an executor was killed: {e}"),
    }
    drop(survivors);
}

fn logs(dir: &Path) -> String {
    let mut s = String::new();
    for name in ["scheduler.log", "executor-0.log", "executor-1.log"] {
        let text = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        s.push_str(&format!("--- {name} (last lines)\n{}\n", tail.into_iter().rev().collect::<Vec<_>>().join("\n")));
    }
    s
}
