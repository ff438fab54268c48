//! The library as a user meets it: a `Session` over files the test writes itself, the example pipeline, two
//! sessions side by side, and typed errors for bad input.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use stretto::core::datasets::Dataset;
use stretto::core::memo::{memo_key, Memo, MemoEntry};
use stretto::core::op::{OpOutput, SemanticTask};
use stretto::{Error, Gold, Session, Targets};

#[path = "../examples/pipeline.rs"]
mod example;

/// A session whose caches and answers live in `dir`, with models from the environment's home (prepared once).
fn session(dir: &Path) -> Session {
    Session::builder(stretto::core::context::default_home())
        .kv_dir(dir.join("kv"))
        .memo_dir(dir.join("memo"))
        .build()
        .expect("session builds")
}

/// The first `n` bundled reviews, reduced to the columns a user's file might have, written as `dir/reviews.csv`.
fn write_reviews_csv(dir: &Path, n: usize) -> PathBuf {
    let ds = Dataset::load("movie").unwrap();
    let reviews = ds.table("reviews").unwrap().slice(0, n);
    let keep = ["reviewid", "istopcritic", "reviewtext"];
    let schema = reviews.schema();
    let idx: Vec<usize> = keep.iter().map(|c| schema.index_of(c).unwrap()).collect();
    let batch = reviews.project(&idx).unwrap();
    let path = dir.join("reviews.csv");
    let mut w = arrow::csv::WriterBuilder::new().with_header(true).build(std::fs::File::create(&path).unwrap());
    w.write(&batch).unwrap();
    path
}

fn ids(batch: &RecordBatch) -> Vec<i64> {
    let c = batch.column_by_name("reviews.reviewid").expect("reviewid column");
    let c = arrow::compute::cast(c, &DataType::Int64).unwrap();
    let mut v: Vec<i64> = c.as_primitive::<arrow::datatypes::Int64Type>().values().to_vec();
    v.sort_unstable();
    v
}

/// The example's pipeline, composed again over any frame of the reviews table.
fn top_critics_positive_titles(frame: stretto::DataFrame) -> stretto::DataFrame {
    frame
        .filter(stretto::col("reviews.istopcritic").eq(stretto::lit(true)))
        .unwrap()
        .sem_filter("{reviews.reviewtext} is clearly positive")
        .unwrap()
        .sem_map("title", "Extract the movie title mentioned in {reviews.reviewtext}", stretto::ValueType::String)
        .unwrap()
}

#[test]
fn the_example_pipeline_runs_on_a_csv_and_a_parquet_file_and_meets_its_targets() {
    let dir = tempfile::tempdir().unwrap();
    let csv = write_reviews_csv(dir.path(), 160);
    let s = session(dir.path());
    let out = dir.path().join("positive.parquet");
    let result = example::pipeline(&s, &csv, &out, 160).expect("pipeline runs");

    // The schema a user expects: the file's columns, qualified by the table (the file stem), plus the map's column.
    let names: Vec<String> = result.batch().schema().fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(names, ["reviews.reviewid", "reviews.istopcritic", "reviews.reviewtext", "title"]);
    assert!(result.batch().num_rows() > 0, "no clearly positive top-critic review among 160");
    let top = result.batch().column(1).as_boolean();
    assert!((0..top.len()).all(|i| top.value(i)), "the relational filter let a non-top critic through");
    let first_stage_in = result.stages().first().map(|s| s.tuples_in).unwrap_or(0);
    assert!(first_stage_in < 160, "the relational filter ran before the semantic stages ({first_stage_in} in)");

    // The Parquet file holds exactly the result.
    let written = stretto::io::read_parquet(&out, &Default::default()).unwrap();
    assert_eq!(written.num_rows(), result.batch().num_rows());
    assert_eq!(ids(&written), ids(result.batch()));

    // --check: against the gold plan on every tuple, the result meets its targets, or the optimizer said it fell
    // back to gold, and then it is gold's result exactly (a fallback is not a licence to answer anything).
    let frame = top_critics_positive_titles(s.read_csv(&csv, &Default::default()).unwrap());
    let gold = frame.collect_with(Targets::new(0.8, 0.8, 0.95).unwrap(), &Gold).unwrap();
    let (got, truth) = (ids(result.batch()), ids(gold.batch()));
    let tp = got.iter().filter(|i| truth.contains(i)).count() as f64;
    let (p, r) = (tp / got.len().max(1) as f64, tp / truth.len().max(1) as f64);
    if result.fell_back_to_gold() {
        assert_eq!(got, truth, "a gold fallback that is not gold's result");
    } else {
        assert!(p >= 0.8 && r >= 0.8, "precision {p}, recall {r} against gold");
    }

    // The same data as Parquet gives the same rows (the table is named after the file stem again).
    let pq = dir.path().join("reviews.parquet");
    let batch = stretto::io::read_csv(&csv, &Default::default()).unwrap();
    stretto::io::write(&batch, &pq, stretto::FileFormat::Parquet).unwrap();
    let from_parquet = top_critics_positive_titles(s.read_parquet(&pq, &Default::default()).unwrap())
        .collect(Targets::new(0.8, 0.8, 0.95).unwrap())
        .unwrap();
    assert_eq!(ids(from_parquet.batch()), ids(result.batch()));
}

