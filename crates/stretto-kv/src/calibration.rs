//! What compression saves over a column's items, per model: measured once where the items' caches are built, and
//! kept beside the caches, so that a query knows before it asks a compressed rung anything whether the rung can be
//! cheaper than its uncompressed parent over these items (#21).
//!
//! A compressed past is shorter, so a question over it attends over fewer positions; how much that saves depends on
//! the items' length and on the model (on a CPU the weights' matrix products dominate a short past). A query
//! otherwise learns it by asking every compressed rung about its probe tuples, which costs what the rung costs.
//! Here a fixed, query-agnostic question runs over a few of the items ([`CALIBRATION_ITEMS`], the same ones for
//! every query over them: those whose cached prefix hashes first) at every ratio of the ladder, in one or both of
//! the ways operators ask ([`Pass`]): a filter's one question pass, and a map's question pass followed by one-token
//! steps ([`MAP_STEPS`], a fixed number, so that answers of different lengths do not weigh on the figure). A query
//! measures only the way its operator asks (a first query over new items pays for its own figures, not for another
//! kind's); `stretto kv build` measures both ([`Pass::ALL`]). A way lacking a figure is measured at every ratio asked
//! and every ratio already on record, so that all of a way's figures come from one run. Each item's seconds (the
//! least of [`CALIBRATION_ROUNDS`] timed rounds over every ratio in turn, after an untimed run warms the runtime and
//! every ratio's pasts are read once) are added to [`CALIBRATION_FILE`] in the cache directory, one JSON line each
//! (the file rewritten and renamed into place), and read back by later queries; a foreign line, or one of fewer
//! rounds (an earlier version's), is skipped, so its figure is measured again.
//!
//! ```no_run
//! use stretto_kv::calibration::{calibrate, Pass, Rungs};
//! use stretto_kv::store::Profile;
//! use stretto_kv::Decoder;
//! let dec = Decoder::load(&stretto_core::context::default_home(), "smollm2-135m", 0)?;
//! let base = Profile::parse("smollm2-135m@expected-attention-0.00")?;
//! let items: Vec<String> = vec!["A long product description…".into(); 1];
//! let rungs = Rungs { base: &base, ratios: &[0.5, 0.8], passes: &[Pass::Filter] };
//! let c = calibrate(&dec, std::path::Path::new("/tmp/kv"), &rungs, &items, 1 << 30, None)?;
//! println!("a filter at 0.5 costs {:?} of its uncompressed parent", c.share_of_parent(Pass::Filter, 0.5));
//! # Ok::<(), stretto_kv::KvError>(())
//! ```

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::budget::DiskBudget;
use crate::cache::PastSource;
use crate::convert::DecoderConfig;
use crate::decoder::{argmax, Decoder, KvPast, Step, Want};
use crate::error::{KvError, Result};
use crate::models::FilterProtocol;
use crate::store::{append_lines, Profile};
use crate::tasks::group_chars;

/// Items a calibration measures (fewer where the column has fewer).
pub const CALIBRATION_ITEMS: usize = 8;

/// One-token steps after a map's question pass in its calibration.
pub const MAP_STEPS: usize = 4;

/// Timed rounds a calibration figure is the least of. Each round times every ratio in turn, so that a pause of the
/// machine (another process, a page-cache miss) lands on one ratio's run of one round, not on a share: one round
/// measured Qwen2.5-Coder-0.5B's uncompressed map pass over 8 e-commerce descriptions at 0.97 s per item and its
/// compressed ones at 0.21–0.22 s (a round over 8 other items: 0.21 s at all three), and so offered its compressed
/// rungs at a 22% share, which the probe found no cheaper.
pub const CALIBRATION_ROUNDS: usize = 2;

/// The file, in the cache directory, that calibration figures are appended to.
pub const CALIBRATION_FILE: &str = "calibration.jsonl";

/// The statement the calibration's filter question asks about every item: any statement would do, since only the
/// time of the pass is kept.
pub const CALIBRATION_STATEMENT: &str = "the text above names a person, a product or a place";

