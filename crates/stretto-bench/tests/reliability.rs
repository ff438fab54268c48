//! `stretto query` under real use (#18): two processes sharing one model home, KV directory and memo, and queries
//! killed with SIGKILL in each phase, then rerun. Every run must give the rows of an undisturbed run, and the
//! stores must verify afterwards.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{files_under, records_under as records};

fn bytes_under(dir: &Path) -> u64 {
    files_under(dir).iter().map(|f| f.1).sum()
}

/// A filter and a map on 80 reviews, half of them profiled: KV caches, profiling and execution each take seconds
/// with SmolLM2-135M, long enough to be interrupted.
fn query_args() -> Vec<&'static str> {
    vec![
        "query",
        "--dataset",
        "movie",
        "--query",
        "{reviews.reviewtext} is clearly positive -- Extract the movie [title] mentioned in {reviews.reviewtext}",
        "--precision",
        "0.8",
        "--recall",
        "0.8",
        "--limit",
        "80",
        "--sample",
        "0.5",
        "--ladder",
        "smollm2-135m",
        "--json",
    ]
}

/// `stretto ARGS` in `cwd`, with the KV caches and the memo under `stores` (shared by every run given it).
fn command(args: &[&str], cwd: &Path, stores: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stretto"));
    c.args(args).current_dir(cwd).env("STRETTO_MEMO_DIR", stores.join("memo")).env("STRETTO_KV_DIR", stores.join("kv"));
    c
}

/// Runs to the end; returns the result rows (as JSON), failing the test with stderr on an error.
fn rows_of(out: std::process::Output) -> serde_json::Value {
    report_of(out)["rows"].clone()
}

/// [`rows_of`], the whole JSON report.
fn report_of(out: std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert!(!r["rows"].as_array().unwrap().is_empty(), "no rows: {r}");
    r
}

fn run(cwd: &Path, stores: &Path) -> serde_json::Value {
    rows_of(command(&query_args(), cwd, stores).output().expect("binary runs"))
}

