//! `stretto generate` and `stretto embed` on the CI-sized models (SmolLM2-135M, MiniLM).

use std::process::Command;

fn stretto(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_stretto")).args(args).output().expect("binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn generate_answers_the_capital_question() {
    let (ok, out, err) =
        stretto(&["generate", "--model", "smollm2-135m", "--prompt", "What is the capital of France?"]);
    assert!(ok, "{err}");
    assert!(out.contains("Paris"), "{out}");
    let (ok, out, err) = stretto(&["generate", "--prompt", "What is the capital of France?", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["text"].as_str().unwrap().contains("Paris"));
    assert_eq!(v["stopped"], true);
}

#[test]
fn embed_prints_unit_vectors_and_similarities() {
    let (ok, out, err) = stretto(&["embed", "A man is eating food.", "A man is eating a piece of bread."]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    let v: Vec<f32> = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(v.len(), 384);
    assert!(lines[2].starts_with("0.755"), "{out}");
}

#[test]
fn models_of_the_wrong_kind_are_clear_errors() {
    let (ok, _, err) = stretto(&["generate", "--model", "minilm", "--prompt", "hi"]);
    assert!(!ok);
    assert!(err.contains("not a decoder"), "{err}");
    let (ok, _, err) = stretto(&["embed", "--model", "smollm2-135m", "hi"]);
    assert!(!ok);
    assert!(err.contains("not a sentence encoder"), "{err}");
    let (ok, _, err) = stretto(&["generate", "--model", "gpt-9", "--prompt", "hi"]);
    assert!(!ok);
    assert!(err.contains("unknown model"), "{err}");
}