/// Which way of asking a figure times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// A filter's question pass (one run over the question's tokens).
    Filter,
    /// A map's question pass and [`MAP_STEPS`] one-token steps.
    Map,
}

impl Pass {
    /// Both ways, as a build measures them.
    pub const ALL: [Pass; 2] = [Pass::Filter, Pass::Map];
}

/// What a calibration measures: `base`'s model (its press and positions) at ratio 0 and at each of `ratios`, in
/// each of `passes`.
#[derive(Debug, Clone, Copy)]
pub struct Rungs<'a> {
    /// The uncompressed profile (its ratio is ignored: 0 is always measured, as every share's denominator).
    pub base: &'a Profile,
    /// The compressed ratios (0 and duplicates are ignored).
    pub ratios: &'a [f64],
    /// The ways of asking to time.
    pub passes: &'a [Pass],
}

impl Rungs<'_> {
    /// The profiles measured: 0 and the positive ratios, ascending, each once.
    fn profiles(&self) -> Vec<Profile> {
        ladder_of(self.ratios).into_iter().map(|ratio| Profile { ratio, ..self.base.clone() }).collect()
    }
}

/// One line of [`CALIBRATION_FILE`].
#[derive(Serialize, Deserialize)]
struct Line {
    /// The cache profile's id ([`Profile::id`]).
    profile: String,
    pass: Pass,
    /// SHA-256 of the item's cached prefix ([`Decoder::item_prefix`]), as the cache records name it.
    item: String,
    seconds: f64,
    /// How many timed rounds `seconds` is the least of (absent in an earlier version's lines, which took one).
    #[serde(default = "one_round")]
    rounds: usize,
}

/// What a line without `rounds` took.
fn one_round() -> usize {
    1
}

/// What a calibration measured over some items: per pass and ratio, the mean seconds per item.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// Items measured.
    pub items: usize,
    /// (pass, ratio, mean seconds per item).
    pub seconds: Vec<(Pass, f64, f64)>,
}

impl Calibration {
    /// Mean seconds per item of `pass` over pasts compressed at `ratio`.
    pub fn seconds(&self, pass: Pass, ratio: f64) -> Option<f64> {
        self.seconds.iter().find(|(p, r, _)| *p == pass && (r - ratio).abs() < 1e-9).map(|s| s.2)
    }

    /// What `pass` over pasts compressed at `ratio` costs as a share of the same pass over the uncompressed pasts.
    pub fn share_of_parent(&self, pass: Pass, ratio: f64) -> Option<f64> {
        let parent = self.seconds(pass, 0.0).filter(|s| *s > 0.0)?;
        Some(self.seconds(pass, ratio)? / parent)
    }
}

/// The items of `items` a calibration measures: up to [`CALIBRATION_ITEMS`] distinct ones, those whose cached
/// prefix (under `config`'s chat template, [`crate::decoder::item_prefix`]) hashes first, so that every query over a
/// column measures the same ones. Returns (prefix SHA-256, item) pairs.
pub fn calibration_items(config: &DecoderConfig, items: &[String]) -> Vec<(String, String)> {
    let mut by_sha: Vec<(String, String)> = items
        .iter()
        .map(|i| (crate::decoder::item_source(config, &crate::decoder::item_prefix(config, i)), i.clone()))
        .collect();
    by_sha.sort();
    by_sha.dedup_by(|a, b| a.0 == b.0);
    by_sha.truncate(CALIBRATION_ITEMS);
    by_sha
}

/// Reads the figures of [`CALIBRATION_FILE`] in `kv_dir`: (profile id, pass, item SHA-256) to seconds, the latest
/// line winning. A missing file is an empty record; a torn or foreign line, or one of fewer than
/// [`CALIBRATION_ROUNDS`] rounds, is skipped.
fn read_figures(path: &Path) -> Result<HashMap<(String, Pass, String), f64>> {
    let mut out = HashMap::new();
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(KvError::io(path, e)),
    };
    for line in BufReader::new(f).lines() {
        let Ok(line) = line else { break };
        let Ok(l) = serde_json::from_str::<Line>(&line) else { continue };
        if l.seconds.is_finite() && l.seconds > 0.0 && l.rounds >= CALIBRATION_ROUNDS {
            out.insert((l.profile, l.pass, l.item), l.seconds);
        }
    }
    Ok(out)
}

