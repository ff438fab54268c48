//! Smoke runs of the experiments (`--scale tiny`: one movie query on 40 reviews).

mod common;
use common::stretto;

#[test]
fn exp1_and_exp3_write_results_and_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    for (exp, methods) in [("exp1", ["global", "lotus", "abacus"]), ("exp3", ["global", "local", "independent"])] {
        let out = dir.path().join(exp);
        let (ok, stdout, err) = stretto(&["bench", exp, "--scale", "tiny", "--out", out.to_str().unwrap()], dir.path());
        assert!(ok, "{err}");
        let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
        // One query × 3 methods × 3 targets.
        assert_eq!(csv.lines().count(), 1 + 9, "{csv}");
        for m in methods {
            assert!(csv.contains(&format!(",{m},")), "{m} missing in {csv}");
            assert!(stdout.contains(&format!("| {m} |")), "{stdout}");
        }
        for line in csv.lines().skip(1) {
            let precision: f64 = line.rsplit(',').nth(7).unwrap().parse().unwrap();
            assert!((0.0..=1.0).contains(&precision), "{line}");
        }
    }
}

#[test]
fn exp2_measures_every_profile_and_the_speedup() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("exp2");
    let (ok, stdout, err) = stretto(&["bench", "exp2", "--scale", "tiny", "--out", out.to_str().unwrap()], dir.path());
    assert!(ok, "{err}");
    assert!(stdout.contains("speedup (execution)"), "{stdout}");
    let points = std::fs::read_to_string(out.join("profiles.csv")).unwrap();
    // Every profiled operator of the single filter: 3 SmolLM2 rungs, MiniLM, keyword.
    assert_eq!(points.lines().count(), 1 + 5, "{points}");
    assert!(points.contains("-0.50,") && points.contains("-0.80,"));
    assert_eq!(std::fs::read_to_string(out.join("speedup.csv")).unwrap().lines().count(), 2);
}

#[test]
fn generated_queries_parse() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = stretto(&["bench", "queries", "--dataset", "email"], dir.path());
    assert!(ok, "{err}");
    assert!(out.lines().count() >= 10);
    for q in out.lines() {
        assert!(stretto_bench::query::parse_query(q).is_ok(), "{q}");
    }
}
