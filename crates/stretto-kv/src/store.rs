//! The offline KV cache store: one safetensors record per (item, profile), crash-safe and checksummed.
//!
//! Layout: `<kv dir>/<dataset>/<column>/<profile id>/<item:08>.safetensors`, where a profile is a model, a press, a
//! compression ratio and a position mode (`smollm2-135m@expected-attention-0.50`). A record holds per layer `k.{i}`
//! and `v.{i}` as f16 `[kv_heads, kept, head_dim]` and one metadata entry, `stretto`, a JSON document with the
//! model, press, ratio, token counts, the SHA-256 of the cached source text and a checksum of the whole record.
//! (One key rather than many: safetensors writes its metadata map in hash order, and records must be
//! byte-identical from one build to the next.)
//!
//! Writes go to a temporary file in the same folder, are synced, renamed into place, and the folder is synced: a
//! record either exists whole or not at all, so an interrupted build resumes by skipping existing records. Reads
//! verify the payload checksum, so a torn or corrupted record is an error naming its file, never silently used.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::decoder::{Decoder, KvPast};
use crate::error::{KvError, Result};
use crate::press::{compress_each, Positions, Press};

/// Record format version.
pub const RECORD_FORMAT: u32 = 1;
/// A cache profile: which model's cache, compressed how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Catalog model name.
    pub model: String,
    /// Press.
    pub press: Press,
    /// Compression ratio in [0, 1).
    pub ratio: f64,
    /// Position mode of kept keys.
    pub positions: Positions,
}

impl Profile {
    /// The profile's id, also its folder name.
    pub fn id(&self) -> String {
        let rr = if self.positions == Positions::Rerotate { "-rerotate" } else { "" };
        format!("{}@{}-{:.2}{rr}", self.model, self.press.name(), self.ratio)
    }

    /// Parses [`Profile::id`].
    pub fn parse(id: &str) -> Result<Self> {
        let bad = || KvError::Usage(format!("`{id}` is not a profile id like smollm2-135m@expected-attention-0.50"));
        let (model, rest) = id.split_once('@').ok_or_else(bad)?;
        let (rest, positions) = match rest.strip_suffix("-rerotate") {
            Some(r) => (r, Positions::Rerotate),
            None => (rest, Positions::Keep),
        };
        let (press, ratio) = rest.rsplit_once('-').ok_or_else(bad)?;
        Ok(Self {
            model: model.into(),
            press: Press::parse(press)?,
            ratio: ratio.parse().map_err(|_| bad())?,
            positions,
        })
    }
}

/// What a record says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordMeta {
    /// Record format.
    pub format: u32,
    /// Catalog model.
    pub model: String,
    /// Press.
    pub press: Press,
    /// Ratio.
    pub ratio: f64,
    /// Position mode.
    pub positions: Positions,
    /// Layers.
    pub layers: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Per-head size.
    pub head_dim: usize,
    /// Tokens prefilled.
    pub tokens: usize,
    /// Tokens kept.
    pub kept: usize,
    /// Position of the next token.
    pub next_position: i64,
    /// SHA-256 of the cached text (chat-templated item).
    pub source_sha256: String,
    /// SHA-256 of this metadata (with an empty checksum) followed by the tensor payload in layer order, keys
    /// before values: a flipped byte anywhere in a record is caught.
    pub checksum: String,
}

impl RecordMeta {
    /// The metadata of `past`, the `profile` rung of an item's `tokens`-long prefill whose cached text hashes to
    /// `source`; the checksum is filled in when the record is encoded.
    pub fn of(profile: &Profile, layers: usize, tokens: usize, past: &KvPast, source: &str) -> Self {
        Self {
            format: RECORD_FORMAT,
            model: profile.model.clone(),
            press: profile.press,
            ratio: profile.ratio,
            positions: profile.positions,
            layers,
            kv_heads: past.kv_heads,
            head_dim: past.head_dim,
            tokens,
            kept: past.len,
            next_position: past.next_position,
            source_sha256: source.to_string(),
            checksum: String::new(),
        }
    }
}

/// A loaded record.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Its metadata.
    pub meta: RecordMeta,
    /// The cache, widened to f32 for the runtime.
    pub past: KvPast,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of a text, hex.
