//! The SemBench movie scenario in `examples/sql/sembench-movie`: every query says how it is scored, the
//! single-statement ones plan as one semantic pipeline, and every truth query runs on the bundled labels and scores
//! itself perfectly (so a bad score in the bench is the answer's, not the harness's).

use std::path::PathBuf;

use stretto_bench::sembench::{query_files, score, scoring_of, Score, Scoring};

fn scenario() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/sql/sembench-movie")
}

#[test]
fn every_sembench_movie_query_is_scored_and_its_truth_scores_itself_perfectly() {
    let home = tempfile::tempdir().unwrap();
    let session = stretto::Session::builder(home.path()).build().unwrap();
    let files = query_files(&scenario()).unwrap();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "Q7", "Q8", "Q9", "Q10"]);
    for (name, path) in &files {
        let sql = std::fs::read_to_string(path).unwrap();
        let scoring = scoring_of(&sql).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(sql.contains("sem_filter(") || sql.contains("sem_map("), "{name} has no semantic function");
        let ctx = stretto_sql::SqlContext::new(&session).unwrap();
        if sql.matches(';').count() == 0 {
            // Planned (semantic functions checked, one pipeline placed) without running a model.
            let plan = ctx.sql(&sql).unwrap_or_else(|e| panic!("{name}: {e}")).explain().unwrap();
            assert_eq!(plan.matches("SemanticPipelineExec").count(), 1, "{name}:\n{plan}");
        }
        let truth_sql = std::fs::read_to_string(scenario().join("truth").join(format!("{name}.sql"))).unwrap();
        let truth = ctx.sql(&truth_sql).and_then(|f| f.collect()).and_then(|r| r.batch()).unwrap();
        assert!(truth.num_rows() > 0, "{name}: empty truth");
        let perfect = score(scoring, &truth, &truth).unwrap();
        match (scoring, perfect) {
            (Scoring::Rows { .. }, Score::F1 { f1, .. }) => assert_eq!(f1, 1.0, "{name}"),
            (Scoring::Value, Score::RelativeError { relative_error }) => assert_eq!(relative_error, 0.0, "{name}"),
            (Scoring::Rank, Score::Spearman { rho, common, truth }) => {
                assert!((rho - 1.0).abs() < 1e-9 && common == truth, "{name}: rho {rho}, {common} of {truth}")
            }
            (s, p) => panic!("{name}: {s:?} scored as {p:?}"),
        }
    }
}

#[test]
fn the_truth_of_the_counting_queries_is_what_the_labels_say() {
    // taken_3 has 120 bundled reviews, 14 of them labelled POSITIVE.
    let home = tempfile::tempdir().unwrap();
    let session = stretto::Session::builder(home.path()).build().unwrap();
    let ctx = stretto_sql::SqlContext::new(&session).unwrap();
    let run = |q: &str| {
        let sql = std::fs::read_to_string(scenario().join("truth").join(format!("{q}.sql"))).unwrap();
        ctx.sql(&sql).and_then(|f| f.collect()).and_then(|r| r.batch()).unwrap()
    };
    let q3 = run("Q3");
    assert_eq!(arrow::util::display::array_value_to_string(q3.column(0), 0).unwrap(), "14");
    let q4 = run("Q4");
    let ratio: f64 = arrow::util::display::array_value_to_string(q4.column(0), 0).unwrap().parse().unwrap();
    assert!((ratio - 14.0 / 120.0).abs() < 1e-12);
    // Q5 and Q6 split the ordered pairs of two different reviews between them: the movie's 128 reviews (each
    // listed twice, 256 rows) make 128 × 127 distinct pairs.
    assert_eq!(run("Q5").num_rows() + run("Q6").num_rows(), 128 * 127);
}

#[test]
fn with_the_label_standing_in_for_the_model_every_filter_query_answers_perfectly() {
    // The semantic filter replaced by the human label it stands for: what is left is the query's relational part,
    // which must then reach a perfect score (so the SQL around the model asks the question SemBench asks).
    let home = tempfile::tempdir().unwrap();
    let session = stretto::Session::builder(home.path()).build().unwrap();
    let mut checked = 0;
    for (name, path) in query_files(&scenario()).unwrap() {
        let sql = std::fs::read_to_string(&path).unwrap();
        if sql.contains("sem_map(") {
            continue;
        }
        let mut relational = String::new();
        let mut rest = sql.as_str();
        while let Some(at) = rest.find("sem_filter('") {
            relational.push_str(&rest[..at]);
            let after = &rest[at + "sem_filter('".len()..];
            let end = after.find("')").unwrap();
            let predicate = &after[..end];
            // A join predicate compares the two sides' labels; a filter's asks for the positive one.
            relational.push_str(if !predicate.contains("{r2.") {
                "scoresentiment = 'POSITIVE'"
            } else if predicate.contains("same sentiment") {
                "r1.scoresentiment = r2.scoresentiment"
            } else {
                assert!(predicate.contains("opposite sentiments"), "{name}: {predicate}");
                "r1.scoresentiment <> r2.scoresentiment"
            });
            rest = &after[end + 2..];
        }
        relational.push_str(rest);
        // The join's sides select the review text only: the label comes along for the stand-in.
        let relational = relational.replace("reviewid, reviewtext FROM", "reviewid, reviewtext, scoresentiment FROM");
        let ctx = stretto_sql::SqlContext::new(&session).unwrap();
        let answer = ctx.sql(&relational).and_then(|f| f.collect()).and_then(|r| r.batch());
        let answer = answer.unwrap_or_else(|e| panic!("{name}: {e}\n{relational}"));
        let truth_sql = std::fs::read_to_string(scenario().join("truth").join(format!("{name}.sql"))).unwrap();
        let truth = ctx.sql(&truth_sql).and_then(|f| f.collect()).and_then(|r| r.batch()).unwrap();
        let (metric, value) = score(scoring_of(&sql).unwrap(), &answer, &truth).unwrap().headline();
        let perfect = if metric == "relative error" { 0.0 } else { 1.0 };
        assert_eq!(value, perfect, "{name}: {metric} {value}\n{relational}");
        checked += 1;
    }
    assert_eq!(checked, 8, "Q1-Q8 are filter and join queries");
}
