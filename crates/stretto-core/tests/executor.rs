//! Executor semantics on hand-computed cases (`docs/profile-format.md` §Plan).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use stretto_core::exec::{filter_decision, CascadeExecutor, CascadePlan, Decision, PaidAnswers};
use stretto_core::format::{PlanFile, PlanStage};
use stretto_core::op::{
    LogicalKind, Modality, OpOutput, OpProperties, PhysicalOp, RegisteredOp, SemanticTask, ValueType,
};
use stretto_core::{CoreError, MemoPolicy};

/// An operator as the framework runs it, without a memo (these operators count what they are asked).
fn registered(op: Arc<dyn PhysicalOp>) -> Arc<RegisteredOp> {
    Arc::new(RegisteredOp::new(op, MemoPolicy::Off))
}

/// Returns a fixed output per row id (column `t.id`), and counts the tuples it is asked about.
#[derive(Debug)]
struct Table {
    name: String,
    props: OpProperties,
    scores: Vec<f64>,
    values: Option<Vec<Option<&'static str>>>,
    seen: AtomicUsize,
}

impl Table {
    fn filter(name: &str, scores: &[f64]) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            props: props(LogicalKind::Filter),
            scores: scores.to_vec(),
            values: None,
            seen: AtomicUsize::new(0),
        })
    }
    fn map(name: &str, values: &[Option<&'static str>], conf: &[f64]) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            props: props(LogicalKind::Map),
            scores: conf.to_vec(),
            values: Some(values.to_vec()),
            seen: AtomicUsize::new(0),
        })
    }
}

fn props(kind: LogicalKind) -> OpProperties {
    OpProperties {
        kind,
        family: "table".into(),
        modality: Modality::Text,
        model: None,
        compression: None,
        tunable: true,
        gold: false,
        cost_hint: 1e-6,
        score_range: (-10.0, 10.0),
    }
}

impl PhysicalOp for Table {
    fn name(&self) -> &str {
        &self.name
    }
    fn properties(&self) -> &OpProperties {
        &self.props
    }
    fn evaluate_items(&self, _task: &SemanticTask, items: &[String]) -> stretto_core::Result<(OpOutput, Vec<f64>)> {
        self.seen.fetch_add(items.len(), Ordering::SeqCst);
        // Items are the referenced cells: "row N".
        let ids: Vec<usize> = items.iter().map(|t| t.trim_start_matches("row ").parse().unwrap()).collect();
        let scores: Vec<f64> = ids.iter().map(|&i| self.scores[i]).collect();
        let out = match &self.values {
            None => OpOutput::Scores(scores),
            Some(v) => OpOutput::Values {
                values: ids.iter().map(|&i| v[i].map(str::to_string)).collect(),
                confidences: scores,
            },
        };
        Ok((out, vec![1e-6; items.len()]))
    }
}

fn input(n: usize) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("t.id", DataType::Int64, false),
            Field::new("t.text", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from_iter_values(0..n as i64)),
            Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("row {i}")))),
        ],
    )
    .unwrap()
}

fn stage(physical: &str, lower: Option<f64>, upper: Option<f64>) -> PlanStage {
    PlanStage { physical: physical.into(), lower, upper }
}

/// `plan` bound to `tasks`, its stages' operators found among `ops` by name.
fn bind(plan: &PlanFile, tasks: Vec<SemanticTask>, ops: &[Arc<Table>]) -> CascadePlan {
    CascadePlan::bind(plan, tasks, |name| {
        ops.iter()
            .find(|o| o.name == name)
            .map(|o| registered(o.clone()))
            .ok_or(CoreError::UnknownOperator { name: name.into(), known: String::new() })
    })
    .unwrap()
}

fn tasks() -> Vec<SemanticTask> {
    vec![
        SemanticTask::filter("a", "{t.text} is a"),
        SemanticTask::filter("b", "{t.text} is b"),
        SemanticTask::map("m", "value of {t.text}", "m", ValueType::Integer),
    ]
}

#[test]
fn decision_rule_matches_the_format() {
    assert_eq!(filter_decision(0.5, Some(-1.0), Some(0.4)), Decision::Accept);
    assert_eq!(filter_decision(0.4, Some(-1.0), Some(0.4)), Decision::Unsure);
    assert_eq!(filter_decision(-1.0, Some(-1.0), Some(0.4)), Decision::Unsure);
    assert_eq!(filter_decision(-1.1, Some(-1.0), Some(0.4)), Decision::Reject);
    assert_eq!(filter_decision(0.0, None, None), Decision::Unsure);
    assert_eq!(filter_decision(f64::NAN, Some(0.0), Some(0.0)), Decision::Unsure);
}

