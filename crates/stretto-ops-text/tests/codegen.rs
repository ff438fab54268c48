//! The codegen map on Rotowire reports: the winner's points, against the bundled ground truth.

use std::collections::HashMap;

use arrow::array::{Array, AsArray, UInt32Array};
use arrow::compute::kernels::take::take_record_batch;
use arrow::datatypes::{Float64Type, Int64Type};
use stretto_core::datasets::Dataset;
use stretto_core::op::{OpOutput, RegisteredOp, Registry, SemanticTask, ValueType};

const N: usize = 40;

/// The environment's context, with this test binary's answers kept out of the user's memo.
fn context() -> stretto_core::OpContext {
    let dir = std::env::temp_dir().join(format!("stretto-test-memo-cg-{}", std::process::id()));
    stretto_core::OpContext::from_env().unwrap().with_memo(stretto_core::MemoPolicy::Dir(dir))
}

fn setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        stretto_ops_text::link();
        let home = stretto_core::context::default_home();
        stretto_kv::prepare::ensure_ready(&home, "qwen2.5-coder-0.5b").expect("the coder model prepares");
    });
}

/// The first `N` reports and, per report, the winner's points (the larger "Total points" of its game).
fn reports() -> (arrow::array::RecordBatch, Vec<Option<i64>>) {
    let ds = Dataset::load("rotowire").unwrap();
    let reports = ds.table("reports").unwrap();
    let batch = take_record_batch(reports, &UInt32Array::from_iter_values(0..N as u32)).unwrap();
    let game = batch.column_by_name("game_id").unwrap().as_primitive::<Int64Type>().clone();
    let truth = ds.table("team_labels").unwrap();
    let tg = truth.column_by_name("game_id").unwrap().as_primitive::<Int64Type>();
    let pts = truth.column_by_name("Total points").unwrap().as_primitive::<Float64Type>();
    let mut best: HashMap<i64, i64> = HashMap::new();
    for i in 0..truth.num_rows() {
        if pts.is_valid(i) {
            let e = best.entry(tg.value(i)).or_insert(i64::MIN);
            *e = (*e).max(pts.value(i) as i64);
        }
    }
    let labels = (0..N).map(|i| best.get(&game.value(i)).copied()).collect();
    (stretto_core::table::qualify("reports", &batch).unwrap(), labels)
}

/// Share of labelled items whose extracted integer equals the label.
fn accuracy(
    op: &RegisteredOp,
    (batch, labels): (arrow::array::RecordBatch, Vec<Option<i64>>),
    task: &SemanticTask,
) -> f64 {
    let OpOutput::Values { values, .. } = op.evaluate(task, &batch).unwrap() else { panic!("not values") };
    let right = values
        .iter()
        .zip(&labels)
        .filter(|(v, l)| l.is_some() && v.as_deref().and_then(|v| v.parse().ok()) == **l)
        .count();
    right as f64 / labels.iter().filter(|l| l.is_some()).count() as f64
}

fn winner_points() -> SemanticTask {
    SemanticTask::map(
        "num_points_winner",
        "Extract the number of points scored by the winning team from {reports.report}",
        "num_points_winner",
        ValueType::Integer,
    )
}

fn email_year() -> SemanticTask {
    SemanticTask::map(
        "num_year",
        "Extract the year in the Date header of {emails.text}",
        "num_year",
        ValueType::Integer,
    )
}

#[test]
fn a_fixed_extractor_runs_sandboxed_on_real_reports() {
    setup();
    let registry = Registry::discover(&context()).unwrap();
    // The game score, not a team record "(46 - 12)": two- or three-digit numbers not inside parentheses.
    let op = registry
        .build("codegen-map", &serde_json::json!({"program": r"(?:^|[^(\d])(\d{2,3}) - \d{2,3}(?:[^)\d]|$)"}))
        .unwrap();
    let acc = accuracy(op.as_ref(), reports(), &winner_points());
    eprintln!("fixed extractor: {acc:.3} of the labelled reports among the first {N}");
    // Measured 0.889 (the pattern misses reports that write the score another way).
    assert!(acc >= 0.8, "{acc}");
    let bad = registry.build("codegen-map", &serde_json::json!({"program": r"(?{ system('id') })"}));
    assert!(bad.unwrap_err().to_string().contains("rejected"));
}

#[test]
#[ignore = "a diagnostic, not a check: prints the synthesis log"]
fn synthesis_log() {
    setup();
    let (batch, _) = emails();
    let task = email_year();
    let items = task.item_texts(&batch).unwrap();
    let cfg: stretto_ops_text::codegen::CodegenConfig = serde_json::from_value(serde_json::json!({})).unwrap();
    let (p, log) = stretto_ops_text::codegen::synthesize(&context(), &cfg, &task, &items[..3]).unwrap();
    for l in log {
        eprintln!("{l}");
    }
    eprintln!("{:?}", p.map(|p| p.spec().to_string()));
}

/// The first `N` emails and the year of their `Date:` header, parsed independently of any extractor.
fn emails() -> (arrow::array::RecordBatch, Vec<Option<i64>>) {
    let ds = Dataset::load("email").unwrap();
    let emails = ds.table("emails").unwrap();
    let batch = take_record_batch(emails, &UInt32Array::from_iter_values(0..N as u32)).unwrap();
    let text = batch.column_by_name("text").unwrap().as_string::<i32>().clone();
    let labels = (0..N)
        .map(|i| {
            let date = text.value(i).lines().find(|l| l.starts_with("Date:"))?;
            date.split_whitespace().find_map(|w| w.parse::<i64>().ok().filter(|y| (1900..2100).contains(y)))
        })
        .collect();
    (stretto_core::table::qualify("emails", &batch).unwrap(), labels)
}

/// The coder LLM synthesises an extractor from three examples, and it runs sandboxed on the rest (~10 s).
#[test]
fn the_coder_writes_a_header_extractor() {
    setup();
    let registry = Registry::discover(&context()).unwrap();
    let op = registry.get("codegen:qwen2.5-coder-0.5b").unwrap();
    let acc = accuracy(op.as_ref(), emails(), &email_year());
    eprintln!("generated email-year extractor: {acc:.3} of {N} emails");
    // Measured 1.000: the floor leaves room for one run of synthesis writing a slightly worse pattern.
    assert!(acc >= 0.8, "{acc}");
}

/// An LLM map against the human labels of the same reports: the winner's points, read by SmolLM2-135M from
/// uncompressed caches. Measured: 11 of the 36 labelled reports right (0.306); Qwen2.5-Coder-0.5B's map gets 2 of
/// 36 (it reads the first number of the report, the winner's season wins), a protocol problem tracked with the gold
/// models. The floor (0.2) catches a map that stops answering or answers at random.
#[test]
fn an_llm_map_reads_the_winners_points_as_the_labels_say() {
    setup();
    let registry = Registry::discover(&context()).unwrap();
    let op = registry.get("llm-map:smollm2-135m@expected-attention-0.00").unwrap();
    let acc = accuracy(op.as_ref(), reports(), &winner_points());
    eprintln!("SmolLM2-135M map: {acc:.3} of {N} reports right");
    assert!(acc >= 0.2, "{acc}");
}