fn scratch(root: &Path, name: &str) -> PathBuf {
    let d = root.join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The stores are sound: every KV record verifies, and `stretto doctor` (which reads the memo too) finds nothing.
fn assert_stores_verify(stores: &Path) {
    let out = command(&["kv", "verify", "--dataset", "adhoc"], stores, stores).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(" 0 corrupt"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!text.starts_with("0 records"), "the query computed no KV record: {text}");
    let out = command(&["doctor", "--json"], stores, stores).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let adhoc = report["kv"].as_array().unwrap().iter().find(|k| k["repository"] == "adhoc").cloned();
    assert!(adhoc.is_some_and(|a| a["corrupt"].as_array().unwrap().is_empty()), "{report}");
    assert!(out.status.success(), "{report}{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn two_concurrent_queries_on_one_home_give_the_sequential_result() {
    let root = tempfile::tempdir().unwrap();
    let alone = run(&scratch(root.path(), "a"), &scratch(root.path(), "alone"));

    // Two processes at once on fresh shared stores: both compute the same caches and answers side by side.
    let shared = scratch(root.path(), "shared");
    let spawn = |name: &str| {
        command(&query_args(), &scratch(root.path(), name), &shared)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("binary runs")
    };
    let (first, second) = (spawn("p1"), spawn("p2"));
    let (first, second) = (first.wait_with_output().unwrap(), second.wait_with_output().unwrap());
    assert_eq!(rows_of(first), alone, "the first concurrent run differs from the run alone");
    assert_eq!(rows_of(second), alone, "the second concurrent run differs from the run alone");
    assert_stores_verify(&shared);
    // And a third run on what they left reuses it and agrees too.
    assert_eq!(run(&scratch(root.path(), "p3"), &shared), alone);
}

/// Waits until `reached` holds (then kills the child with SIGKILL and returns true), or the child ends by itself
/// (returns false).
fn kill_when(mut child: Child, reached: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(600);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        if reached() {
            let _ = child.kill();
            let _ = child.wait();
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = child.kill();
    panic!("the query neither reached its kill point nor ended in 10 minutes");
}

/// A phase's name and the sign that a run has reached it.
type KillPoint<'a> = (&'static str, Box<dyn Fn() -> bool + 'a>);

#[test]
fn a_query_killed_in_each_phase_resumes_to_the_uninterrupted_result() {
    let root = tempfile::tempdir().unwrap();
    let want = run(&scratch(root.path(), "a"), &scratch(root.path(), "clean"));

    let stores = scratch(root.path(), "killed");
    let cwd = scratch(root.path(), "k");
    let spawn = || command(&query_args(), &cwd, &stores).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // Kill points, in the order a run reaches them: its first KV record written (cache building), its first memo
    // file (profiling), its plan written (execution). Each rerun starts from what the killed ones left.
    let kv = stores.join("kv");
    let memo = stores.join("memo");
    let plan = cwd.join("stretto-run/plan.json");
    let points: [KillPoint; 3] = [
        ("building KV caches", Box::new(|| !records(&kv).is_empty())),
        ("profiling", Box::new(|| files_under(&memo).iter().any(|(p, _)| p.extension().is_some_and(|e| e == "jsonl")))),
        ("executing", Box::new(|| plan.is_file())),
    ];
    for (phase, reached) in points {
        let killed = kill_when(spawn(), reached);
        eprintln!("{phase}: {}", if killed { "killed" } else { "finished before the kill point" });
        assert!(killed, "the run finished before it was killed while {phase}");
    }
    assert_eq!(run(&cwd, &stores), want, "the resumed query differs from the uninterrupted one");
    assert_stores_verify(&stores);
}

/// The bundled reviews `rows` as `dir/reviews.csv` (a user's file; its table is `reviews`).
fn reviews_csv(dir: &Path, rows: std::ops::Range<usize>) -> PathBuf {
    let ds = stretto_core::datasets::Dataset::load("movie").unwrap();
    let reviews = ds.table("reviews").unwrap().slice(rows.start, rows.len());
    let path = dir.join("reviews.csv");
    arrow::csv::Writer::new(std::fs::File::create(&path).unwrap()).write(&reviews).unwrap();
    path
}

#[test]
fn a_disk_budget_smaller_than_the_caches_evicts_and_still_answers_right() {
    let root = tempfile::tempdir().unwrap();
    let (first, second) =
        (reviews_csv(&scratch(root.path(), "first"), 0..30), reviews_csv(&scratch(root.path(), "second"), 30..60));
    let args = |input: &Path, budget: Option<u64>| -> Vec<String> {
        let mut a: Vec<String> = [
            "query",
            "--input",
            input.to_str().unwrap(),
            "--query",
            "{reviews.reviewtext} is clearly positive",
            "--precision",
            "0.8",
            "--recall",
            "0.8",
            "--ladder",
            "smollm2-135m",
            "--json",
        ]
        .map(String::from)
        .to_vec();
        if let Some(b) = budget {
            a.extend(["--disk-budget".to_string(), b.to_string()]);
        }
        a
    };
    let go = |a: Vec<String>, cwd: &Path, stores: &Path| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        rows_of(command(&a, cwd, stores).output().unwrap())
    };
    let want = go(args(&second, None), &scratch(root.path(), "c1"), &scratch(root.path(), "roomy"));

    // The first query leaves its caches; the second gets a budget of exactly what is on disk then, so every
    // record it keeps must push out one of the first query's (least recently used, no longer in use).
    let stores = scratch(root.path(), "tight");
    go(args(&first, None), &scratch(root.path(), "c2"), &stores);
    let kv = stores.join("kv");
    let before = records(&kv.join("adhoc"));
    let budget = bytes_under(&kv) + bytes_under(&stores.join("memo"));
    let got = go(args(&second, Some(budget)), &scratch(root.path(), "c3"), &stores);
    assert_eq!(got, want, "the budgeted query answered differently");
    let (after, kv_after) = (records(&kv.join("adhoc")), bytes_under(&kv));
    let evicted = before.difference(&after).count();
    let kept = after.difference(&before).count();
    eprintln!(
        "budget {budget} B: the first query left {} records; the second evicted {evicted} and kept {kept} of its \
         own; {kv_after} B of KV after",
        before.len()
    );
    assert!(kv_after <= budget, "the KV directory holds {kv_after} B over a budget of {budget} B");
    assert!(evicted > 0 && kept > 0, "the second query's caches did not replace the first's");
    let out = command(&["kv", "verify", "--dataset", "adhoc"], &stores, &stores).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));

    // `stretto sql` honours the same flag: the first input again, whose evicted caches it must rebuild, under a
    // budget of what is on disk now (without the flag it would keep them all, over this budget).
    let budget = bytes_under(&kv) + bytes_under(&stores.join("memo"));
    let input = format!("reviews={}", first.display());
    let sql = "SELECT reviewid FROM reviews WHERE sem_filter('{reviews.reviewtext} is clearly positive')";
    let out = command(
        &["sql", sql, "--input", &input, "--ladder", "smollm2-135m", "--disk-budget", &budget.to_string(), "--json"],
        &scratch(root.path(), "c4"),
        &stores,
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let kv_sql = bytes_under(&kv);
    eprintln!("sql under a budget of {budget} B: {kv_sql} B of KV after");
    assert!(kv_sql <= budget, "after `stretto sql` the KV directory holds {kv_sql} B over a budget of {budget} B");
}

/// A query whose input's KV caches would not fit the disk budget prefills only the tuples profiling reads before it
/// (here the 40 sampled and 20 screening tuples of 80), leaves the others to execution, says so, and answers as a
/// query with room for every cache does.
#[test]
fn a_query_whose_caches_exceed_the_disk_budget_prefills_only_what_profiling_reads_first() {
    let root = tempfile::tempdir().unwrap();
    let args = |budget: Option<&'static str>| {
        let mut a = query_args();
        a[4] = "{reviews.reviewtext} is clearly positive";
        a.extend(budget.map(|b| ["--disk-budget", b]).into_iter().flatten());
        a
    };
    let roomy =
        report_of(command(&args(None), &scratch(root.path(), "c1"), &scratch(root.path(), "roomy")).output().unwrap());
    assert!(roomy.get("kv_caches").is_none(), "{}", roomy["kv_caches"]);
    let stores = scratch(root.path(), "tight");
    let tight = report_of(command(&args(Some("1")), &scratch(root.path(), "c2"), &stores).output().unwrap());
    let note = tight["kv_caches"].as_str().expect("the report says the caches were deferred");
    // One model (gold's): the 40 sample tuples and the 20 screening ones (the defaults over 80 rows at --sample 0.5).
    assert!(
        note.contains("the KV caches of all 80 tuples")
            && note.contains("prefilled where missing: smollm2-135m 60 tuples)"),
        "{note}"
    );
    assert_eq!(tight["rows"], roomy["rows"], "the query under a tight budget answered differently");
    assert_eq!(records(&stores.join("kv").join("adhoc")).len(), 0, "a 1-byte budget keeps no record");
}