fn one_review() -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("r.text", DataType::Utf8, false)])),
        vec![Arc::new(StringArray::from(vec!["A warm, funny and moving film."]))],
    )
    .unwrap()
}

#[test]
fn two_sessions_with_different_memo_dirs_do_not_see_each_others_answers() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (session(a_dir.path()), session(b_dir.path()));
    let task = SemanticTask::filter("f", "{r.text} is clearly positive");
    let batch = one_review();
    // An answer only session A's memo holds: an impossible cosine.
    let op = "embed:minilm";
    let prompt = serde_json::to_string(&task).unwrap();
    let key = memo_key(op, &prompt, "A warm, funny and moving film.");
    Memo::open(&a_dir.path().join("memo"), op)
        .unwrap()
        .put(vec![MemoEntry { key, score: Some(42.0), value: None, confidence: None, seconds: 0.5 }])
        .unwrap();

    let score = |s: &Session| match s.registry().get(op).unwrap().evaluate_timed(&task, &batch).unwrap().0 {
        OpOutput::Scores(v) => v[0],
        other => panic!("{other:?}"),
    };
    assert_eq!(score(&a), 42.0, "session A reads its own memo");
    let real = score(&b);
    assert!(real.abs() <= 1.0, "session B computed a real cosine, not A's answer: {real}");
    assert!(b_dir.path().join("memo").join("embed_minilm.jsonl").is_file(), "B memoised its answer in its own dir");
    assert_eq!(score(&a), 42.0, "B's answer did not leak into A");
}

/// A session owns its models: its operators' models stay loaded between its queries and are freed when it is
/// dropped (no other session of this test binary runs a model on 3 threads, so none shares the copy).
#[test]
fn dropping_a_session_frees_the_models_its_operators_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let home = stretto::core::context::default_home();
    let s = Session::builder(home.clone()).kv_dir(dir.path().join("kv")).memo_off().threads(3).build().unwrap();
    let loaded = || stretto::kv::pool::is_loaded(&home, 3usize, "smollm2-135m");
    assert!(!loaded());
    let task = SemanticTask::filter("f", "{r.text} is clearly positive");
    let op = "llm:smollm2-135m@expected-attention-0.00";
    s.registry().get(op).unwrap().evaluate_timed(&task, &one_review()).unwrap();
    assert!(loaded(), "the session keeps its operator's model for its next query");
    s.registry().get(op).unwrap().evaluate_timed(&task, &one_review()).unwrap();
    assert_eq!(s.config().operators.models.len(), 1, "one copy, held once");
    drop(s);
    assert!(!loaded(), "freed with the session");
}