/// The ladder a calibration of `ratios` measures: 0 and the positive ratios, ascending, each once.
fn ladder_of(ratios: &[f64]) -> Vec<f64> {
    let mut ladder: Vec<f64> = std::iter::once(0.0).chain(ratios.iter().copied().filter(|r| *r > 0.0)).collect();
    ladder.sort_by(f64::total_cmp);
    ladder.dedup();
    ladder
}

/// What `figures` hold of `profiles` in `passes` over `chosen`: per pass and ratio, the mean over the items with a
/// figure.
fn summary(
    figures: &HashMap<(String, Pass, String), f64>,
    profiles: &[Profile],
    passes: &[Pass],
    chosen: &[(String, String)],
) -> Calibration {
    let mut seconds = Vec::new();
    for p in profiles {
        for &pass in passes {
            let each: Vec<f64> =
                chosen.iter().filter_map(|(sha, _)| figures.get(&(p.id(), pass, sha.clone())).copied()).collect();
            if !each.is_empty() {
                seconds.push((pass, p.ratio, each.iter().sum::<f64>() / each.len() as f64));
            }
        }
    }
    Calibration { items: chosen.len(), seconds }
}

/// The passes of `passes` for which `figures` lack a figure of some profile of `profiles` over some item of
/// `chosen`.
fn missing(
    figures: &HashMap<(String, Pass, String), f64>,
    profiles: &[Profile],
    passes: &[Pass],
    chosen: &[(String, String)],
) -> Vec<Pass> {
    let lacks = |pass: Pass| {
        profiles.iter().any(|p| chosen.iter().any(|(sha, _)| !figures.contains_key(&(p.id(), pass, sha.clone()))))
    };
    passes.iter().copied().filter(|&pass| lacks(pass)).collect()
}

/// The calibration of `rungs` over `items` as [`CALIBRATION_FILE`] in `kv_dir` holds it, without measuring
/// anything (`config` is the model's, for its chat template): `None` unless every figure is there.
pub fn recorded(
    kv_dir: &Path,
    config: &DecoderConfig,
    rungs: &Rungs<'_>,
    items: &[String],
) -> Result<Option<Calibration>> {
    let chosen = calibration_items(config, items);
    let profiles = rungs.profiles();
    let figures = read_figures(&kv_dir.join(CALIBRATION_FILE))?;
    let complete = missing(&figures, &profiles, rungs.passes, &chosen).is_empty();
    Ok(complete.then(|| summary(&figures, &profiles, rungs.passes, &chosen)))
}