/// Two logical operators over one column read the same KV records: the check whether the input's caches fit the
/// disk budget counts each item once per model, not once per operator. The 80 reviews' SmolLM2 records take about
/// 170 MB (2.13 MB per review at ratios 0, 0.5 and 0.8), so a 250 MB budget holds them, and the filter and the map
/// of this query prefill every cache before profiling (counted twice, 341 MB, they were deferred to execution), and
/// keep the records a run without a budget keeps.
#[test]
fn operators_over_one_column_count_its_caches_once_against_the_disk_budget() {
    let root = tempfile::tempdir().unwrap();
    let run = |budget: Option<&'static str>, name: &str| {
        let mut args = query_args();
        args.extend(budget.map(|b| ["--disk-budget", b]).into_iter().flatten());
        let stores = scratch(root.path(), name);
        let r = report_of(command(&args, &scratch(root.path(), &format!("{name}-cwd")), &stores).output().unwrap());
        let kept: Vec<_> = records(&stores.join("kv").join("adhoc"))
            .into_iter()
            .map(|p| p.strip_prefix(&stores).unwrap().to_path_buf())
            .collect();
        (r, kept)
    };
    let (tight, kept) = run(Some("250000000"), "tight");
    assert!(tight.get("kv_caches").is_none(), "the caches were deferred: {}", tight["kv_caches"]);
    let (roomy, all) = run(None, "roomy");
    assert!(kept.len() > 200, "{} records", kept.len());
    assert_eq!(kept, all, "the budget kept other records than a run without one");
    assert_eq!(tight["rows"], roomy["rows"]);
}