#[test]
fn bad_input_gives_typed_errors_naming_the_culprit() {
    let dir = tempfile::tempdir().unwrap();
    let s = Session::builder(dir.path().join("home")).memo_off().build().unwrap();

    // Sample settings outside their domain are refused when the session is built.
    for (fraction, max, want) in
        [(0.0, 600, "sample fraction 0 is outside (0, 1]"), (1.5, 600, "1.5"), (0.15, 0, "max sample")]
    {
        let built = Session::builder(dir.path().join("home")).memo_off().sample(fraction, 40).max_sample(max).build();
        let e = built.err().unwrap_or_else(|| panic!("sample {fraction}, max {max} should be refused")).to_string();
        assert!(e.contains(want), "{e}");
    }

    let missing = dir.path().join("nowhere.csv");
    match s.read_csv(&missing, &Default::default()) {
        Err(e @ Error::Read { .. }) => assert!(e.to_string().contains("nowhere.csv"), "{e}"),
        other => panic!("{other:?}"),
    }

    let ragged = dir.path().join("ragged.csv");
    std::fs::write(&ragged, "id,text\n1,fine\n2,one,too many\n").unwrap();
    let e = s.read_csv(&ragged, &Default::default()).unwrap_err().to_string();
    assert!(e.contains("ragged.csv") && e.contains("line"), "{e}");

    // A Parquet file without the column the prompt references.
    let pq = dir.path().join("r.parquet");
    stretto::io::write(&one_review(), &pq, stretto::FileFormat::Parquet).unwrap();
    let e = s.read_parquet(&pq, &Default::default()).unwrap().sem_filter("{r.body} is positive").unwrap_err();
    assert!(e.to_string().contains("r.body"), "{e}");

    // An image path that does not exist.
    let imgs = dir.path().join("imgs.csv");
    std::fs::write(&imgs, "id,photo\n1,missing.jpg\n").unwrap();
    let e = s.read_csv(&imgs, &stretto::CsvOptions::default().with_image_column("photo")).unwrap_err().to_string();
    assert!(e.contains("missing.jpg") && e.contains("photo"), "{e}");

    // Output into a folder that does not exist: an error, and nothing written anywhere.
    let out = dir.path().join("no-such-folder").join("out.parquet");
    let e = stretto::io::write(&one_review(), &out, stretto::FileFormat::Parquet).unwrap_err();
    assert!(matches!(e, Error::Write { .. }) && e.to_string().contains("no-such-folder"), "{e}");
    assert!(!dir.path().join("no-such-folder").exists());

    // After a limit on results, another operation would run before the truncation: refused, saying why.
    let limited = s.read_parquet(&pq, &Default::default()).unwrap().sem_filter("{r.r.text} is positive").unwrap();
    let e = limited.limit(1).unwrap().sem_filter("{r.r.text} is long").unwrap_err().to_string();
    assert!(e.contains("limit(1)") && e.contains("last operation"), "{e}");

    // A frame without a semantic operation says so.
    let e = s.read_parquet(&pq, &Default::default()).unwrap().collect(Targets::new(0.9, 0.9, 0.95).unwrap());
    assert!(e.unwrap_err().to_string().contains("no semantic operation"));
}

#[test]
fn a_limit_on_the_input_is_lazy_and_a_limit_on_results_cannot_feed_a_join() {
    let dir = tempfile::tempdir().unwrap();
    let csv = write_reviews_csv(dir.path(), 40);
    let s = session(dir.path());
    let frame = s
        .read_csv(&csv, &Default::default())
        .unwrap()
        .filter(stretto::col("reviews.istopcritic").eq(stretto::lit(true)))
        .unwrap()
        .limit(3)
        .unwrap()
        .sem_filter("{reviews.reviewtext} is clearly positive")
        .unwrap();
    // The limit is a node of the plan, above the filter it follows, not a table computed when it was composed.
    let plan = frame.logical_plan();
    let shown = plan.to_string();
    let (limit, filter) = (shown.find("Limit 3").expect("a Limit node"), shown.find("Filter (").unwrap());
    assert!(limit < filter && shown.contains("Scan reviews"), "{shown}");
    // The semantic operators see the first three top critics' reviews.
    let input = plan.pull_up().unwrap().relational.execute_relational().unwrap();
    assert_eq!(input.num_rows(), 3);
    let top = input.column_by_name("reviews.istopcritic").unwrap().as_boolean();
    assert!((0..3).all(|i| top.value(i)), "the relational filter runs before the limit");

    // A frame limited after a semantic operation cannot be another frame's input: its first results are only known
    // once the whole query has run.
    let results = s.read_csv(&csv, &Default::default()).unwrap().sem_filter("{reviews.reviewtext} is long").unwrap();
    let results = results.limit(2).unwrap();
    let other = s.read_file(&csv, Some("other")).unwrap();
    let e = other.join(results, &[("other.reviewid", "reviews.reviewid")]).unwrap_err().to_string();
    assert!(e.contains("join") && e.contains("limit(2)"), "{e}");
}

