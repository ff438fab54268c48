//! `stretto kv …`: building, verifying, repairing and budgeting a dataset's KV cache repository.

use std::collections::BTreeSet;
use std::path::Path;

use arrow::array::{Array, AsArray};
use stretto::kv::decoder::{Decoder, Step, Want};
use stretto::kv::press::{Positions, Press};
use stretto::kv::store::{BuildReport, BuildSpec, KvStore, Profile, ProfileStats};
use stretto_core::datasets::Dataset;

/// Errors of the kv commands (library errors of both layers, and bad arguments).
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The items of a text column of a dataset's main table: `(row, text)`, null rows skipped, at most `limit`.
pub fn column_items(dataset: &str, column: &str, limit: Option<usize>) -> Result<Vec<(usize, String)>, Error> {
    let ds = Dataset::load(dataset)?;
    let (table, batch) = ds.main_table();
    let col = batch.column_by_name(column).ok_or_else(|| {
        let names: Vec<String> = batch.schema().fields().iter().map(|f| f.name().clone()).collect();
        format!("dataset `{dataset}` (table `{table}`) has no column `{column}`; columns: {}", names.join(", "))
    })?;
    let text = col.as_string_opt::<i32>().ok_or_else(|| format!("column `{column}` of `{dataset}` is not text"))?;
    let n = limit.unwrap_or(usize::MAX).min(text.len());
    Ok((0..n).filter(|&i| text.is_valid(i)).map(|i| (i, text.value(i).to_string())).collect())
}

/// Parses `0,0.5,0.8`.
pub fn parse_ratios(s: &str) -> Result<Vec<f64>, Error> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let r: f64 = part.trim().parse().map_err(|_| format!("`{part}` is not a ratio"))?;
        if !(0.0..1.0).contains(&r) {
            return Err(format!("compression ratio {r} is outside [0, 1)").into());
        }
        out.push(r);
    }
    if out.is_empty() {
        return Err("--ratios needs at least one ratio".into());
    }
    Ok(out)
}

/// `stretto kv build`.
#[allow(clippy::too_many_arguments)]
pub fn build(
    kv_dir: &Path,
    dataset: &str,
    column: &str,
    models: &[String],
    ratios: &[f64],
    press: &str,
    rerotate: bool,
    limit: Option<usize>,
    memory_budget: u64,
) -> Result<BuildReport, Error> {
    let items = column_items(dataset, column, limit)?;
    let spec = BuildSpec {
        column: column.into(),
        models: models.to_vec(),
        ratios: ratios.to_vec(),
        press: Press::parse(press)?,
        positions: if rerotate { Positions::Rerotate } else { Positions::Keep },
    };
    // A catalog decoder or one the user registered in the model home (`stretto query --model NAME=PATH`).
    for m in models {
        stretto::kv::prepare::check_decoder_name(&stretto::core::context::default_home(), m)?;
    }
    let store = KvStore::open(kv_dir, dataset)?;
    Ok(store.build_within(&stretto::core::context::default_home(), &spec, &items, 0, memory_budget)?)
}

/// What `stretto kv repair` did.
#[derive(Debug, Default)]
pub struct Repaired {
    /// The damaged manifest, rebuilt from the records on disk.
    pub manifest: Option<stretto::kv::store::RecoveredManifest>,
    /// The corrupt records removed, each with why.
    pub removed: Vec<String>,
    /// The rebuild of every missing record of items built before.
    pub build: BuildReport,
}

/// `stretto kv repair`: rebuilds a damaged manifest from the records, removes corrupt records and rebuilds every
/// missing record of items built before.
pub fn repair(kv_dir: &Path, dataset: &str, memory_budget: u64) -> Result<Repaired, Error> {
    let store = KvStore::open(kv_dir, dataset)?;
    let manifest = store.recover_manifest()?;
    let removed = store.remove_corrupt()?;
    let mut total = BuildReport::default();
    for spec in store.manifest()? {
        // Items this spec built before: every record name under its profiles, plus the removed ones.
        let mut ids = BTreeSet::new();
        for p in spec.profiles() {
            let dir = store.root().join(&spec.column).join(p.id());
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for e in entries.flatten() {
                    if let Some(id) =
                        e.path().file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse::<usize>().ok())
                    {
                        ids.insert(id);
                    }
                }
            }
        }
        for (p, _) in &removed {
            if p.starts_with(store.root().join(&spec.column)) {
                if let Some(id) = p.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse::<usize>().ok()) {
                    ids.insert(id);
                }
            }
        }
        let max = ids.iter().max().map(|m| m + 1);
        let items: Vec<(usize, String)> =
            column_items(dataset, &spec.column, max)?.into_iter().filter(|(i, _)| ids.contains(i)).collect();
        let r = store.build_within(&stretto::core::context::default_home(), &spec, &items, 0, memory_budget)?;
        total.built += r.built;
        total.skipped += r.skipped;
        total.cleaned += r.cleaned;
        total.calibrated += r.calibrated;
        total.seconds += r.seconds;
        total.longest_chunk = total.longest_chunk.max(r.longest_chunk);
    }
    Ok(Repaired { manifest, removed: removed.into_iter().map(|(_, why)| why).collect(), build: total })
}

