//! What a session's stores hold and whether it is all still sound: `stretto doctor`.
//!
//! [`examine`] looks at the three places Stretto writes to and reports, without changing anything:
//!
//! - the **model home**: every catalog model, whether it is prepared, its size on disk (a decoder's ONNX
//!   conversions, f32 and quantized, sized apart), and (with `verify`) whether each assembled artifact still has the
//!   SHA-256 the catalog pins; folders of user models; temporaries that a killed preparation left; and the CPU
//!   features that choose ONNX Runtime's integer kernels, which an `int8-dyn` rung's speed and codes follow;
//! - the **KV directory**: bytes and records per repository (one per dataset, `adhoc` for caches computed by
//!   queries), and (with `verify`) every record read back against its checksum, as `stretto kv verify` does;
//! - the **memo**: files, answers and bytes per operator, and torn lines (an append cut short by a crash, which
//!   readers skip and recompute).
//!
//! ```no_run
//! let session = stretto::Session::builder("/var/cache/stretto").build()?;
//! let report = session.doctor(true)?;
//! print!("{report}");
//! assert!(report.problems().is_empty());
//! # Ok::<(), stretto::Error>(())
//! ```

use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::Serialize;
use stretto_core::{MemoPolicy, OpContext};
use stretto_kv::store::KvStore;

use crate::Result;

/// A catalog model in the model home.
#[derive(Debug, Clone, Serialize)]
pub struct ModelHealth {
    /// Catalog name.
    pub name: String,
    /// Whether it is prepared (its manifest exists).
    pub prepared: bool,
    /// Bytes of its folder.
    pub bytes: u64,
    /// Artifacts whose SHA-256 is not the pinned one, or that are missing (checked only with `verify`).
    pub bad_artifacts: Vec<String>,
    /// A decoder's ONNX conversions present in its folder, per weights (`f32`, `int8`, `int8-dyn`), with their bytes
    /// (inside [`ModelHealth::bytes`]): a quantized one is made on first use of an `--int8-rungs` rung, and can be
    /// deleted to reclaim the space (it is remade when needed).
    pub conversions: Vec<Conversion>,
}

/// One ONNX conversion of a decoder in the model home.
#[derive(Debug, Clone, Serialize)]
pub struct Conversion {
    /// `f32`, `int8` or `int8-dyn`.
    pub weights: String,
    /// The conversion's folder.
    pub folder: PathBuf,
    /// Bytes of that folder.
    pub bytes: u64,
    /// Whether this machine reads it: an `int8-dyn` conversion's codes follow the CPU
    /// ([`stretto_models::convert::int8_dyn_code_max`]), and a home carried from another CPU may hold the other
    /// range's, which is never read here and can be deleted.
    pub read_here: bool,
}

/// One repository of the KV directory (a dataset's, or `adhoc`).
#[derive(Debug, Clone, Serialize)]
pub struct KvHealth {
    /// The folder name under the KV directory.
    pub repository: String,
    /// Record files.
    pub records: usize,
    /// Bytes of every file under it.
    pub bytes: u64,
    /// Temporary files of interrupted writes (harmless; `stretto kv build` removes them).
    pub temporaries: usize,
    /// Records that fail their checks, and why (checked only with `verify`).
    pub corrupt: Vec<(PathBuf, String)>,
}

/// One operator's memo file.
#[derive(Debug, Clone, Serialize)]
pub struct MemoHealth {
    /// The file.
    pub file: PathBuf,
    /// Answers it holds.
    pub answers: usize,
    /// Lines that are not an answer (a torn append); readers skip them.
    pub torn_lines: usize,
    /// Its size.
    pub bytes: u64,
}

/// What [`examine`] found.
#[derive(Debug, Clone, Serialize)]
pub struct DoctorReport {
    /// The model home.
    pub model_home: PathBuf,
    /// Every catalog model.
    pub models: Vec<ModelHealth>,
    /// Folders under `models/` that are not catalog models: user models (a GGUF file or an export folder
    /// registered by path), with their size.
    pub user_models: Vec<(String, u64)>,
    /// Temporaries a killed model preparation left under `models/` (never used; safe to delete).
    pub model_temporaries: Vec<PathBuf>,
    /// The KV directory.
    pub kv_dir: PathBuf,
    /// Its repositories.
    pub kv: Vec<KvHealth>,
    /// The memo directory (`None` when the memo is off).
    pub memo_dir: Option<PathBuf>,
    /// Its files.
    pub memo: Vec<MemoHealth>,
    /// Bytes of the cost record kept beside the memo (`costs.jsonl`: what answers cost per operator and item).
    pub cost_record_bytes: u64,
    /// Whether models and records were read back and checked (not only listed).
    pub verified: bool,
    /// This CPU's features that choose ONNX Runtime's integer kernels, as Linux names them
    /// ([`stretto_models::convert::int8_kernel_features`]: AVX2's 16-bit pair sums, VNNI's exact 32-bit sums,
    /// AMX's tiles). An `int8-dyn` rung is fast, and its 8-bit codes exact, only with VNNI or AMX.
    pub int8_kernel_features: Vec<String>,
    /// The largest weight code of the `int8-dyn` conversions made on this CPU (127, or 63 without VNNI).
    pub int8_dyn_code_max: i8,
}