#[test]
fn relational_filters_that_keep_no_row_give_an_empty_result_without_running_anything() {
    let dir = tempfile::tempdir().unwrap();
    let csv = write_reviews_csv(dir.path(), 40);
    let s = session(dir.path());
    let none = top_critics_positive_titles(
        s.read_csv(&csv, &Default::default())
            .unwrap()
            .filter(stretto::col("reviews.reviewid").lt(stretto::lit(0)))
            .unwrap(),
    );
    let r = none.clone().collect(Targets::new(0.9, 0.9, 0.95).unwrap()).unwrap();
    assert_eq!(r.batch().num_rows(), 0);
    let names: Vec<&str> = r.batch().schema_ref().fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["reviews.reviewid", "reviews.istopcritic", "reviews.reviewtext", "title"]);
    assert!(r.plan().stages.is_empty() && r.plan().warnings[0].contains("no rows to query"), "{:?}", r.plan());
    assert!(!dir.path().join("kv").exists() && !dir.path().join("memo").exists(), "nothing was prepared or asked");
    // Labels must still align with the (empty) input.
    let one = stretto::engine::TruthLabels { column: "is_positive".into(), values: vec![Some(true)] };
    let e = none.with_labels(one).collect(Targets::new(0.9, 0.9, 0.95).unwrap()).unwrap_err().to_string();
    assert!(e.contains("1 values for 0 input tuples"), "{e}");
}

