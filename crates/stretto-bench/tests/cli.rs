//! The `stretto` binary's contract: subcommands, output and errors.

use std::path::{Path, PathBuf};
use std::process::Command;

use arrow::array::AsArray;

fn stretto(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_stretto")).args(args).output().expect("binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn datasets_lists_every_bundled_dataset_with_rows() {
    let (ok, out, err) = stretto(&["datasets"]);
    assert!(ok, "{err}");
    for (name, rows) in
        [("movie", "1000"), ("email", "1000"), ("rotowire", "728"), ("ecommerce", "1000"), ("artwork", "1000")]
    {
        let line = out.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} missing:\n{out}"));
        assert!(line.split_whitespace().any(|w| w == rows), "{line}");
    }
}

#[test]
fn ops_lists_registered_operators() {
    let (ok, out, err) = stretto(&["ops", "--json"]);
    assert!(ok, "{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let kw = rows.as_array().unwrap().iter().find(|r| r["name"] == "keyword").expect("keyword listed");
    assert_eq!(kw["plugin"], "stretto-ops-text");
    assert_eq!(kw["kind"], "filter");
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'').filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
}

#[test]
fn run_plan_executes_the_example_on_real_reviews() {
    let plan = repo().join("examples/plans/movie-keywords.json");
    let out = stretto_bench::commands::run_plan(&stretto::OpContext::from_env().unwrap(), "movie", &plan, None, false)
        .unwrap();
    assert_eq!(out.input_rows, 1000);
    let texts = out.cascade.batch.column_by_name("reviews.reviewtext").unwrap().as_string::<i32>().clone();
    assert!(!out.cascade.is_empty());
    for t in texts.iter().flatten() {
        let w = words(t);
        assert!(["performance", "acting", "cast"].iter().any(|k| w.iter().any(|x| x == k)), "{t}");
        assert!(["best", "great", "brilliant"].iter().any(|k| w.iter().any(|x| x == k)), "{t}");
    }
    // Every tuple the first stage rejected was skipped by the second at no cost.
    let s = &out.cascade.stats;
    assert_eq!(s[1].tuples_in, 1000 - s[0].rejected);
    assert_eq!(s[1].accepted, out.cascade.len());

    let (ok, stdout, err) =
        stretto(&["run-plan", "--dataset", "movie", "--plan", plan.to_str().unwrap(), "--limit", "50"]);
    assert!(ok, "{err}");
    assert!(stdout.starts_with("50 input tuples"), "{stdout}");
    assert!(stdout.contains("acting/keyword") && stdout.contains("praise/keyword"), "{stdout}");
}

#[test]
fn run_plan_errors_name_the_culprit() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let logical = r#""logical":[{"name":"a","kind":"filter","prompt":"{reviews.reviewtext} mentions \"great\""}]"#;
    let cases = [
        (
            write(
                "stage.json",
                &format!(r#"{{"format":"stretto.plan/v1",{logical},"stages":[{{"physical":"zzz/keyword"}}]}}"#),
            ),
            "movie",
            "zzz",
        ),
        (
            write(
                "op.json",
                &format!(r#"{{"format":"stretto.plan/v1",{logical},"stages":[{{"physical":"a/gpt-17"}}]}}"#),
            ),
            "movie",
            "gpt-17",
        ),
        (
            write(
                "col.json",
                r#"{"format":"stretto.plan/v1","logical":[{"name":"a","kind":"filter","prompt":"{reviews.nope}"}],"stages":[{"physical":"a/keyword"}]}"#,
            ),
            "movie",
            "reviews.nope",
        ),
        (
            write(
                "table.json",
                &format!(r#"{{"format":"stretto.plan/v1",{logical},"stages":[{{"physical":"a/keyword"}}]}}"#),
            ),
            "email",
            "reviews",
        ),
        (write("bad.json", "{ not json"), "movie", "bad.json"),
    ];
    for (path, dataset, needle) in cases {
        let (ok, _, err) = stretto(&["run-plan", "--dataset", dataset, "--plan", &path]);
        assert!(!ok, "{path} should fail");
        assert!(err.starts_with("error:") && err.contains(needle), "{path}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
