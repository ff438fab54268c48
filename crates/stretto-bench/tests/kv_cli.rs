//! `stretto kv`: crash safety (SIGKILL at random points, then resume), verification and repair, on real reviews.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};

mod common;
use common::records_under;

const ITEMS: &str = "12";

fn stretto(kv_dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_stretto"))
        .args(args)
        .env("STRETTO_KV_DIR", kv_dir)
        .output()
        .expect("binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn build_args() -> Vec<&'static str> {
    vec!["kv", "build", "--dataset", "movie", "--column", "reviewtext", "--ratios", "0,0.5,0.8", "--limit", ITEMS]
}

/// Relative path → SHA-256 of every file under `root`.
fn digest_tree(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                let bytes = std::fs::read(&p).unwrap();
                // The compression calibration holds measured seconds, which no two runs share: what must match is
                // which figures it holds (each profile, pass and item once).
                let bytes = if rel == stretto::kv::calibration::CALIBRATION_FILE {
                    let mut keys: Vec<String> = String::from_utf8(bytes)
                        .unwrap()
                        .lines()
                        .map(|l| {
                            let v: serde_json::Value = serde_json::from_str(l).unwrap();
                            format!("{} {} {}", v["profile"], v["pass"], v["item"])
                        })
                        .collect();
                    keys.sort();
                    keys.dedup();
                    keys.join("\n").into_bytes()
                } else {
                    bytes
                };
                out.insert(rel, format!("{:x}", Sha256::digest(bytes)));
            }
        }
    }
    out
}

#[test]
fn killed_builds_resume_to_exactly_the_uninterrupted_records() {
    let clean = tempfile::tempdir().unwrap();
    let (ok, out, err) = stretto(clean.path(), &build_args());
    assert!(ok, "{err}");
    assert!(out.contains(&format!("built {ITEMS} items")), "{out}");
    let want = digest_tree(clean.path());
    assert_eq!(want.keys().filter(|k| k.ends_with(".safetensors")).count(), 3 * 12);
    assert!(out.contains("compression calibrated for 1 models"), "{out}");
    assert!(want.contains_key(stretto::kv::calibration::CALIBRATION_FILE), "{want:?}");

    let crashed = tempfile::tempdir().unwrap();
    // Each run is killed a pseudo-random 0-120 ms after it wrote its first new record, so kills land inside
    // prefills, presses and writes (a fixed LCG keeps the points reproducible).
    let count = |p: &Path| records_under(p).len();
    let mut seed: u64 = 0x5eed;
    let mut kills = 0;
    for _ in 0..4 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let ms = (seed >> 33) % 120;
        let before = count(crashed.path());
        let mut child = Command::new(env!("CARGO_BIN_EXE_stretto"))
            .args(build_args())
            .env("STRETTO_KV_DIR", crashed.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut finished = false;
        while count(crashed.path()) == before {
            if child.try_wait().unwrap().is_some() {
                finished = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(ms));
        finished |= child.try_wait().unwrap().is_some();
        let _ = child.kill(); // SIGKILL on Unix
        let _ = child.wait();
        kills += usize::from(!finished);
        eprintln!("killed {ms} ms after a new record: {} records", count(crashed.path()));
    }
    assert!(kills >= 3, "the builds finished before they could be interrupted");
    let (ok, out, err) = stretto(crashed.path(), &build_args());
    assert!(ok, "{err}");
    eprintln!("resumed: {out}");
    assert!(out.contains("built"), "{out}");
    let got = digest_tree(crashed.path());
    assert_eq!(got, want, "resumed build differs from the uninterrupted one (or left temporary files)");
}

#[test]
fn a_flipped_byte_is_reported_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = stretto(dir.path(), &build_args());
    assert!(ok, "{err}");
    let want = digest_tree(dir.path());
    let victim = dir.path().join("movie/reviewtext/smollm2-135m@expected-attention-0.50/00000003.safetensors");
    let mut bytes = std::fs::read(&victim).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x10;
    std::fs::write(&victim, &bytes).unwrap();

    let (ok, out, _) = stretto(dir.path(), &["kv", "verify", "--dataset", "movie"]);
    assert!(!ok, "verify must fail on a corrupt record");
    assert!(out.contains("00000003.safetensors") && out.contains("1 corrupt"), "{out}");

    let (ok, out, err) = stretto(dir.path(), &["kv", "repair", "--dataset", "movie"]);
    assert!(ok, "{err}");
    assert!(out.contains("rebuilt 1 items"), "{out}");
    assert_eq!(digest_tree(dir.path()), want);
    let (ok, out, _) = stretto(dir.path(), &["kv", "verify", "--dataset", "movie"]);
    assert!(ok && out.contains("0 corrupt"), "{out}");
}