#[test]
fn a_saved_profile_is_re_optimized_offline_under_other_targets_and_strategies() {
    let dir = tempfile::tempdir().unwrap();
    let csv = write_reviews_csv(dir.path(), 80);
    // Model-free and MiniLM operators only: profiling costs seconds.
    let s = Session::builder(stretto::core::context::default_home())
        .kv_dir(dir.path().join("kv"))
        .memo_dir(dir.path().join("memo"))
        .models(["minilm"])
        .sample(0.5, 40)
        .run_dir(dir.path().join("run"))
        .build()
        .unwrap();
    let frame = s.read_csv(&csv, &Default::default()).unwrap().sem_filter("{reviews.reviewtext} is clearly positive");
    let frame = frame.unwrap();
    let profiled = frame.profile().unwrap();
    let saved = dir.path().join("profile.json");
    profiled.save_profile(&saved).unwrap();

    let reloaded = frame.with_profile(&saved).unwrap();
    for t in [0.5, 0.9] {
        let targets = Targets::new(t, t, 0.95).unwrap();
        let (a, b) = (
            profiled.optimize(targets, &stretto::Global::default()).unwrap(),
            reloaded.optimize(targets, &stretto::Global::default()).unwrap(),
        );
        assert_eq!(a.plan().stages, b.plan().stages, "the same profile gives the same plan at {t}");
        assert_eq!(a.bounds(), b.bounds());
    }
    // Executing a plan chosen offline: the result is the plan's, and the gold strategy's plan is gold's.
    let lotus = reloaded.optimize(Targets::new(0.8, 0.8, 0.95).unwrap(), &stretto::Lotus).unwrap();
    let gold = reloaded.optimize(Targets::new(0.8, 0.8, 0.95).unwrap(), &Gold).unwrap();
    assert_eq!(gold.bounds(), (1.0, 1.0));
    assert_ne!(gold.plan().stages, lotus.plan().stages);
    let result = reloaded.execute(&lotus).unwrap();
    assert_eq!(result.plan().stages, lotus.plan().stages);
    // The run directory keeps the plan that ran, not the last one optimized.
    let kept = stretto::core::format::PlanFile::read(&dir.path().join("run").join("plan.json")).unwrap();
    assert_eq!(kept.stages, lotus.plan().stages);

    // A profile of another pipeline is refused, naming both.
    let other = s.read_csv(&csv, &Default::default()).unwrap().sem_filter("{reviews.reviewtext} is clearly positive");
    let other = other.unwrap().sem_filter("{reviews.reviewtext} mentions the cast").unwrap();
    let e = other.with_profile(&saved).unwrap_err().to_string();
    assert!(e.contains("profile.json") && e.contains("filter_2"), "{e}");
    // So is one of a pipeline of the same shape asking another question: its thresholds and bounds are not this
    // question's.
    let negative = s.read_csv(&csv, &Default::default()).unwrap().sem_filter("{reviews.reviewtext} is negative");
    let e = negative.unwrap().with_profile(&saved).unwrap_err().to_string();
    assert!(e.contains("is clearly positive") && e.contains("is negative") && e.contains("filter_1"), "{e}");
    // So is one made on other data of the same length (the same reviews in reverse order), while the profile the run
    // directory kept is reused as the saved one is.
    let rows = stretto::io::read_csv(&csv, &Default::default()).unwrap();
    let reversed = arrow::compute::take_record_batch(
        &rows,
        &arrow::array::UInt32Array::from_iter_values((0..rows.num_rows() as u32).rev()),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("reversed")).unwrap();
    let other_csv = dir.path().join("reversed").join("reviews.csv");
    stretto::io::write(&reversed, &other_csv, stretto::FileFormat::Csv).unwrap();
    let other = s.read_csv(&other_csv, &Default::default()).unwrap();
    let e = other.sem_filter("{reviews.reviewtext} is clearly positive").unwrap().with_profile(&saved).unwrap_err();
    assert!(e.to_string().contains("was made on other data"), "{e}");
    frame.with_profile(dir.path().join("run").join("profile.json")).unwrap();
}

#[test]
fn results_are_scored_against_true_labels_given_with_the_frame() {
    let dir = tempfile::tempdir().unwrap();
    let s = session(dir.path());
    let ds = Dataset::load("movie").unwrap();
    let reviews = ds.table("reviews").unwrap().slice(0, 40);
    s.register_batch("reviews", reviews).unwrap();
    let labels = stretto::engine::TruthLabels::bundled(&ds, "reviews", "is_positive", 40).unwrap();
    let positives = labels.values.iter().flatten().filter(|v| **v).count();
    let frame = s.table("reviews").unwrap().sem_filter("{reviews.reviewtext} is clearly positive").unwrap();
    let r = frame.clone().with_labels(labels.clone()).collect(Targets::new(0.8, 0.8, 0.95).unwrap()).unwrap();
    let t = r.truth().expect("labels given, truth reported");
    let rows = r.batch().num_rows();
    assert_eq!(
        t["plan"]["true_positives"].as_u64().unwrap() + t["plan"]["false_positives"].as_u64().unwrap(),
        rows as u64
    );
    assert_eq!(t["positives"], positives);
    assert!(frame.clone().collect(Targets::new(0.8, 0.8, 0.95).unwrap()).unwrap().truth().is_none());
    // Labels that do not align with the frame's tuples are an error, not a silently wrong figure.
    let short = stretto::engine::TruthLabels { column: "is_positive".into(), values: labels.values[..10].to_vec() };
    let e = frame.with_labels(short).collect(Targets::new(0.8, 0.8, 0.95).unwrap()).unwrap_err().to_string();
    assert!(e.contains("10 values for 40 input tuples"), "{e}");
}