impl DoctorReport {
    /// What is wrong: corrupt records and models whose files no longer match their pins. Torn memo lines and
    /// temporaries are not problems (readers skip them), only housekeeping.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for m in &self.models {
            for a in &m.bad_artifacts {
                out.push(format!(
                    "model {}: {a} (remove {} and run `stretto models fetch {}`)",
                    m.name,
                    stretto_models::models::model_dir(&self.model_home, &m.name).display(),
                    m.name
                ));
            }
        }
        for k in &self.kv {
            for (path, why) in &k.corrupt {
                out.push(format!(
                    "KV record {}: {why} (`stretto kv repair --dataset {}`)",
                    path.display(),
                    k.repository
                ));
            }
        }
        out
    }

    /// Bytes of the KV directory.
    pub fn kv_bytes(&self) -> u64 {
        self.kv.iter().map(|k| k.bytes).sum()
    }

    /// Bytes of the memo.
    pub fn memo_bytes(&self) -> u64 {
        self.memo.iter().map(|m| m.bytes).sum()
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prepared = self.models.iter().filter(|m| m.prepared).count();
        writeln!(f, "model home {}", self.model_home.display())?;
        writeln!(f, "  {prepared} of {} catalog models prepared", self.models.len())?;
        for m in self.models.iter().filter(|m| m.prepared) {
            let state = if !self.verified {
                "not verified"
            } else if m.bad_artifacts.is_empty() {
                "verified"
            } else {
                "DOES NOT VERIFY"
            };
            let conversions: Vec<String> = m
                .conversions
                .iter()
                .map(|c| {
                    let unread = if c.read_here { "" } else { " in unread codes for another CPU" };
                    format!("{} {}{unread}", c.weights, mb(c.bytes))
                })
                .collect();
            let conversions =
                if conversions.is_empty() { String::new() } else { format!(" (ONNX: {})", conversions.join(", ")) };
            writeln!(f, "  {:<22} {:>10}  {state}{conversions}", m.name, mb(m.bytes))?;
        }
        for (name, bytes) in &self.user_models {
            writeln!(f, "  {name:<22} {:>10}  user model", mb(*bytes))?;
        }
        if !self.model_temporaries.is_empty() {
            writeln!(f, "  {} temporaries of interrupted preparations (safe to delete)", self.model_temporaries.len())?;
        }
        let features = if self.int8_kernel_features.is_empty() {
            format!("none of {}", stretto_models::convert::INT8_KERNEL_FLAGS.join(", "))
        } else {
            self.int8_kernel_features.join(" ")
        };
        writeln!(f, "  CPU integer kernels: {features}; int8-dyn codes ±{}", self.int8_dyn_code_max)?;
        writeln!(f, "KV directory {}: {}", self.kv_dir.display(), mb(self.kv_bytes()))?;
        for k in &self.kv {
            let state =
                if !self.verified { "not verified".to_string() } else { format!("{} corrupt", k.corrupt.len()) };
            let tmp = if k.temporaries > 0 { format!(", {} temporaries", k.temporaries) } else { String::new() };
            writeln!(f, "  {:<22} {:>10}  {} records, {state}{tmp}", k.repository, mb(k.bytes), k.records)?;
        }
        match &self.memo_dir {
            None => writeln!(f, "memo off")?,
            Some(dir) => {
                let answers: usize = self.memo.iter().map(|m| m.answers).sum();
                let torn: usize = self.memo.iter().map(|m| m.torn_lines).sum();
                writeln!(
                    f,
                    "memo {}: {} in {} files, {answers} answers, {torn} torn lines",
                    dir.display(),
                    mb(self.memo_bytes()),
                    self.memo.len()
                )?;
                if self.cost_record_bytes > 0 {
                    writeln!(f, "  cost record {:>10}", mb(self.cost_record_bytes))?;
                }
            }
        }
        let problems = self.problems();
        if problems.is_empty() {
            writeln!(f, "{}", if self.verified { "everything verifies" } else { "nothing checked (listing only)" })
        } else {
            writeln!(f, "{} problems:", problems.len())?;
            problems.iter().try_for_each(|p| writeln!(f, "  {p}"))
        }
    }
}

/// Bytes of every file under `dir` (0 when it does not exist).
pub fn tree_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(stretto_core::CoreError::io(&d, e).into()),
        };
        for entry in entries {
            let entry = entry.map_err(|e| stretto_core::CoreError::io(&d, e))?;
            let md = entry.metadata().map_err(|e| stretto_core::CoreError::io(entry.path(), e))?;
            if md.is_dir() {
                stack.push(entry.path());
            } else {
                total += md.len();
            }
        }
    }
    Ok(total)
}

/// The sub-folders of `dir`, sorted (none when it does not exist).
fn folders(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    match fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.map_err(|e| stretto_core::CoreError::io(dir, e))?;
                if entry.file_type().map_err(|e| stretto_core::CoreError::io(entry.path(), e))?.is_dir() {
                    out.push(entry.path());
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(stretto_core::CoreError::io(dir, e).into()),
    }
    out.sort();
    Ok(out)
}