#[test]
fn a_damaged_manifest_is_rebuilt_from_the_records_by_repair() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = stretto(dir.path(), &build_args());
    assert!(ok, "{err}");
    let manifest = dir.path().join("movie/manifest.json");
    let built = std::fs::read_to_string(&manifest).unwrap();
    let victim = dir.path().join("movie/reviewtext/smollm2-135m@expected-attention-0.50/00000003.safetensors");
    std::fs::remove_file(&victim).unwrap();
    std::fs::write(&manifest, &built[..built.len() / 2]).unwrap();

    let (ok, out, err) = stretto(dir.path(), &["kv", "repair", "--dataset", "movie"]);
    assert!(ok, "{err}");
    assert!(out.contains("manifest: damaged") && out.contains("1 build specs"), "{out}");
    assert!(out.contains("rebuilt 1 items"), "the record the manifest's build had written is back: {out}");
    assert!(victim.is_file());
    assert_eq!(std::fs::read_to_string(&manifest).unwrap(), built, "one model's build is told back exactly");
    assert!(dir.path().join("movie/manifest.json.damaged").is_file());
    // A build beside a damaged manifest records its spec instead of failing.
    std::fs::write(&manifest, "{").unwrap();
    let (ok, _, err) = stretto(dir.path(), &build_args());
    assert!(ok, "{err}");
    assert_eq!(std::fs::read_to_string(&manifest).unwrap(), built);
}

#[test]
fn stats_report_every_profile_and_bad_arguments_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = stretto(dir.path(), &build_args());
    assert!(ok, "{err}");
    let (ok, out, err) = stretto(dir.path(), &["kv", "stats", "--dataset", "movie", "--json"]);
    assert!(ok, "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.len(), 3);
    let kept: Vec<f64> = rows.iter().map(|r| r["mean_kept"].as_f64().unwrap()).collect();
    assert!(kept[0] > kept[1] && kept[1] > kept[2], "{kept:?}");
    assert!(rows.iter().all(|r| r["items"] == 12));

    let (ok, _, err) = stretto(dir.path(), &["kv", "build", "--dataset", "movie", "--column", "nope", "--limit", "2"]);
    assert!(!ok && err.contains("no column `nope`"), "{err}");
    let (ok, _, err) =
        stretto(dir.path(), &["kv", "build", "--dataset", "movie", "--column", "reviewtext", "--ratios", "1.5"]);
    assert!(!ok && err.contains("outside [0, 1)"), "{err}");
    let (ok, _, err) =
        stretto(dir.path(), &["kv", "build", "--dataset", "movie", "--column", "reviewtext", "--press", "magic"]);
    assert!(!ok && err.contains("unknown press"), "{err}");
    // An unknown model is answered with the decoders a cache can be built for.
    let (ok, _, err) =
        stretto(dir.path(), &["kv", "build", "--dataset", "movie", "--column", "reviewtext", "--models", "nope"]);
    assert!(!ok && err.contains("unknown model `nope`; known models: smollm2-135m, qwen2.5"), "{err}");
    assert!(!err.contains("onnxruntime"), "{err}");
    // The build's memory budget is a byte count; the report says what it ran under.
    let build = |budget: &str| {
        let mut args = build_args();
        args.extend(["--memory-budget", budget]);
        stretto(dir.path(), &args)
    };
    let (ok, _, err) = build("lots");
    assert!(!ok && err.contains("invalid value 'lots' for '--memory-budget"), "{err}");
    let (ok, out, err) = build("0");
    assert!(
        ok && out.contains(&format!("0 items, {ITEMS} already present")) && out.contains("memory budget 0 bytes"),
        "{out}{err}"
    );
}

