//! The plugin from a user's point of view: link it once, find it in a session's registry, run it in a cascade.

use std::sync::Arc;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use stretto::core::exec::{CascadeExecutor, CascadePlan};
use stretto::core::format::{PlanFile, PlanStage};
use stretto::core::op::SemanticTask;
use stretto_example_custom_operator as lexicon;

fn reviews() -> RecordBatch {
    let texts = [
        "A great, funny and moving film.",             // +3: accepted by the lexicon
        "Dull, predictable and a waste of time.",      // -3: rejected by the lexicon
        "Clearly positive about the cast, I suppose.", // 0: unsure, the keyword stage decides ("positive": kept)
        "It is a film.",                               // 0: unsure, the keyword stage decides (no hit: dropped)
        "Wonderful. Simply wonderful.",                // +2: accepted
    ];
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("r.text", DataType::Utf8, false)])),
        vec![Arc::new(StringArray::from(texts.to_vec()))],
    )
    .unwrap()
}

#[test]
fn a_session_finds_the_linked_operator_and_runs_it_in_a_cascade() {
    lexicon::link();
    let home = tempfile::tempdir().unwrap();
    let session = stretto::Session::builder(home.path()).memo_off().build().unwrap();
    let registry = session.registry();
    registry.require_plugins(&[lexicon::PLUGIN]).expect("the plugin is linked");
    assert!(registry.factories().any(|f| f.name == "lexicon-filter" && f.plugin == lexicon::PLUGIN));
    let op = registry.get("lexicon").unwrap();
    assert_eq!(op.properties().family, "lexicon-filter");

    // Lexicon first (accept above 0.5, reject below -0.5), the keyword filter decides what it leaves unsure.
    let task = SemanticTask::filter("positive", "{r.text} is clearly positive");
    let mut plan = PlanFile::new(vec![
        PlanStage { physical: "positive/lexicon".into(), lower: Some(-0.5), upper: Some(0.5) },
        PlanStage { physical: "positive/keyword".into(), lower: Some(0.5), upper: Some(0.5) },
    ]);
    plan.logical = vec![task.clone()];
    let cascade = CascadePlan::bind(&plan, vec![task], |name| registry.get(name)).unwrap();
    let out = CascadeExecutor::new(2).with_progress(false).execute(&cascade, &reviews()).unwrap();
    assert_eq!(out.rows, vec![0, 2, 4]);
    let (lex, kw) = (&out.stats[0], &out.stats[1]);
    assert_eq!((lex.tuples_in, lex.accepted, lex.rejected, lex.unsure), (5, 2, 1, 2));
    assert_eq!((kw.tuples_in, kw.accepted, kw.rejected), (2, 1, 1));
}

#[test]
fn a_predicate_without_sentiment_is_declined_and_bad_configs_are_named() {
    lexicon::link();
    let home = tempfile::tempdir().unwrap();
    let session = stretto::Session::builder(home.path()).memo_off().build().unwrap();
    let registry = session.registry();
    let task = SemanticTask::filter("f", "{r.text} mentions a car");
    let e = registry.get("lexicon").unwrap().evaluate(&task, &reviews()).unwrap_err();
    assert!(matches!(e, stretto::core::CoreError::NotApplicable { .. }), "{e}");
    let e = registry.build("lexicon-filter", &serde_json::json!({"positiv": ["x"]})).unwrap_err().to_string();
    assert!(e.contains("lexicon-filter") && e.contains("positiv"), "{e}");
}

#[test]
fn an_operator_built_at_run_time_joins_a_sessions_registry() {
    lexicon::link();
    let home = tempfile::tempdir().unwrap();
    let session = stretto::Session::builder(home.path()).memo_off().build().unwrap();
    // The factory's operator is already there under its name: registering another of that name is refused.
    let again = Arc::new(lexicon::LexiconFilter::new(Default::default()));
    assert!(session.register(again).unwrap_err().to_string().contains("lexicon"));
}

/// The suite every operator must pass: one answer per tuple, honest costs, and answers that belong to the tuple
/// alone (the same when asked again, in another order, or beside other tuples).
#[test]
fn the_plugin_passes_the_conformance_suite() {
    lexicon::link();
    let home = tempfile::tempdir().unwrap();
    let session = stretto::Session::builder(home.path()).memo_off().build().unwrap();
    let op = session.registry().get("lexicon").unwrap();
    let task = SemanticTask::filter("positive", "{r.text} is clearly positive");
    assert_eq!(stretto::core::conformance::check(&op, &task, &reviews()), Vec::<String>::new());
}