/// Five tuples, two filters with a cheap and a gold stage each, one map with a deferring cheap stage.
///
/// | id | a/cheap (-1,1) | a/gold | b/cheap (-1,1) | b/gold | m/cheap conf>0.5 | m/gold | result |
/// |----|----------------|--------|----------------|--------|------------------|--------|--------|
/// | 0  | 2 accept       | skip   | 0 unsure       | 1 acc  | 0.9 "7"          | skip   | yes m=7 |
/// | 1  | -2 reject      | skip   | skip (dead)    | skip   | skip             | skip   | no |
/// | 2  | 0 unsure       | 0.5 acc| 3 accept       | skip   | 0.1 unsure       | "9"    | yes m=9 |
/// | 3  | 0 unsure       | -1 rej | 9 accept       | skip   | skip (dead)      | skip   | no |
/// | 4  | 0.5 unsure     | 0 uns  | 2 accept       | skip   | 0.8 "x"          | skip   | no (a undecided after last stage) |
#[test]
fn hand_computed_cascade() {
    let a_cheap = Table::filter("a-cheap", &[2.0, -2.0, 0.0, 0.0, 0.5]);
    let a_gold = Table::filter("a-gold", &[9.0, 9.0, 0.5, -1.0, 0.0]);
    let b_cheap = Table::filter("b-cheap", &[0.0, 9.0, 3.0, 9.0, 2.0]);
    let b_gold = Table::filter("b-gold", &[1.0, 9.0, 9.0, 9.0, 9.0]);
    let m_cheap = Table::map("m-cheap", &[Some("7"), None, Some("1"), None, Some("x")], &[0.9, 0.0, 0.1, 0.0, 0.8]);
    let m_gold = Table::map("m-gold", &[Some("8"), None, Some("9"), None, Some("5")], &[1.0; 5]);
    let ops: Vec<Arc<Table>> =
        vec![a_cheap.clone(), a_gold.clone(), b_cheap.clone(), b_gold.clone(), m_cheap.clone(), m_gold.clone()];
    let plan = PlanFile::new(vec![
        stage("a/a-cheap", Some(-1.0), Some(1.0)),
        stage("b/b-cheap", Some(-1.0), Some(1.0)),
        stage("a/a-gold", Some(0.0), Some(0.0)),
        stage("m/m-cheap", None, Some(0.5)),
        stage("b/b-gold", Some(0.0), Some(0.0)),
        stage("m/m-gold", None, None),
    ]);
    let cascade = bind(&plan, tasks(), &ops);
    // Batch size 2 makes the cascade run over three batches; results must not depend on it.
    for batch_size in [2, 64] {
        for o in &ops {
            o.seen.store(0, Ordering::SeqCst);
        }
        let out = CascadeExecutor::new(batch_size).with_progress(false).execute(&cascade, &input(5)).unwrap();
        assert_eq!(out.rows, vec![0, 2]);
        let m = out.batch.column_by_name("m").unwrap().as_primitive::<Int64Type>();
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![Some(7), Some(9)]);
        let counts: Vec<(usize, usize, usize, usize)> =
            out.stats.iter().map(|s| (s.tuples_in, s.accepted, s.rejected, s.unsure)).collect();
        assert_eq!(
            counts,
            vec![
                (5, 1, 1, 3), // a/cheap: 0 accepts, 1 rejects, 2,3,4 unsure
                (4, 3, 0, 1), // b/cheap sees the alive ones 0,2,3,4: 2, 3 and 4 accept, 0 stays unsure
                (3, 1, 1, 1), // a/gold sees 2,3,4: 2 accepts, 3 dies, 4 stays unsure
                (3, 2, 0, 1), // m/cheap sees 0,2,4 (3 died at a/gold, skipped at no cost): 0 and 4 are sure, 2 defers
                (1, 1, 0, 0), // b/gold sees only 0 (3 is decided for b, and dead since a/gold)
                (1, 1, 0, 0), // m/gold sees only 2
            ]
        );
        // Dead tuples never reach later operators: tuple 1 was only ever scored by a/cheap.
        assert_eq!(b_gold.seen.load(Ordering::SeqCst), 1);
        assert_eq!(m_gold.seen.load(Ordering::SeqCst), 1);
    }
}

