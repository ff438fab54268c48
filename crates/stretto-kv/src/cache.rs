//! Cached pasts for operators: an item's KV cache found by content, wherever `stretto kv build` stored it, or
//! computed on a miss (and kept, so the next run finds it).
//!
//! Operators see tuples, not row ids (a tuple may come out of a join or a relational filter), so records are found
//! by the SHA-256 of the cached text, which every record carries. The index scans record headers once per
//! process and profile. A miss is prefilled and compressed at the standard ladder ratios at once (sibling
//! operators of the same model then hit), and written under `adhoc/` of the cache directory, within the
//! directory's [`DiskBudget`] when the source has one: a record the budget cannot hold is used from memory and
//! not kept. A record that has gone (evicted by another process, deleted by hand) or fails its checks is
//! recomputed, never an error.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::budget::{touch, DiskBudget};
use crate::convert::DecoderConfig;
use crate::decoder::{item_limit, within_item_limit, Decoder, KvPast};
use crate::error::{KvError, Result};
use crate::press::{compress_each, kept};
use crate::store::{decode_record, encode_record, read_meta, write_atomic, Profile, RecordMeta};

/// Rounds every key and value to f16 precision in place: what a stored record (f16) gives back when loaded.
fn round_to_f16(past: &mut KvPast) {
    for v in past.keys.iter_mut().chain(past.values.iter_mut()) {
        for x in v.iter_mut() {
            *x = half::f16::from_f32(*x).to_f32();
        }
    }
}

/// Ratios a miss is compressed at (besides the requested one).
pub const LADDER: [f64; 3] = [0.0, 0.5, 0.8];

/// Loads the model that prefills a source's missing pasts (see [`PastSource::with_prefill`]).
pub type PrefillModel = Arc<dyn Fn() -> Result<Arc<Decoder>> + Send + Sync>;

/// Finds or computes the pasts of one profile.
pub struct PastSource {
    profile: Profile,
    kv_dir: PathBuf,
    index: Mutex<Option<HashMap<String, PathBuf>>>,
    budget: Option<Arc<DiskBudget>>,
    /// The model that prefills missing pasts, when it is not the one asking (an int8 rung reads its f32 parent's
    /// caches, so both answer over the same pasts).
    prefill: Option<PrefillModel>,
    /// Whether the user was told that the budget is full (once per source, not once per record).
    told_full: std::sync::atomic::AtomicBool,
    /// Working memory a prefill may take (see [`Decoder::prefill_within`]).
    memory_budget: u64,
}

fn adhoc_path(kv_dir: &Path, profile: &Profile, source: &str) -> PathBuf {
    kv_dir.join("adhoc").join(profile.id()).join(format!("{source}.safetensors"))
}

impl std::fmt::Debug for PastSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PastSource")
            .field("profile", &self.profile)
            .field("kv_dir", &self.kv_dir)
            .field("own_prefill", &self.prefill.is_some())
            .finish()
    }
}

impl PastSource {
    /// A source for `profile` over the cache directory `kv_dir`.
    pub fn new(profile: Profile, kv_dir: PathBuf) -> Self {
        Self {
            profile,
            kv_dir,
            index: Mutex::new(None),
            budget: None,
            prefill: None,
            told_full: Default::default(),
            memory_budget: crate::decoder::DEFAULT_MEMORY_BUDGET,
        }
    }

    /// Missing pasts are prefilled by the decoder `model` loads (same tokenizer and architecture; loaded only when
    /// a past is missing) instead of the one asking.
    pub fn with_prefill(mut self, model: PrefillModel) -> Self {
        self.prefill = Some(model);
        self
    }

    /// Prefills missing pasts within `bytes` of working memory (default
    /// [`crate::decoder::DEFAULT_MEMORY_BUDGET`]): long items are prefilled in chunks, and questions over the pasts
    /// run in groups that fit it ([`crate::tasks::group_chars`]).
    pub fn with_memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// The working memory a model run over this source's pasts may take, bytes.
    pub fn memory_budget(&self) -> u64 {
        self.memory_budget
    }