/// A semantic join through the whole engine, scored against the truth: 8 reviews of three movies (their bundled ids)
/// joined with the three titles.
#[test]
fn a_semantic_join_pairs_reviews_with_the_movie_they_review() {
    let dir = tempfile::tempdir().unwrap();
    let s = session(dir.path());
    let ds = Dataset::load("movie").unwrap();
    let reviews = ds.table("reviews").unwrap();
    // Reviews of three movies whose titles the reviews name, and the three titles.
    let ids = reviews.column_by_name("id").unwrap().as_string::<i32>().clone();
    let wanted =
        [("top_gun_maverick", "Top Gun: Maverick"), ("knives_out", "Knives Out"), ("the_batman", "The Batman")];
    let rows: Vec<u32> = (0..reviews.num_rows())
        .filter(|&i| wanted.iter().any(|(id, _)| ids.value(i) == *id))
        .take(8)
        .map(|i| i as u32)
        .collect();
    let picked = arrow::compute::take_record_batch(reviews, &arrow::array::UInt32Array::from(rows)).unwrap();
    let keep = ["id", "reviewtext"].map(|c| picked.schema().index_of(c).unwrap());
    s.register_batch("reviews", picked.project(&keep).unwrap()).unwrap();
    let movies = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("title", DataType::Utf8, false)])),
        vec![Arc::new(StringArray::from(wanted.iter().map(|(_, t)| *t).collect::<Vec<_>>()))],
    )
    .unwrap();
    s.register_batch("movies", movies).unwrap();
    let joined = s
        .table("reviews")
        .unwrap()
        .sem_join(s.table("movies").unwrap(), "{reviews.reviewtext} is a review of the movie {movies.title}")
        .unwrap();
    let r = joined.collect_with(Targets::new(0.8, 0.8, 0.95).unwrap(), &Gold).unwrap();
    let b = r.batch();
    let names: Vec<String> = b.schema().fields().iter().map(|f| f.name().clone()).collect();
    assert!(
        names.contains(&"reviews.reviewtext".to_string()) && names.contains(&"movies.title".to_string()),
        "{names:?}"
    );
    let (rid, title) = (
        b.column_by_name("reviews.id").unwrap().as_string::<i32>(),
        b.column_by_name("movies.title").unwrap().as_string::<i32>(),
    );
    let right =
        (0..b.num_rows()).filter(|&i| wanted.iter().any(|(id, t)| rid.value(i) == *id && title.value(i) == *t)).count();
    eprintln!("semantic join: {} pairs of {} candidates, {right} of them right", b.num_rows(), 8 * 3);
    // SmolLM2-135M's gold join, measured: 18 of the 24 pairs kept, 6 of the 8 true pairs among them (recall 0.75,
    // precision 0.33): no better than keeping 18 pairs at random (8 * 18 / 24 = 6 expected), so these floors only
    // catch a join that keeps nothing or everything; the join's quality waits on a stronger gold (#17).
    assert!(right >= 4, "only {right} of 8 true pairs found");
    assert!(b.num_rows() < 24, "every pair was kept");
}

/// A query on an image column through the whole engine, scored against the human labels: the first 30 bundled
/// product photos, "shows a t-shirt or a top" (the label bridge: EfficientNet classes read by MiniLM, and the
/// caption bridge) vs `is_tshirt_or_top`.
#[test]
fn a_query_on_product_photos_is_scored_against_the_labels() {
    let dir = tempfile::tempdir().unwrap();
    let s = session(dir.path());
    let ds = Dataset::load("ecommerce").unwrap();
    let products = ds.table("products").unwrap();
    let photo = products.column_by_name("photo").unwrap();
    let with_photo: Vec<usize> = (0..products.num_rows()).filter(|&i| photo.is_valid(i)).take(30).collect();
    let labels = ds.table("labels").unwrap();
    let top = labels.column_by_name("is_tshirt_or_top").unwrap().as_primitive::<arrow::datatypes::Int64Type>();
    let truth = stretto::engine::TruthLabels {
        column: "is_tshirt_or_top".into(),
        values: with_photo.iter().map(|&i| Some(top.value(i) == 1)).collect(),
    };
    let frame = s
        .dataset("ecommerce")
        .unwrap()
        .table("products")
        .unwrap()
        .filter(stretto::col("products.photo").is_null().not())
        .unwrap()
        .limit(30)
        .unwrap()
        .sem_filter("{products.photo} shows a t-shirt or a top")
        .unwrap()
        .with_labels(truth);
    let r = frame.collect(Targets::new(0.7, 0.7, 0.95).unwrap()).unwrap();
    let t = r.truth().unwrap();
    eprintln!("photos: {} kept; against is_tshirt_or_top: {}", r.batch().num_rows(), t["plan"]);
    assert_eq!(t["labelled"], 30);
    let kept = r.batch().num_rows() as u64;
    assert_eq!(t["plan"]["true_positives"].as_u64().unwrap() + t["plan"]["false_positives"].as_u64().unwrap(), kept);
    let image_ops = ["caption:", "label-bridge", "vlm:"];
    for st in &r.plan().stages {
        assert!(image_ops.iter().any(|p| st.physical.contains(p)), "not an image operator: {}", st.physical);
    }
    // No accuracy floor: the image gold is this weak today (measured: 12 photos kept, 1 of the 4 tops among them,
    // F1 0.125 against is_tshirt_or_top); a stronger image protocol is #17's work.
}