/// Answers the query already paid for (profiling's) are booked as reused, stage by stage and row by row: only the
/// paid rows that reach a stage count, and only for the operator that answered them.
#[test]
fn answers_paid_in_profiling_are_booked_as_reused() {
    let a_cheap = Table::filter("a-cheap", &[2.0, -2.0, 0.0, 0.0, 0.5]);
    let a_gold = Table::filter("a-gold", &[9.0, 9.0, 0.5, -1.0, 0.0]);
    let ops: Vec<Arc<Table>> = vec![a_cheap, a_gold];
    let plan = PlanFile::new(vec![stage("a/a-cheap", Some(-1.0), Some(1.0)), stage("a/a-gold", Some(0.0), Some(0.0))]);
    let cascade = bind(&plan, vec![SemanticTask::filter("a", "{t.text} is a")], &ops);
    let mut paid = PaidAnswers::default();
    // Gold answered rows 0, 2 and 3 in profiling; row 0 never reaches gold (the cheap stage accepts it).
    paid.add("a/a-gold", [0, 2, 3]);
    // The cheap stage answered row 1; `b` is another logical operator's name.
    paid.add("a/a-cheap", [1]);
    paid.add("b/a-cheap", [0, 2, 3, 4]);
    for batch_size in [2, 64] {
        let plain = CascadeExecutor::new(batch_size).with_progress(false).execute(&cascade, &input(5)).unwrap();
        assert!(plain.stats.iter().all(|s| s.reused_seconds == 0.0 && s.reused == 0));
        let out = CascadeExecutor::new(batch_size)
            .with_progress(false)
            .with_paid(Arc::new(paid.clone()))
            .execute(&cascade, &input(5))
            .unwrap();
        assert_eq!(out.rows, plain.rows);
        // Every item costs 1e-6: the cheap stage saw 5 tuples (1 paid), gold saw 2, 3, 4 (2 paid).
        let got: Vec<(f64, f64)> = out.stats.iter().map(|s| (s.cost_seconds * 1e6, s.reused_seconds * 1e6)).collect();
        for ((cost, reused), want) in got.iter().zip([(5.0, 1.0), (3.0, 2.0)]) {
            assert!((cost - want.0).abs() < 1e-9 && (reused - want.1).abs() < 1e-9, "{got:?}");
        }
        assert_eq!(out.stats.iter().map(|s| s.reused).collect::<Vec<_>>(), [1, 2], "tuples read as paid for");
    }
}

/// With a fetch, the executor goes through the rows in order and stops after the batch that completes the first
/// `fetch` result rows: the rows after it are never asked about, and the result is the first `fetch` result rows.
#[test]
fn a_fetch_stops_execution_once_the_first_result_rows_are_known() {
    // Ten tuples; the filter keeps the odd ones (1, 3, 5, 7, 9).
    let odd = Table::filter("odd", &[-1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0]);
    let ops = [odd.clone()];
    let plan = PlanFile::new(vec![stage("a/odd", Some(0.0), Some(0.0))]);
    let cascade = bind(&plan, vec![SemanticTask::filter("a", "{t.text} is a")], &ops);
    // Batches of 2 at most: rows 1 and 3 are known after the second batch, so rows 4..10 are never asked.
    let out = CascadeExecutor::new(2).with_progress(false).with_fetch(2).execute(&cascade, &input(10)).unwrap();
    assert_eq!((out.rows.clone(), out.executed, out.batch.num_rows()), (vec![1, 3], 4, 2));
    assert_eq!(odd.seen.load(Ordering::SeqCst), 4);
    assert_eq!(out.stats[0].tuples_in, 4);
    // The first batch is twice the fetch: one row in two passes, so it usually completes it (rows 0..2 for a fetch
    // of 1, 0..4 for 2, 0..6 for 3), and nothing after it is asked.
    odd.seen.store(0, Ordering::SeqCst);
    let out = CascadeExecutor::new(64).with_progress(false).with_fetch(1).execute(&cascade, &input(10)).unwrap();
    assert_eq!((out.rows.clone(), out.executed), (vec![1], 2));
    let out = CascadeExecutor::new(64).with_progress(false).with_fetch(2).execute(&cascade, &input(10)).unwrap();
    assert_eq!((out.rows.clone(), out.executed), (vec![1, 3], 4));
    odd.seen.store(0, Ordering::SeqCst);
    let out = CascadeExecutor::new(64).with_progress(false).with_fetch(3).execute(&cascade, &input(10)).unwrap();
    assert_eq!((out.rows.clone(), out.executed), (vec![1, 3, 5], 6));
    assert_eq!(odd.seen.load(Ordering::SeqCst), 6);
    // Batches of 4 at most (twice the fetch of 3 is clamped to 4): rows 0..4 hold two results, and the batch that
    // completes the fetch, rows 4..8, holds a fourth (7), which is cut.
    let out = CascadeExecutor::new(4).with_progress(false).with_fetch(3).execute(&cascade, &input(10)).unwrap();
    assert_eq!((out.rows.clone(), out.executed), (vec![1, 3, 5], 8));
    // A fetch the input cannot meet goes through every row.
    let out = CascadeExecutor::new(4).with_progress(false).with_fetch(9).execute(&cascade, &input(10)).unwrap();
    assert_eq!((out.rows, out.executed), (vec![1, 3, 5, 7, 9], 10));
}