fn name_of(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Examines the model home, KV directory and memo of `context`; with `verify`, reads every model artifact and KV
/// record back and checks it (minutes for a large store), else only lists and sizes them. Changes nothing.
pub fn examine(context: &OpContext, verify: bool) -> Result<DoctorReport> {
    let _span = tracing::info_span!("doctor", verify).entered();
    let home = &context.model_home;
    let catalog = stretto_models::models::CATALOG;
    let mut models = Vec::new();
    for spec in catalog {
        let dir = stretto_models::models::model_dir(home, spec.name);
        let prepared = stretto_models::models::is_present(home, spec.name);
        let bytes = if prepared { tree_bytes(&dir)? } else { 0 };
        let mut bad_artifacts = Vec::new();
        if prepared && verify {
            for art in spec.artifacts {
                let path = dir.join(art.file);
                match stretto_models::models::sha256_file(&path) {
                    Ok(sha) if sha == art.sha256 => {}
                    Ok(sha) => bad_artifacts.push(format!("{} has SHA-256 {sha}, pinned {}", art.file, art.sha256)),
                    Err(e) => bad_artifacts.push(format!("{}: {e}", art.file)),
                }
            }
        }
        let mut conversions = Vec::new();
        if prepared && spec.is_decoder() {
            for weights in stretto_models::convert::Weights::ALL {
                for name in weights.folders() {
                    let folder = dir.join(name);
                    if folder.is_dir() {
                        conversions.push(Conversion {
                            weights: weights.as_str().into(),
                            bytes: tree_bytes(&folder)?,
                            read_here: *name == weights.folder(),
                            folder,
                        });
                    }
                }
            }
        }
        models.push(ModelHealth { name: spec.name.into(), prepared, bytes, bad_artifacts, conversions });
    }
    let mut user_models = Vec::new();
    let mut model_temporaries = Vec::new();
    for dir in folders(&home.join("models"))? {
        let name = name_of(&dir);
        if name.starts_with('.') && name.contains(".tmp") {
            model_temporaries.push(dir);
        } else if !catalog.iter().any(|m| m.name == name) {
            user_models.push((name, tree_bytes(&dir)?));
        }
    }

    let mut kv = Vec::new();
    for dir in folders(&context.kv_dir)? {
        let repository = name_of(&dir);
        let store = KvStore::open(&context.kv_dir, &repository)?;
        let records = store.records()?;
        let temporaries = stretto_kv::store::temporaries(store.root())?.len();
        let corrupt = if verify { store.verify()?.corrupt } else { Vec::new() };
        kv.push(KvHealth { repository, records: records.len(), bytes: tree_bytes(&dir)?, temporaries, corrupt });
    }

    let mut cost_record_bytes = 0;
    let (memo_dir, memo) = match &context.memo {
        MemoPolicy::Off => (None, Vec::new()),
        MemoPolicy::Dir(dir) => {
            let mut files = Vec::new();
            let mut paths: Vec<PathBuf> = match fs::read_dir(dir) {
                Ok(entries) => entries.flatten().map(|e| e.path()).collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(stretto_core::CoreError::io(dir, e).into()),
            };
            paths.retain(|p| p.extension().is_some_and(|e| e == "jsonl"));
            // The cost record beside the answers is no memo file, nor are the contrasts' kept opposites.
            let costs = dir.join(stretto_core::memo::COSTS_FILE);
            cost_record_bytes = fs::metadata(&costs).map_or(0, |m| m.len());
            let opposites = dir.join(stretto_kv::contrast::OPPOSITES_FILE);
            paths.retain(|p| *p != costs && *p != opposites);
            paths.sort();
            for file in paths {
                let f = fs::File::open(&file).map_err(|e| stretto_core::CoreError::io(&file, e))?;
                let bytes = f.metadata().map_err(|e| stretto_core::CoreError::io(&file, e))?.len();
                let (mut answers, mut torn_lines) = (std::collections::HashSet::new(), 0);
                for line in BufReader::new(f).split(b'\n') {
                    let line = line.map_err(|e| stretto_core::CoreError::io(&file, e))?;
                    match serde_json::from_slice::<stretto_core::memo::MemoEntry>(&line) {
                        Ok(e) => {
                            answers.insert(e.key);
                        }
                        Err(_) => torn_lines += 1,
                    }
                }
                files.push(MemoHealth { file, answers: answers.len(), torn_lines, bytes });
            }
            (Some(dir.clone()), files)
        }
    };
    Ok(DoctorReport {
        model_home: home.clone(),
        models,
        user_models,
        model_temporaries,
        kv_dir: context.kv_dir.clone(),
        kv,
        memo_dir,
        memo,
        cost_record_bytes,
        verified: verify,
        int8_kernel_features: stretto_models::convert::int8_kernel_features(),
        int8_dyn_code_max: stretto_models::convert::int8_dyn_code_max(),
    })
}