/// A profile's footprint with its probe agreement, for budgeting.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BudgetRow {
    /// Footprint.
    #[serde(flatten)]
    pub stats: ProfileStats,
    /// Fraction of sampled items whose probe answer matches the uncompressed (ratio 0) cache's.
    pub agreement: Option<f64>,
    /// Dropped to honour the budget.
    pub dropped: bool,
}

/// The probe behind budget decisions: a yes/no question whose answer sign is compared with ratio 0's.
pub const PROBE: &str = "Is the text above positive in tone? Answer 1 for yes or 0 for no.";

/// `stretto kv stats`, optionally honouring a disk budget by dropping dominated profiles.
pub fn stats(kv_dir: &Path, dataset: &str, budget: Option<u64>, sample: usize) -> Result<Vec<BudgetRow>, Error> {
    let store = KvStore::open(kv_dir, dataset)?;
    let stats = store.stats()?;
    let mut rows: Vec<BudgetRow> =
        stats.into_iter().map(|s| BudgetRow { stats: s, agreement: None, dropped: false }).collect();
    let Some(budget) = budget else { return Ok(rows) };
    let total: u64 = rows.iter().map(|r| r.stats.bytes).sum();
    if total <= budget {
        return Ok(rows);
    }
    // Agreement with the ratio-0 profile of the same model, press and positions, on the first `sample` items.
    let home = stretto::core::context::default_home();
    let mut decoders: std::collections::HashMap<String, Decoder> = Default::default();
    for row in rows.iter_mut() {
        let p = Profile::parse(&row.stats.profile)?;
        let base = Profile { ratio: 0.0, ..p.clone() };
        let column = row.stats.column.clone();
        if p.ratio == 0.0 {
            row.agreement = Some(1.0);
            continue;
        }
        if !decoders.contains_key(&p.model) {
            decoders.insert(p.model.clone(), Decoder::load(&home, &p.model, 0)?);
        }
        let dec = &decoders[&p.model];
        let q = dec.encode(&dec.question_suffix(PROBE))?;
        let (yes, no) = (dec.token_id("1")?, dec.token_id("0")?);
        let (mut same, mut n) = (0usize, 0usize);
        for item in 0..sample.max(1) * 4 {
            if n >= sample {
                break;
            }
            let (Ok(a), Ok(b)) = (store.read(&column, &p, item), store.read(&column, &base, item)) else { continue };
            let out = dec.run(
                &[Step { past: Some(&a.past), tokens: &q }, Step { past: Some(&b.past), tokens: &q }],
                Want::default(),
            )?;
            let sign = |l: &[f32]| l[yes as usize] > l[no as usize];
            same += usize::from(sign(&out[0].logits) == sign(&out[1].logits));
            n += 1;
        }
        row.agreement = (n > 0).then(|| same as f64 / n as f64);
    }
    // Drop dominated profiles (another of the same column is no larger and agrees at least as well, one of the two
    // strictly), largest first, until the budget holds.
    let mut kept_bytes = total;
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| rows[b].stats.bytes.cmp(&rows[a].stats.bytes));
    for i in order {
        if kept_bytes <= budget {
            break;
        }
        let ai = rows[i].agreement.unwrap_or(0.0);
        let dominated = rows.iter().enumerate().any(|(j, r)| {
            j != i
                && !r.dropped
                && r.stats.column == rows[i].stats.column
                && r.stats.bytes <= rows[i].stats.bytes
                && r.agreement.unwrap_or(0.0) >= ai
                && (r.stats.bytes < rows[i].stats.bytes || r.agreement.unwrap_or(0.0) > ai)
        });
        if dominated {
            store.drop_profile(&rows[i].stats.column, &rows[i].stats.profile)?;
            rows[i].dropped = true;
            kept_bytes -= rows[i].stats.bytes;
        }
    }
    if kept_bytes > budget {
        tracing::warn!(kept_bytes, budget, "no further profile is dominated; the budget cannot be met by dropping");
    }
    Ok(rows)
}