/// The calibration of `rungs` over `items`: read from [`CALIBRATION_FILE`] in `kv_dir` where every figure is there
/// ([`recorded`]), else measured and added: each pass that lacks some figure, at every ratio asked and every ratio
/// on record (so that a share's two figures come from one run), the chosen items' pasts prefilled where missing,
/// within `budget`. `memory_budget` bounds a run's working memory as for the operators' own passes.
pub fn calibrate(
    dec: &Decoder,
    kv_dir: &Path,
    rungs: &Rungs<'_>,
    items: &[String],
    memory_budget: u64,
    budget: Option<Arc<DiskBudget>>,
) -> Result<Calibration> {
    let _span = tracing::info_span!("kv_calibration", model = dec.name(), items = items.len()).entered();
    let chosen = calibration_items(dec.config(), items);
    let path = kv_dir.join(CALIBRATION_FILE);
    let mut figures = read_figures(&path)?;
    let profiles = rungs.profiles();
    let lacking = if chosen.is_empty() { Vec::new() } else { missing(&figures, &profiles, rungs.passes, &chosen) };
    if !lacking.is_empty() {
        // Every ratio on record for these items and a lacking way is measured again with those asked: a share's two
        // figures must come from one run, and a new ratio-0 figure replaces the old one.
        let on_record: Vec<f64> = figures
            .keys()
            .filter(|(_, pass, sha)| lacking.contains(pass) && chosen.iter().any(|(c, _)| c == sha))
            .filter_map(|(id, _, _)| Profile::parse(id).ok())
            .filter(|p| Profile { ratio: p.ratio, ..rungs.base.clone() }.id() == p.id())
            .map(|p| p.ratio)
            .collect();
        let all = [rungs.ratios, &on_record].concat();
        let measured = Rungs { ratios: &all, ..*rungs }.profiles();
        let texts: Vec<String> = chosen.iter().map(|(_, t)| t.clone()).collect();
        let source = |p: &Profile| {
            let s = PastSource::new(p.clone(), kv_dir.to_path_buf()).with_memory_budget(memory_budget);
            match &budget {
                Some(b) => s.with_budget(b.clone()),
                None => s,
            }
        };
        // Every ratio's record is written where the uncompressed one is prefilled (the ladder).
        source(&measured[0]).ensure(dec, &texts)?;
        let question = crate::tasks::filter_prompt(dec, FilterProtocol::DEFAULT, CALIBRATION_STATEMENT)?;
        // Within the memory budget as the operators' own passes: groups of items whose pasts fit it, each loaded
        // from its record when it runs (the loading counts, as it does in an operator's seconds).
        let batches: Vec<Vec<String>> =
            crate::tasks::groups_within(&texts, CALIBRATION_ITEMS, group_chars(dec.config(), memory_budget))
                .into_iter()
                .map(|group| group.into_iter().map(|i| texts[i].clone()).collect())
                .collect();
        let timed = |src: &PastSource, pass: Pass, batches: &[Vec<String>]| -> Result<f64> {
            let mut total = 0.0;
            for items in batches {
                let start = Instant::now();
                let (pasts, _) = src.get(dec, items)?;
                match pass {
                    Pass::Filter => run_filter(dec, &pasts, &question.tokens)?,
                    Pass::Map => run_map(dec, &pasts, &question.tokens)?,
                }
                total += start.elapsed().as_secs_f64();
            }
            Ok(total)
        };
        // A first, untimed run of the first group warms the runtime (allocations at the batch's shapes, thread
        // pools) so that no ratio pays for it: over 8 e-commerce descriptions a first run took 1.6–2.5× the runs
        // after it, which agreed within 15% of each other. A map's run warms both ways (its steps start with the
        // question pass). Every ratio's records are read once first, so that none is timed from a cold disk while
        // another comes from the page cache. Each figure is then the least of [`CALIBRATION_ROUNDS`] rounds, each
        // timing every ratio in turn.
        let warm = if lacking.contains(&Pass::Map) { Pass::Map } else { Pass::Filter };
        timed(&source(&measured[0]), warm, &batches[..batches.len().min(1)])?;
        for p in &measured {
            let src = source(p);
            for items in &batches {
                src.get(dec, items)?;
            }
        }
        // Per profile and lacking pass, the least seconds per item over the rounds.
        let mut least = vec![vec![f64::INFINITY; lacking.len()]; measured.len()];
        for _ in 0..CALIBRATION_ROUNDS.max(1) {
            for (p, least) in measured.iter().zip(least.iter_mut()) {
                let src = source(p);
                for (&pass, least) in lacking.iter().zip(least.iter_mut()) {
                    *least = least.min(timed(&src, pass, &batches)? / texts.len() as f64);
                }
            }
        }
        let mut text = String::new();
        for (p, least) in measured.iter().zip(&least) {
            for (&pass, &each) in lacking.iter().zip(least) {
                // As a later read of the file will see it (JSON's float parsing may differ in the last bit), so that
                // this query and the next decide on the same figure.
                let each: f64 = serde_json::to_string(&each)
                    .and_then(|t| serde_json::from_str(&t))
                    .map_err(|e| KvError::Runtime(e.to_string()))?;
                for (sha, _) in &chosen {
                    figures.insert((p.id(), pass, sha.clone()), each);
                    let line =
                        Line { profile: p.id(), pass, item: sha.clone(), seconds: each, rounds: CALIBRATION_ROUNDS };
                    text.push_str(&serde_json::to_string(&line).map_err(|e| KvError::Runtime(e.to_string()))?);
                    text.push('\n');
                }
            }
        }
        append_lines(&path, &text)?;
        tracing::info!(model = dec.name(), items = chosen.len(), "compression calibrated over the items' caches");
    }
    Ok(summary(&figures, &profiles, rungs.passes, &chosen))
}