/// Adaptive profiling: every candidate answers a few tuples outside the sample first, and the profile holds only
/// the candidates that were neither hopeless nor dominated there, on tuples the screening never saw.
#[test]
fn screening_keeps_its_tuples_out_of_the_profile_and_its_dropped_candidates_out_of_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let build = |screen: usize| {
        Session::builder(stretto::core::context::default_home())
            .kv_dir(dir.path().join("kv"))
            .memo_dir(dir.path().join("memo"))
            .models(["smollm2-135m", "minilm"])
            .sample(0.25, 30)
            .screen(screen)
            .build()
            .unwrap()
    };
    let ds = Dataset::load("movie").unwrap();
    let frame = |s: &Session| {
        s.register_batch("reviews", ds.table("reviews").unwrap().slice(0, 160)).unwrap();
        s.table("reviews").unwrap().sem_filter("{reviews.reviewtext} is clearly positive").unwrap()
    };
    let whole = frame(&build(0)).profile().unwrap();
    assert!(whole.screening().is_none(), "screen 0 profiles every candidate on the whole sample");
    let all: Vec<String> = whole.profile().physical.iter().map(|e| e.name.clone()).collect();

    let screened = frame(&build(24)).profile().unwrap();
    let sc = screened.screening().expect("a screening stage ran");
    assert_eq!((sc.tuples, sc.rows.len()), (24, 24));
    assert!(sc.seconds > 0.0);
    eprintln!("screening dropped: {:#?}", sc.dropped);
    let profiled: Vec<&str> = screened.profile().tuples.iter().map(String::as_str).collect();
    assert_eq!(profiled, whole.profile().tuples.iter().map(String::as_str).collect::<Vec<_>>(), "same sample");
    for r in &sc.rows {
        assert!(!profiled.contains(&r.to_string().as_str()), "screening tuple {r} is in the profile");
    }
    let kept: Vec<String> = screened.profile().physical.iter().map(|e| e.name.clone()).collect();
    // Gold is never screened out, and every candidate is either profiled or dropped with a reason.
    assert_eq!(kept[0], all[0]);
    assert!(screened.profile().physical[0].gold);
    for d in &sc.dropped {
        let name = format!("{}/{}", d.logical, d.operator);
        assert!(!kept.contains(&name) && all.contains(&name), "{name}");
        assert!(!d.reason.is_empty());
    }
    assert_eq!(kept.len() + sc.dropped.len(), all.len(), "kept {kept:?}, dropped {:?}", sc.dropped);
    // The plan uses only profiled candidates and still certifies against gold.
    let r = screened.collect(Targets::new(0.8, 0.8, 0.95).unwrap()).unwrap();
    for st in &r.plan().stages {
        assert!(kept.iter().any(|k| k.ends_with(&format!("/{}", st.physical)) || *k == st.physical), "{st:?}");
    }
    let (p, rc) = r.bounds();
    assert!(r.fell_back_to_gold() || (p >= 0.8 && rc >= 0.8), "bounds {p} {rc}");
}