pub fn sha256_text(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

fn corrupt(path: &Path, message: impl Into<String>) -> KvError {
    KvError::Corrupt { path: path.to_path_buf(), message: message.into() }
}

/// Adds `text` (whole lines) to the file at `path` by rewriting it whole and renaming it into place
/// ([`write_atomic`]): a crash leaves the old file or the new one, never half a line. Two processes adding at once
/// may each keep only their own lines (what the other added is then computed again where it is needed).
pub(crate) fn append_lines(path: &Path, text: &str) -> Result<()> {
    // (Lossily: damaged bytes in an old line must not stop new lines from being added.)
    let mut old = match fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(KvError::io(path, e)),
    };
    if !old.is_empty() && !old.ends_with('\n') {
        old.push('\n');
    }
    old.push_str(text);
    write_atomic(path, old.as_bytes())
}

/// Writes `bytes` to `path` atomically: temporary file in the same folder, sync, rename, folder sync.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().ok_or_else(|| KvError::Usage(format!("{} has no parent folder", path.display())))?;
    fs::create_dir_all(dir).map_err(|e| KvError::io(dir, e))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("record");
    let tmp = stretto_models::fsutil::unique_tmp(dir, name);
    let result = (|| {
        let mut f = fs::File::create(&tmp).map_err(|e| KvError::io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| KvError::io(&tmp, e))?;
        f.sync_all().map_err(|e| KvError::io(&tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| KvError::io(path, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Serialises a cache as a record (f16 tensors + metadata); deterministic.
pub fn encode_record(meta_in: &RecordMeta, past: &KvPast) -> Result<Vec<u8>> {
    let to_f16 = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect() };
    let mut payloads: Vec<(String, Vec<u8>)> = Vec::with_capacity(past.keys.len() * 2);
    let mut meta = meta_in.clone();
    meta.checksum = String::new();
    let mut h = Sha256::new();
    h.update(serde_json::to_string(&meta).map_err(|e| KvError::Runtime(e.to_string()))?.as_bytes());
    for (l, (k, v)) in past.keys.iter().zip(&past.values).enumerate() {
        for (name, data) in [(format!("k.{l}"), to_f16(k)), (format!("v.{l}"), to_f16(v))] {
            h.update(&data);
            payloads.push((name, data));
        }
    }
    meta.checksum = hex(&h.finalize());
    let shape = vec![past.kv_heads, past.len, past.head_dim];
    let views = payloads
        .iter()
        .map(|(n, d)| {
            safetensors::tensor::TensorView::new(Dtype::F16, shape.clone(), d)
                .map(|v| (n.clone(), v))
                .map_err(|e| KvError::Runtime(format!("safetensors: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let json = serde_json::to_string(&meta).map_err(|e| KvError::Runtime(e.to_string()))?;
    let info = std::collections::HashMap::from([("stretto".to_string(), json)]);
    safetensors::serialize(views, Some(info)).map_err(|e| KvError::Runtime(format!("safetensors: {e}")))
}

/// Reads only a record's metadata (cheap: the header).
pub fn read_meta(path: &Path) -> Result<RecordMeta> {
    let mut f = fs::File::open(path).map_err(|e| KvError::io(path, e))?;
    let mut n = [0u8; 8];
    std::io::Read::read_exact(&mut f, &mut n).map_err(|_| corrupt(path, "truncated header"))?;
    let len = u64::from_le_bytes(n) as usize;
    if len > 1 << 24 {
        return Err(corrupt(path, "header length is implausible"));
    }
    let mut header = vec![0u8; len];
    std::io::Read::read_exact(&mut f, &mut header).map_err(|_| corrupt(path, "truncated header"))?;
    meta_from_header(path, &header)
}

fn meta_from_header(path: &Path, header: &[u8]) -> Result<RecordMeta> {
    let v: serde_json::Value = serde_json::from_slice(header).map_err(|e| corrupt(path, format!("bad header: {e}")))?;
    let text = v["__metadata__"]["stretto"].as_str().ok_or_else(|| corrupt(path, "no stretto metadata"))?;
    serde_json::from_str(text).map_err(|e| corrupt(path, format!("bad stretto metadata: {e}")))
}

/// Decodes and verifies a record's bytes.
pub fn decode_record(path: &Path, bytes: &[u8]) -> Result<Record> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| corrupt(path, format!("not a safetensors file: {e}")))?;
    let (_, md) = SafeTensors::read_metadata(bytes).map_err(|e| corrupt(path, e.to_string()))?;
    let text =
        md.metadata().as_ref().and_then(|m| m.get("stretto")).ok_or_else(|| corrupt(path, "no stretto metadata"))?;
    let meta: RecordMeta = serde_json::from_str(text).map_err(|e| corrupt(path, format!("bad metadata: {e}")))?;
    if meta.format != RECORD_FORMAT {
        return Err(corrupt(path, format!("record format {} (this build reads {RECORD_FORMAT})", meta.format)));
    }
    let mut blank = meta.clone();
    blank.checksum = String::new();
    let mut h = Sha256::new();
    h.update(serde_json::to_string(&blank).map_err(|e| KvError::Runtime(e.to_string()))?.as_bytes());
    // The header's word, before the checksum can vouch for it: a record holds two tensors per layer.
    if meta.layers > st.len() / 2 {
        return Err(corrupt(path, format!("names {} layers and holds {} tensors", meta.layers, st.len())));
    }
    let mut keys = Vec::with_capacity(meta.layers);
    let mut values = Vec::with_capacity(meta.layers);
    let want_shape = [meta.kv_heads, meta.kept, meta.head_dim];
    for l in 0..meta.layers {
        for (name, out) in [(format!("k.{l}"), &mut keys), (format!("v.{l}"), &mut values)] {
            let t = st.tensor(&name).map_err(|e| corrupt(path, format!("{name}: {e}")))?;
            if t.dtype() != Dtype::F16 || t.shape() != want_shape {
                return Err(corrupt(path, format!("{name} has dtype {:?} shape {:?}", t.dtype(), t.shape())));
            }
            h.update(t.data());
            out.push(
                t.data().chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect::<Vec<_>>(),
            );
        }
    }
    let actual = hex(&h.finalize());
    if actual != meta.checksum {
        return Err(corrupt(path, format!("checksum {actual} does not match the recorded {}", meta.checksum)));
    }
    let past = KvPast {
        keys,
        values,
        len: meta.kept,
        next_position: meta.next_position,
        kv_heads: meta.kv_heads,
        head_dim: meta.head_dim,
    };
    Ok(Record { meta, past })
}

/// The cache repository of one dataset.
#[derive(Debug, Clone)]
pub struct KvStore {
    root: PathBuf,
}

/// What to build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildSpec {
    /// The column whose values are the items.
    pub column: String,
    /// Models.
    pub models: Vec<String>,
    /// Ratios.
    pub ratios: Vec<f64>,
    /// Press.
    pub press: Press,
    /// Position mode.
    pub positions: Positions,
}

impl BuildSpec {
    /// Every profile the spec builds.
    pub fn profiles(&self) -> Vec<Profile> {
        self.models
            .iter()
            .flat_map(|m| {
                self.ratios.iter().map(move |&ratio| Profile {
                    model: m.clone(),
                    press: self.press,
                    ratio,
                    positions: self.positions,
                })
            })
            .collect()
    }
}

/// A damaged manifest rebuilt from the records on disk ([`KvStore::recover_manifest`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveredManifest {
    /// The build specs now recorded.
    pub specs: Vec<BuildSpec>,
    /// Where the damaged manifest was moved.
    pub damaged: PathBuf,
    /// What was wrong with it.
    pub why: String,
}

/// Outcome of a build.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BuildReport {
    /// Items prefilled now.
    pub built: usize,
    /// Items whose every record already existed.
    pub skipped: usize,
    /// Stray temporary files removed.
    pub cleaned: usize,
    /// Wall time.
    pub seconds: f64,
    /// Models whose compression was calibrated over the items now ([`crate::calibration`]).
    pub calibrated: usize,
    /// Most tokens one prefill run took: items longer than this were prefilled in chunks that fit the build's
    /// memory budget ([`crate::decoder::prefill_chunk`]). 0 when nothing was built.
    pub longest_chunk: usize,
}

/// One profile's footprint.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileStats {
    /// Column.
    pub column: String,
    /// Profile id.
    pub profile: String,
    /// Records.
    pub items: usize,
    /// Bytes on disk.
    pub bytes: u64,
    /// Mean tokens kept.
    pub mean_kept: f64,
    /// Mean tokens prefilled.
    pub mean_tokens: f64,
}

/// Outcome of a verification.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Records read.
    pub checked: usize,
    /// Corrupt records and why.
    pub corrupt: Vec<(PathBuf, String)>,
}

impl KvStore {
    /// The repository of `dataset` under `kv_dir` (created on first write). `dataset` is one folder name: a name
    /// that would leave `kv_dir` (`..`, a path, an absolute name) is refused.
    pub fn open(kv_dir: &Path, dataset: &str) -> Result<Self> {
        let mut parts = Path::new(dataset).components();
        match (parts.next(), parts.next()) {
            (Some(std::path::Component::Normal(_)), None) if !dataset.contains(['/', '\\']) => {
                Ok(Self { root: kv_dir.join(dataset) })
            }
            _ => Err(KvError::Usage(format!(
                "`{dataset}` is not a dataset name: KV repositories are folders directly under the KV directory"
            ))),
        }
    }

    /// Its folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where a record lives.
    pub fn record_path(&self, column: &str, profile: &Profile, item: usize) -> PathBuf {
        self.root.join(column).join(profile.id()).join(format!("{item:08}.safetensors"))
    }

    /// Reads and verifies a record.
    pub fn read(&self, column: &str, profile: &Profile, item: usize) -> Result<Record> {
        let path = self.record_path(column, profile, item);
        let bytes = fs::read(&path).map_err(|e| KvError::io(&path, e))?;
        decode_record(&path, &bytes)
    }

    /// The build specs recorded in the repository's manifest.
    pub fn manifest(&self) -> Result<Vec<BuildSpec>> {
        let path = self.root.join("manifest.json");
        // Bytes, not text: a manifest that is not UTF-8 (disk garbage) is damaged like any other malformed one.
        match fs::read(&path) {
            Ok(t) => serde_json::from_slice(&t).map_err(|e| corrupt(&path, e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(KvError::io(&path, e)),
        }
    }

    /// The lock that the manifest's read-modify-write holds, held until the returned file is dropped.
    fn lock_manifest(&self) -> Result<fs::File> {
        fs::create_dir_all(&self.root).map_err(|e| KvError::io(&self.root, e))?;
        let lock_path = self.root.join(".manifest.lock");
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| KvError::io(&lock_path, e))?;
        lock.lock().map_err(|e| KvError::io(&lock_path, e))?;
        Ok(lock)
    }

    fn record_spec(&self, spec: &BuildSpec) -> Result<()> {
        // Read, add, write under a lock: two builds starting at once (two columns, two models) both stay recorded.
        let _lock = self.lock_manifest()?;
        let mut specs = match self.manifest() {
            Ok(specs) => specs,
            // A damaged manifest (a disk error, a hand edit) would fail every build from now on: what it recorded is
            // read back from the records themselves.
            Err(KvError::Corrupt { .. }) => self.recover_locked()?.map(|r| r.specs).unwrap_or_default(),
            Err(e) => return Err(e),
        };
        if !specs.contains(spec) {
            specs.push(spec.clone());
            self.write_manifest(&specs)?;
        }
        Ok(())
    }

    fn write_manifest(&self, specs: &[BuildSpec]) -> Result<()> {
        let text = serde_json::to_vec_pretty(specs).map_err(|e| KvError::Runtime(e.to_string()))?;
        write_atomic(&self.root.join("manifest.json"), &text)
    }

    /// Rebuilds a damaged `manifest.json` from the records on disk: one build spec per column, model, press and
    /// position mode, with the ratios that have records (the builds that wrote them, as far as the records tell). The
    /// damaged file is kept beside it as `manifest.json.damaged`. `None` when the manifest reads (or there is none).
    pub fn recover_manifest(&self) -> Result<Option<RecoveredManifest>> {
        if !self.root.is_dir() {
            return Ok(None);
        }
        let _lock = self.lock_manifest()?;
        self.recover_locked()
    }

    fn recover_locked(&self) -> Result<Option<RecoveredManifest>> {
        let why = match self.manifest() {
            Ok(_) => return Ok(None),
            Err(KvError::Corrupt { message, .. }) => message,
            Err(e) => return Err(e),
        };
        let path = self.root.join("manifest.json");
        let aside = self.root.join("manifest.json.damaged");
        let mut specs: Vec<BuildSpec> = Vec::new();
        // One profile per folder: its first record's header says it exactly (a folder name rounds the ratio to two
        // decimals); where that header cannot be read, the folder's name does.
        let mut seen = std::collections::BTreeSet::new();
        for record in self.records()? {
            let Some(folder) =
                record.parent().filter(|f| f.parent().and_then(Path::parent) == Some(self.root.as_path()))
            else {
                continue;
            };
            let Some(column) = folder.parent().and_then(|c| c.file_name()).and_then(|n| n.to_str()) else { continue };
            // One header per folder, not one per record.
            if !seen.insert(folder.to_path_buf()) {
                continue;
            }
            let from_record = read_meta(&record).ok().map(|m| Profile {
                model: m.model,
                press: m.press,
                ratio: m.ratio,
                positions: m.positions,
            });
            let named = folder.file_name().and_then(|n| n.to_str()).and_then(|n| Profile::parse(n).ok());
            let Some(profile) = from_record.or(named) else { continue };
            let same = |s: &&mut BuildSpec| {
                s.column == column
                    && s.models == [profile.model.as_str()]
                    && s.press == profile.press
                    && s.positions == profile.positions
            };
            match specs.iter_mut().find(same) {
                Some(s) if s.ratios.contains(&profile.ratio) => {}
                Some(s) => s.ratios.push(profile.ratio),
                None => specs.push(BuildSpec {
                    column: column.into(),
                    models: vec![profile.model.clone()],
                    ratios: vec![profile.ratio],
                    press: profile.press,
                    positions: profile.positions,
                }),
            }
        }
        for s in &mut specs {
            s.ratios.sort_by(f64::total_cmp);
        }
        // The damaged file is kept before it is replaced, and replaced atomically: a failure on the way leaves it
        // in place, to be recovered again.
        let damaged = fs::read(&path).map_err(|e| KvError::io(&path, e))?;
        write_atomic(&aside, &damaged)?;
        self.write_manifest(&specs)?;
        tracing::warn!(
            manifest = %path.display(),
            damaged = %aside.display(),
            specs = specs.len(),
            "the KV manifest was damaged ({why}); rebuilt from the records on disk"
        );
        Ok(Some(RecoveredManifest { specs, damaged: aside, why }))
    }

    /// Removes temporary files left by interrupted writes (those whose writing process is gone: a build running
    /// beside this one in another process keeps its own); returns how many.
    pub fn clean_temp(&self) -> Result<usize> {
        let mut cleaned = 0;
        for path in temporaries(&self.root)?.iter().filter(|p| abandoned(p)) {
            match fs::remove_file(path) {
                Ok(()) => cleaned += 1,
                // Renamed into place or removed by its writer meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(KvError::io(path, e)),
            }
        }
        Ok(cleaned)
    }

    /// Builds every missing record of `spec` for `items` (`(item id, text)`): one prefill per item and model,
    /// then the press at every ratio. Existing records whose source text is unchanged are kept. Prefills run within
    /// [`crate::decoder::DEFAULT_MEMORY_BUDGET`]; see [`KvStore::build_within`].
    pub fn build(
        &self,
        home: &Path,
        spec: &BuildSpec,
        items: &[(usize, String)],
        threads: usize,
    ) -> Result<BuildReport> {
        self.build_within(home, spec, items, threads, crate::decoder::DEFAULT_MEMORY_BUDGET)
    }

    /// [`KvStore::build`] with each prefill's working memory (beyond the model's weights) kept within
    /// `memory_budget` bytes: long items are prefilled in chunks ([`Decoder::prefill_within`]).
    pub fn build_within(
        &self,
        home: &Path,
        spec: &BuildSpec,
        items: &[(usize, String)],
        threads: usize,
        memory_budget: u64,
    ) -> Result<BuildReport> {
        let _span =
            tracing::info_span!("kv_build", column = %spec.column, items = items.len(), memory_budget).entered();
        let start = Instant::now();
        if spec.models.is_empty() || spec.ratios.is_empty() {
            return Err(KvError::Usage("a KV build needs at least one model and one ratio".into()));
        }
        for &r in &spec.ratios {
            if !(0.0..1.0).contains(&r) {
                return Err(KvError::Usage(format!("compression ratio {r} is outside [0, 1)")));
            }
        }
        self.record_spec(spec)?;
        let mut report = BuildReport { cleaned: self.clean_temp()?, ..Default::default() };
        for model in &spec.models {
            let profiles: Vec<Profile> = spec.profiles().into_iter().filter(|p| &p.model == model).collect();
            let mut decoder: Option<Decoder> = None;
            // The chat template comes from the converted model's config: checking records needs no session.
            let config = crate::prepare::ensure_decoder(home, model)?.config;
            let bar = crate::progress::bar(items.len() as u64, &format!("kv {model}"));
            for (item, text) in items {
                bar.inc(1);
                // A record counts only if it caches this very text: data may have changed since it was built.
                let source = crate::decoder::item_source(&config, &crate::decoder::item_prefix(&config, text));
                let done = profiles.iter().all(|p| {
                    read_meta(&self.record_path(&spec.column, p, *item)).is_ok_and(|m| {
                        m.source_sha256 == source && crate::decoder::within_item_limit(&config, memory_budget, m.tokens)
                    })
                });
                if done {
                    report.skipped += 1;
                    continue;
                }
                if decoder.is_none() {
                    decoder = Some(Decoder::load(home, model, threads)?);
                }
                let dec = decoder.as_ref().ok_or_else(|| KvError::Runtime("decoder missing".into()))?;
                let prompt = dec.item_prefix(text);
                let tokens = dec.encode_item_within(&prompt, memory_budget)?;
                if tokens.is_empty() {
                    return Err(KvError::Usage(format!("item {item} of {} is empty", spec.column)));
                }
                let needs_stats = spec.press == Press::ExpectedAttention;
                // The chunk the budget allows is both what runs and what the report says ran.
                let chunk = crate::decoder::prefill_chunk(dec.config(), tokens.len(), memory_budget);
                let (past, stats) = dec.prefill_chunked(&tokens, needs_stats, chunk)?;
                report.longest_chunk = report.longest_chunk.max(chunk);
                let ratios: Vec<f64> = profiles.iter().map(|p| p.ratio).collect();
                let source = crate::decoder::item_source(dec.config(), &prompt);
                // One ratio's copy at a time: a long item's ladder at once is several times its past in memory.
                let mut next = profiles.iter();
                compress_each(spec.press, spec.positions, dec.config(), &past, stats.as_ref(), &ratios, |_, c| {
                    let p = next.next().ok_or_else(|| KvError::Runtime("more ratios than profiles".into()))?;
                    let meta = RecordMeta::of(p, dec.config().layers, tokens.len(), &c, &source);
                    write_atomic(&self.record_path(&spec.column, p, *item), &encode_record(&meta, &c)?)
                })?;
                report.built += 1;
            }
            bar.finish_and_clear();
            // What the compressed ratios save over these items, measured now so that no query has to
            // (`crate::calibration`; nothing is measured where an earlier build or query did).
            let compressed: Vec<f64> = profiles.iter().map(|p| p.ratio).filter(|r| *r > 0.0).collect();
            let Some(base) = profiles.first().map(|p| Profile { ratio: 0.0, ..p.clone() }) else { continue };
            if compressed.is_empty() {
                continue;
            }
            let kv_dir = self.root.parent().unwrap_or(&self.root);
            let texts: Vec<String> = items.iter().map(|(_, t)| t.clone()).collect();
            // Both ways of asking, so that a later query of either kind reads its figures.
            let rungs =
                crate::calibration::Rungs { base: &base, ratios: &compressed, passes: &crate::calibration::Pass::ALL };
            if crate::calibration::recorded(kv_dir, &config, &rungs, &texts)?.is_none() {
                if decoder.is_none() {
                    decoder = Some(Decoder::load(home, model, threads)?);
                }
                let dec = decoder.as_ref().ok_or_else(|| KvError::Runtime("decoder missing".into()))?;
                crate::calibration::calibrate(dec, kv_dir, &rungs, &texts, memory_budget, None)?;
                report.calibrated += 1;
            }
        }
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Every record file under the repository.
    pub fn records(&self) -> Result<Vec<PathBuf>> {
        Ok(walk(&self.root)?
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors") && !is_temp(p))
            .collect())
    }

    /// Reads every record and reports those that fail their checks.
    pub fn verify(&self) -> Result<VerifyReport> {
        let _span = tracing::info_span!("kv_verify", root = %self.root.display()).entered();
        let mut report = VerifyReport::default();
        for path in self.records()? {
            report.checked += 1;
            let res = fs::read(&path).map_err(|e| KvError::io(&path, e)).and_then(|b| decode_record(&path, &b));
            if let Err(e) = res {
                report.corrupt.push((path, e.to_string()));
            }
        }
        Ok(report)
    }

    /// Deletes the corrupt records [`KvStore::verify`] finds (a later build recreates them); returns them.
    pub fn remove_corrupt(&self) -> Result<Vec<(PathBuf, String)>> {
        let report = self.verify()?;
        for (p, _) in &report.corrupt {
            fs::remove_file(p).map_err(|e| KvError::io(p, e))?;
        }
        Ok(report.corrupt)
    }

    /// Items, bytes and mean kept tokens per (column, profile).
    pub fn stats(&self) -> Result<Vec<ProfileStats>> {
        let mut acc: BTreeMap<(String, String), ProfileStats> = BTreeMap::new();
        for path in self.records()? {
            let (Some(profile), Some(column)) = (
                path.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()),
                path.parent().and_then(|p| p.parent()).and_then(|p| p.file_name()).and_then(|n| n.to_str()),
            ) else {
                continue;
            };
            let meta = read_meta(&path)?;
            let bytes = fs::metadata(&path).map_err(|e| KvError::io(&path, e))?.len();
            let s = acc.entry((column.to_string(), profile.to_string())).or_insert_with(|| ProfileStats {
                column: column.into(),
                profile: profile.into(),
                items: 0,
                bytes: 0,
                mean_kept: 0.0,
                mean_tokens: 0.0,
            });
            s.items += 1;
            s.bytes += bytes;
            s.mean_kept += meta.kept as f64;
            s.mean_tokens += meta.tokens as f64;
        }
        Ok(acc
            .into_values()
            .map(|mut s| {
                s.mean_kept /= s.items.max(1) as f64;
                s.mean_tokens /= s.items.max(1) as f64;
                s
            })
            .collect())
    }

    /// Deletes a profile's records of a column.
    pub fn drop_profile(&self, column: &str, profile: &str) -> Result<()> {
        let dir = self.root.join(column).join(profile);
        fs::remove_dir_all(&dir).map_err(|e| KvError::io(&dir, e))
    }

    /// Loads `items`' caches of a profile in batches whose padded size fits `memory_budget` bytes (f32, as the
    /// runtime holds them); at least one item per batch.
    pub fn load_batches(
        &self,
        column: &str,
        profile: &Profile,
        items: &[usize],
        memory_budget: usize,
    ) -> Result<Vec<Vec<(usize, KvPast)>>> {
        let mut batches = Vec::new();
        let mut current: Vec<(usize, KvPast)> = Vec::new();
        let mut longest = 0usize;
        for &item in items {
            let rec = self.read(column, profile, item)?;
            let per_token = rec.past.bytes() / rec.past.len.max(1);
            let l = longest.max(rec.past.len);
            if !current.is_empty() && (current.len() + 1) * l * per_token > memory_budget {
                batches.push(std::mem::take(&mut current));
                longest = 0;
            }
            longest = longest.max(rec.past.len);
            current.push((item, rec.past));
        }
        if !current.is_empty() {
            batches.push(current);
        }
        Ok(batches)
    }
}

/// The temporary files of interrupted writes under `root` (never read as records).
pub fn temporaries(root: &Path) -> Result<Vec<PathBuf>> {
    Ok(walk(root)?.into_iter().filter(|p| is_temp(p)).collect())
}

/// Whether the temporary at `p` was left by a writer that is gone: the process its name holds
/// ([`stretto_models::fsutil::unique_tmp`]: `.{name}.tmp{pid}-{n}`) no longer runs. One of this process (another
/// thread may be writing it) or of a live one stays; where processes cannot be looked up, one an hour old goes.
pub(crate) fn abandoned(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let pid = name
        .rsplit_once(".tmp")
        .and_then(|(_, rest)| rest.split_once('-'))
        .and_then(|(pid, _)| pid.parse::<u32>().ok());
    let proc = Path::new("/proc/self");
    match pid {
        Some(pid) if pid == std::process::id() => false,
        Some(pid) if proc.exists() => !Path::new("/proc").join(pid.to_string()).exists(),
        _ => fs::metadata(p)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > std::time::Duration::from_secs(3600))),
    }
}

pub(crate) fn is_temp(p: &Path) -> bool {
    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.') && n.contains(".tmp"))
}

fn walk(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(KvError::io(&dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| KvError::io(&dir, e))?;
            let path = entry.path();
            if entry.file_type().map_err(|e| KvError::io(&path, e))?.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> RecordMeta {
        RecordMeta {
            format: RECORD_FORMAT,
            model: "m".into(),
            press: Press::KeyNorm,
            ratio: 0.5,
            positions: Positions::Keep,
            layers: 2,
            kv_heads: 1,
            head_dim: 2,
            tokens: 6,
            kept: 3,
            next_position: 6,
            source_sha256: sha256_text("x"),
            checksum: String::new(),
        }
    }

    fn past() -> KvPast {
        let v = |s: f32| (0..6).map(|i| s * i as f32 - 1.5).collect::<Vec<f32>>();
        KvPast {
            keys: vec![v(0.5), v(0.25)],
            values: vec![v(-1.0), v(2.0)],
            len: 3,
            next_position: 6,
            kv_heads: 1,
            head_dim: 2,
        }
    }

    #[test]
    #[cfg(unix)]
    fn only_temporaries_of_writers_that_are_gone_are_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let store = KvStore::open(dir.path(), "movie").unwrap();
        let records = store.root().join("reviewtext");
        fs::create_dir_all(&records).unwrap();
        // A child that has exited is a writer that is gone; this process and its parent are alive.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let live = std::os::unix::process::parent_id();
        let name = |pid: u32| records.join(format!(".00000001.safetensors.tmp{pid}-0"));
        for pid in [gone, live, std::process::id()] {
            fs::write(name(pid), b"half").unwrap();
        }
        assert_eq!(store.clean_temp().unwrap(), 1);
        assert!(!name(gone).exists() && name(live).exists() && name(std::process::id()).exists());
    }

    #[test]
    fn a_damaged_manifest_is_rebuilt_from_the_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = KvStore::open(dir.path(), "movie").unwrap();
        let profile = |model: &str, ratio: f64| Profile {
            model: model.into(),
            press: Press::KeyNorm,
            ratio,
            positions: Positions::Keep,
        };
        for (model, ratio) in [("smollm2-135m", 0.5), ("smollm2-135m", 0.0), ("qwen2.5-coder-0.5b", 0.0)] {
            let path = store.record_path("reviewtext", &profile(model, ratio), 1);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, b"a record").unwrap();
        }
        // A real record tells its ratio exactly; its folder's name rounds it (0.125 -> 0.12 or 0.13).
        let exact = RecordMeta { model: "smollm2-135m".into(), ratio: 0.125, ..meta() };
        let path = store.record_path("reviewtext", &profile("smollm2-135m", 0.125), 2);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, encode_record(&exact, &past()).unwrap()).unwrap();
        let spec = |model: &str, ratios: &[f64]| BuildSpec {
            column: "reviewtext".into(),
            models: vec![model.into()],
            ratios: ratios.to_vec(),
            press: Press::KeyNorm,
            positions: Positions::Keep,
        };
        assert_eq!(store.recover_manifest().unwrap(), None, "no manifest is not a damaged one");
        fs::write(store.root().join("manifest.json"), b"[{\"column\": \"revi").unwrap();
        assert!(matches!(store.manifest(), Err(KvError::Corrupt { .. })));
        // A build recording its spec beside the damage keeps what the records tell and adds its own.
        let new = spec("smollm2-135m", &[0.8]);
        store.record_spec(&new).unwrap();
        let specs = store.manifest().unwrap();
        assert_eq!(specs.len(), 3, "{specs:?}");
        assert!(specs.contains(&spec("smollm2-135m", &[0.0, 0.125, 0.5])), "{specs:?}");
        assert!(specs.contains(&spec("qwen2.5-coder-0.5b", &[0.0])) && specs.contains(&new));
        let damaged = fs::read(store.root().join("manifest.json.damaged")).unwrap();
        assert_eq!(damaged, b"[{\"column\": \"revi", "the damaged file is kept");
        // `kv repair`'s first step: reports the rebuild (of a manifest that is not even UTF-8), then nothing more.
        fs::write(store.root().join("manifest.json"), [0xff, 0xfe, b'[']).unwrap();
        let r = store.recover_manifest().unwrap().expect("damage that is not text is damage too");
        assert_eq!(r.specs.len(), 2, "{:?}", r.specs);
        assert_eq!(store.recover_manifest().unwrap(), None);
        // A dataset that has no repository is left without one.
        let typo = KvStore::open(dir.path(), "moive").unwrap();
        assert_eq!(typo.recover_manifest().unwrap(), None);
        assert!(!typo.root().exists());
    }

    #[test]
    fn records_round_trip_and_are_deterministic() {
        let a = encode_record(&meta(), &past()).unwrap();
        let b = encode_record(&meta(), &past()).unwrap();
        assert_eq!(a, b);
        let rec = decode_record(Path::new("r"), &a).unwrap();
        assert_eq!(rec.past, past(), "values exactly representable in f16 come back exactly");
        assert_eq!(rec.meta.kept, 3);
    }

    #[test]
    fn a_header_claiming_more_layers_than_it_holds_is_corrupt() {
        let mut m = meta();
        m.layers = usize::MAX / 4;
        // Written as the header claims (no tensor for the extra layers).
        let bytes = encode_record(&m, &past()).unwrap();
        let e = decode_record(Path::new("r.safetensors"), &bytes).unwrap_err().to_string();
        assert!(e.contains("layers and holds 4 tensors"), "{e}");
    }

    #[test]
    fn a_flipped_byte_is_reported() {
        let bytes = encode_record(&meta(), &past()).unwrap();
        for at in (8..bytes.len()).step_by(7) {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            let err = decode_record(Path::new("item.safetensors"), &bad).unwrap_err().to_string();
            assert!(err.contains("item.safetensors"), "{err}");
        }
        assert!(decode_record(Path::new("t"), &bytes[..bytes.len() / 2]).is_err());
    }

    #[test]
    fn profile_ids_parse_back() {
        let p = Profile {
            model: "smollm2-135m".into(),
            press: Press::ExpectedAttention,
            ratio: 0.5,
            positions: Positions::Rerotate,
        };
        assert_eq!(p.id(), "smollm2-135m@expected-attention-0.50-rerotate");
        assert_eq!(Profile::parse(&p.id()).unwrap(), p);
        assert!(Profile::parse("nonsense").is_err());
    }
}