/// One filter question pass over `pasts`, batched as an operator batches them.
fn run_filter(dec: &Decoder, pasts: &[KvPast], q: &[u32]) -> Result<()> {
    let steps: Vec<Step<'_>> = pasts.iter().map(|p| Step { past: Some(p), tokens: q }).collect();
    dec.run(&steps, Want::default())?;
    Ok(())
}

/// A map's question pass over `pasts` and [`MAP_STEPS`] one-token steps (the most likely token fed back, whatever
/// it is, so that every item takes the same number of steps).
fn run_map(dec: &Decoder, pasts: &[KvPast], q: &[u32]) -> Result<()> {
    let steps: Vec<Step<'_>> = pasts.iter().map(|p| Step { past: Some(p), tokens: q }).collect();
    let mut outs = dec.run(&steps, Want { present: true, query_stats: false })?;
    for _ in 0..MAP_STEPS {
        let next: Vec<u32> = outs.iter().map(|o| argmax(&o.logits)).collect();
        let presents: Vec<KvPast> = outs
            .into_iter()
            .map(|o| o.present.ok_or_else(|| KvError::Runtime("the decoder returned no extended past".into())))
            .collect::<Result<_>>()?;
        let steps: Vec<Step<'_>> =
            presents.iter().zip(&next).map(|(p, t)| Step { past: Some(p), tokens: std::slice::from_ref(t) }).collect();
        outs = dec.run(&steps, Want { present: true, query_stats: false })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_line_wins_and_torn_or_foreign_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CALIBRATION_FILE);
        let line = |s: f64| {
            let line = Line {
                profile: "m@p-0.00".into(),
                pass: Pass::Map,
                item: "ab".into(),
                seconds: s,
                rounds: CALIBRATION_ROUNDS,
            };
            serde_json::to_string(&line).unwrap()
        };
        // An earlier version's line (one round, no `rounds` field) is skipped: its figure is measured again.
        let old = r#"{"profile":"m@p-0.50","pass":"map","item":"ab","seconds":0.125}"#;
        std::fs::write(
            &path,
            format!("{}\nnot json\n{}\n{old}\n{{\"profile\":\"m@p-0.00\",\"pa", line(0.5), line(0.25)),
        )
        .unwrap();
        let figures = read_figures(&path).unwrap();
        assert_eq!(figures.len(), 1);
        assert_eq!(figures[&("m@p-0.00".to_string(), Pass::Map, "ab".to_string())], 0.25);
        assert!(read_figures(&dir.path().join("absent.jsonl")).unwrap().is_empty());
    }

    #[test]
    fn a_share_is_the_compressed_pass_over_the_uncompressed_one() {
        let c = Calibration {
            items: 8,
            seconds: vec![(Pass::Filter, 0.0, 0.5), (Pass::Filter, 0.5, 0.375), (Pass::Map, 0.5, 0.25)],
        };
        assert_eq!(c.share_of_parent(Pass::Filter, 0.5), Some(0.75));
        assert_eq!(c.share_of_parent(Pass::Filter, 0.8), None, "no figure at 0.8");
        assert_eq!(c.share_of_parent(Pass::Map, 0.5), None, "no uncompressed map figure");
    }
}