/// A ladder named on the builder is allowed in queries whatever `models` says, in either order; the default ladder's
/// models stay as the defaults allow them.
#[test]
fn a_named_ladder_is_allowed_in_queries() {
    let home = tempfile::tempdir().unwrap();
    let ladder = ["smollm2-135m", "qwen2.5-coder-1.5b"];
    let allowed = |b: stretto::SessionBuilder| b.build().unwrap().config().models.clone();
    let first = allowed(Session::builder(home.path()).ladder(ladder).models(["minilm"]));
    let last = allowed(Session::builder(home.path()).models(["minilm"]).ladder(ladder));
    for models in [&first, &last] {
        assert_eq!(models, &["minilm", "smollm2-135m", "qwen2.5-coder-1.5b"]);
    }
    let default = allowed(Session::builder(home.path()));
    assert_eq!(default, ["smollm2-135m", "minilm", "efficientnet-lite0"]);
}

/// The offline prefill on its own (`stretto bench all --prefill-only`): every input item's cache is built once, at
/// every ratio of the compression ladder, for the model the query's LLM candidates read; a second pass builds
/// nothing; no answer is asked or memoised; and a disk budget too small for the caches is an error, not a silent stop.
#[test]
fn prefill_builds_each_items_cache_once_and_asks_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let build = |kv: &str, budget: Option<u64>| {
        let b = Session::builder(stretto::core::context::default_home())
            .kv_dir(dir.path().join(kv))
            .memo_dir(dir.path().join("memo"))
            .ladder(["smollm2-135m"])
            .models(["smollm2-135m", "minilm"]);
        match budget {
            Some(bytes) => b.disk_budget(bytes),
            None => b,
        }
        .build()
        .unwrap()
    };
    let s = build("kv", None);
    let query = "{reviews.reviewtext} is clearly positive";
    let tasks = stretto::engine::parse_query(query).unwrap();
    let (input, pulled) = stretto::engine::input_of("movie", &tasks, Some(5)).unwrap();
    let mut o = stretto::engine::QueryOptions::new("movie", query);
    o.models = vec!["smollm2-135m".into(), "minilm".into()];
    let first = stretto::engine::prefill_pipeline(&s.registry(), &pulled, &input, &o).unwrap();
    let model = |p: &stretto::engine::Prefilled| p.models.iter().map(|(m, n)| (m.clone(), *n)).collect::<Vec<_>>();
    assert_eq!(model(&first), [("smollm2-135m".to_string(), (5, 5))]);
    let again = stretto::engine::prefill_pipeline(&s.registry(), &pulled, &input, &o).unwrap();
    assert_eq!(model(&again), [("smollm2-135m".to_string(), (5, 0))]);
    let memoised = std::fs::read_dir(dir.path().join("memo")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(memoised, 0, "the prefill asked an operator for answers");
    // Every rung's record is stored: the uncompressed past and each compressed one.
    let dec =
        stretto::ops_text::decoder(s.registry().context(), "smollm2-135m", stretto::kv::convert::Weights::F32).unwrap();
    let items: Vec<String> = tasks[0].known_items(&input).unwrap();
    for ratio in stretto::kv::cache::LADDER {
        let stored = stretto::kv::cache::PastSource::new(
            stretto::kv::store::Profile {
                model: "smollm2-135m".into(),
                press: stretto::kv::press::Press::ExpectedAttention,
                ratio,
                positions: stretto::kv::press::Positions::Keep,
            },
            dir.path().join("kv"),
        );
        for item in &items {
            assert!(stored.is_stored(&dec, item).unwrap(), "no cache at {ratio} for {item:.40}");
        }
    }
    // A budget that holds no record: the prefill says so, naming the budget, rather than reporting success.
    let tight = build("kv-tight", Some(1));
    let err = stretto::engine::prefill_pipeline(&tight.registry(), &pulled, &input, &o).unwrap_err().to_string();
    assert!(err.contains("STRETTO_DISK_BUDGET") && err.contains("smollm2-135m"), "{err}");
}