#[test]
fn store_names_cannot_leave_the_kv_directory() {
    let dir = tempfile::tempdir().unwrap();
    let kv = dir.path().join("kv");
    for name in ["../../../tmp", "..", "/etc", "movie/../..", "a/b", ""] {
        for cmd in [&["kv", "verify", "--dataset", name][..], &["kv", "stats", "--dataset", name][..]] {
            let (ok, _, err) = stretto(&kv, cmd);
            assert!(!ok && err.contains("not a dataset name") && !err.contains("panicked"), "{cmd:?}: {err}");
        }
    }
    // A plain name is a repository, empty here: it verifies, and the note says that nothing was built there.
    let (ok, out, err) = stretto(&kv, &["kv", "verify", "--dataset", "adhoc"]);
    assert!(ok && out.contains("0 records checked, 0 corrupt"), "{out}{err}");
    assert!(err.contains("does not exist: no KV cache of `adhoc` was built there"), "{err}");
}

#[test]
fn doctor_sizes_the_stores_and_names_what_does_not_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (kv, memo, home) = (dir.path().join("kv"), dir.path().join("memo"), dir.path().join("home"));
    let (ok, _, err) = stretto(&kv, &build_args());
    assert!(ok, "{err}");
    // A memo with two answers and a torn append; a model home where MiniLM's weights were overwritten.
    std::fs::create_dir_all(&memo).unwrap();
    std::fs::write(
        memo.join("embed_minilm.jsonl"),
        "{\"key\":\"a\",\"score\":1.0,\"seconds\":0.1}\n{\"key\":\"b\",\"score\":-1.0,\"seconds\":0.1}\n{\"key\":\"c\",\"sc",
    )
    .unwrap();
    // The cost record beside the answers is no memo file.
    std::fs::write(
        memo.join("costs.jsonl"),
        "{\"op\":\"embed:minilm\",\"item\":\"00\",\"task\":\"00\",\"seconds\":0.1}\n",
    )
    .unwrap();
    // Nor are the contrasts' kept opposites.
    std::fs::write(
        memo.join(stretto::kv::contrast::OPPOSITES_FILE),
        "{\"model\":\"smollm2-135m\",\"derivation\":1,\"prompt\":\"00\",\"opposite\":null}\n",
    )
    .unwrap();
    let minilm = home.join("models/minilm");
    std::fs::create_dir_all(&minilm).unwrap();
    std::fs::write(minilm.join("manifest.json"), "{}").unwrap();
    std::fs::write(minilm.join("model.safetensors"), "not the weights").unwrap();
    let doctor = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_stretto"))
            .arg("doctor")
            .args(args)
            .env("STRETTO_KV_DIR", &kv)
            .env("STRETTO_MEMO_DIR", &memo)
            .env("STRETTO_HOME", &home)
            .output()
            .expect("binary runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };

    let (ok, out, err) = doctor(&["--json"]);
    assert!(!ok, "a model that does not verify must fail the doctor: {out}");
    assert!(err.contains("3 problems"), "one per artifact that does not verify: {err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let movie = r["kv"].as_array().unwrap().iter().find(|k| k["repository"] == "movie").unwrap();
    assert_eq!(movie["records"], 3 * 12);
    assert!(movie["bytes"].as_u64().unwrap() > 0 && movie["corrupt"].as_array().unwrap().is_empty(), "{movie}");
    let m = &r["memo"][0];
    assert_eq!((m["answers"].as_u64(), m["torn_lines"].as_u64()), (Some(2), Some(1)), "{m}");
    assert_eq!(r["memo"].as_array().unwrap().len(), 1, "{}", r["memo"]);
    assert!(r["cost_record_bytes"].as_u64().unwrap() > 0, "{r}");
    let mini = r["models"].as_array().unwrap().iter().find(|m| m["name"] == "minilm").unwrap();
    let bad = mini["bad_artifacts"].as_array().unwrap();
    // The weights do not match their pin; the tokenizer and config are missing.
    assert_eq!(bad.len(), 3, "{mini}");
    assert!(bad[0].as_str().unwrap().starts_with("model.safetensors has SHA-256"), "{mini}");

    // With the model gone, a flipped byte in one record is the one problem, named in the text report.
    std::fs::remove_dir_all(&minilm).unwrap();
    let victim = kv.join("movie/reviewtext/smollm2-135m@expected-attention-0.80/00000007.safetensors");
    let mut bytes = std::fs::read(&victim).unwrap();
    let at = bytes.len() - 64;
    bytes[at] ^= 0x01;
    std::fs::write(&victim, &bytes).unwrap();
    let (ok, out, _) = doctor(&[]);
    assert!(!ok && out.contains("1 problems") && out.contains("00000007.safetensors"), "{out}");
    // --quick reads nothing back, so it sees nothing wrong; after a repair the full check is clean.
    let (ok, out, _) = doctor(&["--quick"]);
    assert!(ok && out.contains("not verified"), "{out}");
    // A decoder's conversions are sized per weights: here int8-dyn ones left by --int8-rungs queries, in both code
    // ranges (8-bit where the CPU has VNNI, 7-bit elsewhere), as in a home carried between machines: the one this
    // CPU reads, and the other, marked unread.
    let smol = home.join("models/smollm2-135m");
    for (folder, bytes) in [("onnx-int8-dyn", 3_000_000), ("onnx-int8-dyn7", 2_000_000)] {
        std::fs::create_dir_all(smol.join(folder)).unwrap();
        std::fs::write(smol.join(folder).join("decoder.onnx"), vec![0u8; bytes]).unwrap();
    }
    std::fs::write(smol.join("manifest.json"), "{}").unwrap();
    let (ok, out, _) = doctor(&["--quick", "--json"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let m = r["models"].as_array().unwrap().iter().find(|m| m["name"] == "smollm2-135m").unwrap();
    let c = m["conversions"].as_array().unwrap();
    assert!(ok && c.len() == 2 && c.iter().all(|c| c["weights"] == "int8-dyn"), "{m}");
    let read: Vec<&serde_json::Value> = c.iter().filter(|c| c["read_here"] == true).collect();
    assert_eq!(read.len(), 1, "exactly one code range is read on this CPU: {m}");
    let (read_mb, unread_mb) = if read[0]["bytes"] == 3_000_000 { ("3.0", "2.0") } else { ("2.0", "3.0") };
    // The CPU's integer-kernel features, and the int8-dyn code range they give: 8-bit only with VNNI's 32-bit sums.
    let features: Vec<&str> =
        r["int8_kernel_features"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    if cfg!(all(target_arch = "x86_64", target_os = "linux")) {
        let vnni = features.iter().any(|f| f.ends_with("vnni"));
        assert_eq!(r["int8_dyn_code_max"], if vnni { 127 } else { 63 }, "{r}");
    }
    let (_, out, _) = doctor(&["--quick"]);
    let code_max = r["int8_dyn_code_max"].as_i64().unwrap();
    assert!(out.contains(&format!("{}; int8-dyn codes ±{code_max}", features.join(" "))), "{out}");
    assert!(
        out.contains(&format!("int8-dyn {read_mb} MB,")) || out.contains(&format!("int8-dyn {read_mb} MB)")),
        "{out}"
    );
    assert!(out.contains(&format!("int8-dyn {unread_mb} MB in unread codes for another CPU")), "{out}");
    std::fs::remove_dir_all(&smol).unwrap();
    let (ok, _, err) = stretto(&kv, &["kv", "repair", "--dataset", "movie"]);
    assert!(ok, "{err}");
    let (ok, out, err) = doctor(&[]);
    assert!(ok && out.contains("everything verifies"), "{out}{err}");
}