/// Under a disk budget too small for every cache, a model other than gold's prefills only the screening tuples
/// before profiling; the sample's wait until screening shows that profiling can pay, and are never prefilled
/// where gold runs directly. A rerun after the caches were evicted does not prefill again the sample tuples whose
/// gold answers it has memoised, and prices its prefills on the figures the first run recorded.
#[test]
fn deferred_caches_leave_the_other_models_sample_until_profiling_can_pay() {
    let root = tempfile::tempdir().unwrap();
    let mut args = query_args();
    args[4] = "{reviews.reviewtext} is clearly positive";
    let ladder = args.iter().position(|a| *a == "--ladder").unwrap() + 1;
    args[ladder] = "smollm2-135m,qwen2.5-coder-0.5b";
    // Every record of the 80 reviews takes 259.6 MB (measured: Qwen 0.5B 1.11 MB and SmolLM2 2.13 MB per review at
    // ratios 0, 0.5 and 0.8): 150 MB defers them, yet holds what is prefilled before profiling (60 reviews' Qwen
    // records and 20 reviews' SmolLM2, about 110 MB), so that every one of those prefills is timed.
    args.extend(["--disk-budget", "150000000"]);
    let (cwd, stores) = (scratch(root.path(), "c"), scratch(root.path(), "s"));
    let r = report_of(command(&args, &cwd, &stores).output().unwrap());
    let note = r["kv_caches"].as_str().expect("the report says the caches were deferred");
    assert!(note.contains("prefilled where missing: qwen2.5-coder-0.5b 60 tuples, smollm2-135m 20 tuples)"), "{note}");
    // What a prefill took per item, which the pay checks and the profiled costs price in.
    let priced =
        |n: &str| n.split("a prefill took per item ").nth(1).and_then(|t| t.split(", priced").next()).map(String::from);
    let figures = priced(note).unwrap_or_default();
    assert!(figures.starts_with("qwen2.5-coder-0.5b ") && figures.contains(", smollm2-135m "), "{note}");
    let profiled_smollm2 = r["candidates"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|v| v.as_array().unwrap())
        .any(|c| c.as_str().unwrap().contains("smollm2-135m"));
    if profiled_smollm2 {
        assert!(note.contains("after screening, the sample's: smollm2-135m 40 tuples"), "{note}");
    } else {
        assert!(note.contains("sample caches were never prefilled"), "{note}");
    }
    // Every cache evicted, then the query again on the same memo: gold's answers on the 40 sample tuples are
    // memoised, so only the screening tuples are prefilled before profiling; its prefills are priced at the figures
    // the first run recorded, so that it chooses as the first did, and it answers the same.
    std::fs::remove_dir_all(stores.join("kv")).unwrap();
    let again = report_of(command(&args, &cwd, &stores).output().unwrap());
    let again_note = again["kv_caches"].as_str().unwrap();
    assert!(
        again_note.contains(
            "prefilled where missing: qwen2.5-coder-0.5b 20 tuples, not the 40 sample tuples whose gold answers are \
             memoised, smollm2-135m 20 tuples)"
        ),
        "{again_note}"
    );
    assert_eq!(priced(again_note), priced(note), "{again_note}");
    assert_eq!(again["rows"], r["rows"]);
    if again_note.contains("sample caches were never prefilled") {
        // Gold ran directly on answers it had: its model read no more than the screening tuples.
        let gold = stores.join("kv").join("adhoc").join("qwen2.5-coder-0.5b@expected-attention-0.00");
        assert_eq!(records(&gold).len(), 20, "{again_note}");
    }
}