#[test]
fn binding_names_unknown_stage_and_operator() {
    let op = Table::filter("x", &[0.0]);
    let resolve = |name: &str| -> stretto_core::Result<Arc<RegisteredOp>> {
        if name == "x" {
            Ok(registered(op.clone()))
        } else {
            Err(CoreError::UnknownOperator { name: name.into(), known: "x".into() })
        }
    };
    let t = vec![SemanticTask::filter("a", "{t.text}")];
    let err = CascadePlan::bind(&PlanFile::new(vec![stage("zzz/x", None, None)]), t.clone(), resolve).unwrap_err();
    assert!(matches!(&err, CoreError::UnknownStage { logical, .. } if logical == "zzz"), "{err}");
    let err = CascadePlan::bind(&PlanFile::new(vec![stage("a/nope", None, None)]), t.clone(), resolve).unwrap_err();
    assert!(matches!(&err, CoreError::UnknownOperator { name, .. } if name == "nope"), "{err}");
    // A filter operator cannot implement a map.
    let m = vec![SemanticTask::map("a", "{t.text}", "a", ValueType::String)];
    let err = CascadePlan::bind(&PlanFile::new(vec![stage("a/x", None, None)]), m, resolve).unwrap_err();
    assert!(err.to_string().contains("a/x"), "{err}");
    // A logical operator without stages would silently drop everything.
    let two = vec![SemanticTask::filter("a", "{t.text}"), SemanticTask::filter("b", "{t.text}")];
    let err = CascadePlan::bind(&PlanFile::new(vec![stage("a/x", None, None)]), two, resolve).unwrap_err();
    assert!(err.to_string().contains("`b`"), "{err}");
}

#[test]
fn operator_returning_wrong_length_is_an_error() {
    #[derive(Debug)]
    struct Short(OpProperties);
    impl PhysicalOp for Short {
        fn name(&self) -> &str {
            "short"
        }
        fn properties(&self) -> &OpProperties {
            &self.0
        }
        fn evaluate_items(&self, _: &SemanticTask, _: &[String]) -> stretto_core::Result<(OpOutput, Vec<f64>)> {
            Ok((OpOutput::Scores(vec![1.0]), vec![1e-6]))
        }
    }
    let op = registered(Arc::new(Short(props(LogicalKind::Filter))));
    let cascade = CascadePlan::bind(
        &PlanFile::new(vec![stage("a/short", None, None)]),
        vec![SemanticTask::filter("a", "{t.text}")],
        |_| Ok(op.clone()),
    )
    .unwrap();
    let err = CascadeExecutor::new(8).with_progress(false).execute(&cascade, &input(3)).unwrap_err();
    assert!(err.to_string().contains("short") && err.to_string().contains("3 tuples"), "{err}");
}

#[test]
fn unparseable_map_value_becomes_null_not_an_error() {
    let m = registered(Table::map("m", &[Some("12"), Some("twelve")], &[1.0, 1.0]));
    let cascade = CascadePlan::bind(
        &PlanFile::new(vec![stage("m/m", None, None)]),
        vec![SemanticTask::map("m", "{t.text}", "m", ValueType::Integer)],
        |_| Ok(m.clone()),
    )
    .unwrap();
    let out = CascadeExecutor::new(8).with_progress(false).execute(&cascade, &input(2)).unwrap();
    assert_eq!(out.rows, vec![0, 1]);
    let col = out.batch.column_by_name("m").unwrap().as_primitive::<Int64Type>();
    assert_eq!(col.iter().collect::<Vec<_>>(), vec![Some(12), None]);
}

/// A slice of the input keeps the paid answers on its rows, renumbered from the slice's start: an executor given rows
/// 64..128 books row 70's paid answer at its row 6.
#[test]
fn paid_answers_follow_a_slice_of_the_input() {
    let mut paid = PaidAnswers::default();
    paid.add("a/gold", [3, 64, 70, 127, 128]);
    paid.add("b/gold", [0, 65]);
    let w = paid.window(64, 128);
    let kept = |p: &str| (0..64).filter(|&r| w.contains(p, r)).collect::<Vec<_>>();
    assert_eq!(kept("a/gold"), [0, 6, 63]);
    assert_eq!(kept("b/gold"), [1]);
    assert!(!w.contains("a/gold", 64), "row 128 lies past the slice");
}