    /// Keeps ad-hoc records within `budget` (evicting the least recently used ones, or not keeping a new one).
    pub fn with_budget(mut self, budget: Arc<DiskBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    fn build_index(&self, config: &DecoderConfig) -> HashMap<String, PathBuf> {
        let id = self.profile.id();
        let mut map = HashMap::new();
        // <kv_dir>/<dataset>/<column>/<profile>/*.safetensors
        let Ok(datasets) = fs::read_dir(&self.kv_dir) else { return map };
        for ds in datasets.flatten() {
            let Ok(columns) = fs::read_dir(ds.path()) else { continue };
            for col in columns.flatten() {
                let dir = col.path().join(&id);
                let Ok(records) = fs::read_dir(&dir) else { continue };
                for r in records.flatten() {
                    let p = r.path();
                    if p.extension().is_some_and(|e| e == "safetensors") {
                        match read_meta(&p) {
                            Ok(meta) if within_item_limit(config, self.memory_budget, meta.tokens) => {
                                map.insert(meta.source_sha256, p);
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        map
    }

    /// The usable record of the item prefix whose SHA-256 is `source`, if one is stored: an indexed record was
    /// checked when the index was built; an ad-hoc one is checked here (its header).
    fn usable(&self, index: &HashMap<String, PathBuf>, config: &DecoderConfig, source: &str) -> Option<PathBuf> {
        match index.get(source) {
            Some(path) => path.is_file().then(|| path.clone()),
            None => {
                let path = adhoc_path(&self.kv_dir, &self.profile, source);
                read_meta(&path).is_ok_and(|m| within_item_limit(config, self.memory_budget, m.tokens)).then_some(path)
            }
        }
    }

    /// The ratios a miss is compressed at: the [`LADDER`] and this profile's own.
    fn ladder_ratios(&self) -> Vec<f64> {
        let mut ratios: Vec<f64> = LADDER.to_vec();
        if !ratios.contains(&self.profile.ratio) {
            ratios.push(self.profile.ratio);
        }
        ratios
    }

    /// What [`PastSource::ensure`] would add on disk for `items`, without prefilling anything: how many of them have
    /// no record yet, and about how many bytes their records would take at every ladder ratio (f16 keys and values
    /// of the tokens each ratio keeps; headers not counted).
    pub fn missing_bytes(&self, dec: &Decoder, items: &[String]) -> Result<(usize, u64)> {
        let mut guard = self.index.lock().map_err(|_| KvError::Runtime("cache index poisoned".into()))?;
        let index = guard.get_or_insert_with(|| self.build_index(dec.config()));
        let c = dec.config();
        let per_token = (2 * c.layers * c.kv_heads * c.head_dim * 2) as u64;
        let limit = item_limit(c, self.memory_budget);
        let ratios = self.ladder_ratios();
        let (mut missing, mut bytes) = (0, 0u64);
        for item in items {
            let prompt = dec.item_prefix(item);
            if self.usable(index, c, &crate::decoder::item_source(c, &prompt)).is_some() {
                continue;
            }
            let tokens = dec.encode(&prompt)?.len().min(limit);
            missing += 1;
            bytes += ratios.iter().map(|&r| kept(tokens, r) as u64 * per_token).sum::<u64>();
        }
        Ok((missing, bytes))
    }

    /// Whether `item`'s past has a usable record (one [`PastSource::ensure`] would not prefill), without tokenizing
    /// it: what [`PastSource::missing_bytes`] checks first, for a caller that needs no size.
    pub fn is_stored(&self, dec: &Decoder, item: &str) -> Result<bool> {
        let mut guard = self.index.lock().map_err(|_| KvError::Runtime("cache index poisoned".into()))?;
        let index = guard.get_or_insert_with(|| self.build_index(dec.config()));
        let source = crate::decoder::item_source(dec.config(), &dec.item_prefix(item));
        Ok(self.usable(index, dec.config(), &source).is_some())
    }

    /// Computes and stores the pasts of those `items` not cached yet, without loading the cached ones; returns how
    /// many were computed. It stops at the first record the disk budget cannot hold: the rest would be prefilled
    /// only to be dropped (an operator prefills a missing past where it uses it).
    pub fn ensure(&self, dec: &Decoder, items: &[String]) -> Result<usize> {
        Ok(self.ensure_timed(dec, items)?.iter().flatten().count())
    }

    /// [`PastSource::ensure`], saying per item how many seconds its prefill took (prefill, compression at every
    /// ladder ratio and writing): `None` where its record was already stored, or where the disk budget stopped
    /// the prefills before it.
    pub fn ensure_timed(&self, dec: &Decoder, items: &[String]) -> Result<Vec<Option<f64>>> {
        let mut guard = self.index.lock().map_err(|_| KvError::Runtime("cache index poisoned".into()))?;
        let index = guard.get_or_insert_with(|| self.build_index(dec.config()));
        let bar = crate::progress::bar(items.len() as u64, &format!("kv {}", self.profile.id()));
        let mut computed = 0;
        let mut seconds = vec![None; items.len()];
        for (i, item) in items.iter().enumerate() {
            bar.inc(1);
            let prompt = dec.item_prefix(item);
            let source = crate::decoder::item_source(dec.config(), &prompt);
            if let Some(path) = self.usable(index, dec.config(), &source) {
                touch(&path);
                continue;
            }
            let started = std::time::Instant::now();
            let (_, kept) = self.compute(dec, &prompt, &source)?;
            seconds[i] = Some(started.elapsed().as_secs_f64());
            computed += 1;
            if !kept {
                tracing::info!(
                    profile = %self.profile.id(),
                    computed,
                    left = items.len() - computed,
                    "the disk budget holds no more records: the other pasts are prefilled where they are used"
                );
                break;
            }
            index.insert(source.clone(), adhoc_path(&self.kv_dir, &self.profile, &source));
        }
        bar.finish_and_clear();
        Ok(seconds)
    }

    /// The pasts of `items` (raw item texts), in order. `computed[i]` says whether item `i` had to be prefilled.
    pub fn get(&self, dec: &Decoder, items: &[String]) -> Result<(Vec<KvPast>, Vec<bool>)> {
        let mut guard = self.index.lock().map_err(|_| KvError::Runtime("cache index poisoned".into()))?;
        let index = guard.get_or_insert_with(|| self.build_index(dec.config()));
        let mut out = Vec::with_capacity(items.len());
        let mut computed = Vec::with_capacity(items.len());
        for item in items {
            let prompt = dec.item_prefix(item);
            let source = crate::decoder::item_source(dec.config(), &prompt);
            let found = index.get(&source).cloned().or_else(|| {
                let p = adhoc_path(&self.kv_dir, &self.profile, &source);
                p.is_file().then_some(p)
            });
            if let Some(path) = found {
                match fs::read(&path).map_err(|e| KvError::io(&path, e)).and_then(|b| decode_record(&path, &b)) {
                    Ok(rec)
                        if rec.meta.source_sha256 == source
                            && within_item_limit(dec.config(), self.memory_budget, rec.meta.tokens) =>
                    {
                        touch(&path);
                        out.push(rec.past);
                        computed.push(false);
                        continue;
                    }
                    // A record that has gone (evicted) or is corrupt is never used: recompute (and overwrite the
                    // ad-hoc copy).
                    Ok(_) | Err(_) => tracing::warn!(path = %path.display(), "KV record gone or unusable; recomputing"),
                }
            }
            let (past, kept) = self.compute(dec, &prompt, &source)?;
            if kept {
                index.insert(source.clone(), adhoc_path(&self.kv_dir, &self.profile, &source));
            } else {
                index.remove(&source);
            }
            out.push(past);
            computed.push(true);
        }
        Ok((out, computed))
    }

    /// Prefills and compresses one item at every ladder ratio; keeps each record the budget holds. Returns this
    /// profile's past and whether its record was kept.
    ///
    /// One ratio at a time ([`compress_each`]): each compressed copy is encoded, written and dropped before the
    /// next is made, so a long item costs about twice its uncompressed past in memory, not four times.
    fn compute(&self, dec: &Decoder, prompt: &str, source: &str) -> Result<(KvPast, bool)> {
        let parent = self.prefill.as_ref().map(|load| load()).transpose()?;
        let dec = parent.as_deref().unwrap_or(dec);
        let tokens = dec.encode_item_within(prompt, self.memory_budget)?;
        let query_stats = self.profile.press == crate::press::Press::ExpectedAttention;
        let (mut past, stats) = dec.prefill_within(&tokens, query_stats, self.memory_budget)?;
        let ratios = self.ladder_ratios();
        // This profile's past, as later runs will load it (f16), so that a miss answers exactly as a hit would;
        // `None` with `mine_kept` set where it is the uncompressed past itself, rounded once the ladder is done.
        let (mut mine, mut mine_kept, mut mine_is_past) = (None, false, false);
        compress_each(
            self.profile.press,
            self.profile.positions,
            dec.config(),
            &past,
            stats.as_ref(),
            &ratios,
            |r, c| {
                let profile = Profile { ratio: r, ..self.profile.clone() };
                let meta = RecordMeta::of(&profile, dec.config().layers, tokens.len(), &c, source);
                let path = adhoc_path(&self.kv_dir, &profile, source);
                let bytes = encode_record(&meta, &c)?;
                let keep = match &self.budget {
                    Some(b) => b.make_room(bytes.len() as u64)?,
                    None => true,
                };
                // A record that cannot be written (a full disk) is used from memory like one over the budget: the
                // cache is a cache, and the query's answers do not depend on it.
                let written = !keep
                    || write_atomic(&path, &bytes)
                        .inspect_err(|e| {
                            if !self.told_full.swap(true, std::sync::atomic::Ordering::Relaxed) {
                                tracing::warn!(error = %e, "a KV record cannot be written: new KV records of this \
                                    profile are used from memory and not kept");
                            }
                        })
                        .is_ok();
                if !keep && !self.told_full.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        profile = %self.profile.id(),
                        "the disk budget is full of caches in use: new KV records of this profile are used from memory \
                         and not kept (raise --disk-budget to keep them)"
                    );
                }
                let keep = keep && written;
                drop(bytes);
                if r == self.profile.ratio {
                    mine_kept = keep;
                    match c {
                        std::borrow::Cow::Owned(mut owned) => {
                            round_to_f16(&mut owned);
                            mine = Some(owned);
                        }
                        std::borrow::Cow::Borrowed(_) => mine_is_past = true,
                    }
                }
                Ok(())
            },
        )?;
        if mine_is_past {
            round_to_f16(&mut past);
            mine = Some(past);
        }
        let mine = mine.map(|m| (m, mine_kept));
        mine.ok_or_else(|| KvError::Runtime("requested ratio missing from the ladder".into()))
    }
}
