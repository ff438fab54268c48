//! Smoke runs of the experiments (`--scale tiny`: one movie query on 40 reviews), `bench all` included.

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
            // From the right: optimizer s, profiling s, fell_back, operators, stages, gold cost, cost, recall, precision.
            let precision: f64 = line.rsplit(',').nth(8).unwrap().parse().unwrap();
            assert!((0.0..=1.0).contains(&precision), "{line}");
        }
        for svg in ["target_met.svg", "runtime.svg"] {
            let text = std::fs::read_to_string(out.join(svg)).unwrap();
            assert!(text.starts_with("<svg") && text.contains(methods[1]), "{svg}");
        }
    }
}

#[test]
fn bench_all_writes_every_experiment_and_the_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("all");
    let (ok, stdout, err) = stretto(&["bench", "all", "--scale", "tiny", "--out", out.to_str().unwrap()], dir.path());
    assert!(ok, "{err}");
    // The comparison names every published figure beside ours.
    for published in ["7.6% of queries", "6.4% of queries", "1.84×", "1.43×", "1.36×", "1.2×"] {
        assert!(stdout.contains(published), "{published} missing:\n{stdout}");
    }
    assert_eq!(stdout, std::fs::read_to_string(out.join("summary.md")).unwrap());
    // Experiments 1 and 3 share one profiling of the query: each has 3 methods × 3 targets.
    for exp in ["exp1", "exp3"] {
        let csv = std::fs::read_to_string(out.join(exp).join("results.csv")).unwrap();
        assert_eq!(csv.lines().count(), 1 + 9, "{csv}");
    }
    let exp2 = out.join("exp2");
    let points = std::fs::read_to_string(exp2.join("profiles.csv")).unwrap();
    // Every profiled operator of the single filter: 3 SmolLM2 rungs, MiniLM, keyword. SmolLM2 derives no opposite
    // of "mentions terrible dialogue", so its contrast filter declines the task and is not profiled.
    assert_eq!(points.lines().count(), 1 + 5, "{points}");
    assert!(!points.contains("llm-contrast:"), "{points}");
    assert!(points.contains("-0.50,") && points.contains("-0.80,"));
    // One query at each of the three targets.
    assert_eq!(std::fs::read_to_string(exp2.join("speedup.csv")).unwrap().lines().count(), 1 + 3);
    let summary = std::fs::read_to_string(exp2.join("summary.md")).unwrap();
    assert!(summary.contains("speedup (execution)"), "{summary}");
    for svg in ["profiles.svg", "speedup.svg"] {
        assert!(std::fs::read_to_string(exp2.join(svg)).unwrap().starts_with("<svg"), "{svg}");
    }
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
