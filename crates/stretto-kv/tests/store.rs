//! The KV store with the real SmolLM2-135M decoder: stored caches answer questions like the in-memory ones.

use std::sync::OnceLock;

use stretto_core::context::default_home;
use stretto_kv::decoder::{Decoder, KvPast, Step, Want};
use stretto_kv::press::{compress_ladder, Positions, Press};
use stretto_kv::store::{BuildSpec, KvStore, Profile};

fn decoder() -> &'static Decoder {
    static DEC: OnceLock<Decoder> = OnceLock::new();
    DEC.get_or_init(|| Decoder::load(&default_home(), "smollm2-135m", 2).unwrap())
}

fn f16_rounded(p: &KvPast) -> KvPast {
    let r = |v: &Vec<f32>| v.iter().map(|x| half::f16::from_f32(*x).to_f32()).collect::<Vec<f32>>();
    KvPast { keys: p.keys.iter().map(r).collect(), values: p.values.iter().map(r).collect(), ..p.clone() }
}

fn logits(dec: &Decoder, past: &KvPast, q: &[u32]) -> Vec<f32> {
    dec.run(&[Step { past: Some(past), tokens: q }], Want::default()).unwrap().remove(0).logits
}

const REVIEWS: [&str; 3] = [
    "A tender, beautifully acted film that stays with you long after the credits roll.",
    "Two hours of my life I will never get back; the script is lazy and the jokes fall flat.",
    "Competent but forgettable: the kind of thriller you half-watch on a plane.",
];

#[test]
fn a_ratio_zero_record_reproduces_the_uncompressed_logits() {
    let dec = decoder();
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), "movie").unwrap();
    let items: Vec<(usize, String)> = REVIEWS.iter().enumerate().map(|(i, t)| (i, t.to_string())).collect();
    let spec = BuildSpec {
        column: "reviewtext".into(),
        models: vec!["smollm2-135m".into()],
        ratios: vec![0.0, 0.5],
        press: Press::ExpectedAttention,
        positions: Positions::Keep,
    };
    let report = store.build(&default_home(), &spec, &items, 2).unwrap();
    assert_eq!(report.built, 3);
    // The build calibrated the compressed ratio over its items (beside the caches), once.
    assert_eq!(report.calibrated, 1);
    let texts: Vec<String> = items.iter().map(|(_, t)| t.clone()).collect();
    let calibration =
        stretto_kv::calibration::recorded(dir.path(), dec.config(), &both(&spec.profiles()[0], &[0.5]), &texts)
            .unwrap();
    assert!(calibration.is_some_and(|c| c.items == 3), "the build's calibration is read back");
    assert_eq!(store.build(&default_home(), &spec, &items, 2).unwrap().calibrated, 0, "nothing measured again");
    let q = dec.encode(&dec.question_suffix("Is this review clearly positive? Answer 1 or 0.")).unwrap();
    let zero = &spec.profiles()[0];
    for (i, text) in &items {
        let (past, _) = dec.prefill(&dec.encode(&dec.item_prefix(text)).unwrap(), false).unwrap();
        let rec = store.read("reviewtext", zero, *i).unwrap();
        assert_eq!(rec.past, f16_rounded(&past), "ratio 0 stores every token, exactly as f16");
        let stored = logits(dec, &rec.past, &q);
        // Bit-identical to the same cache held in memory (at the storage precision) ...
        assert_eq!(stored, logits(dec, &f16_rounded(&past), &q));
        // ... and within f16 rounding of the f32 cache.
        let exact = logits(dec, &past, &q);
        let worst = stored.iter().zip(&exact).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
        eprintln!("item {i}: max |Δlogit| f16 store vs f32 = {worst:.4} (scale {scale:.1})");
        assert!(worst <= 0.01 * scale, "{worst}");
    }
    // Loading under a memory budget batches items; a batch answers as the items do alone.
    let half = &spec.profiles()[1];
    let one = store.read("reviewtext", half, 0).unwrap().past.bytes();
    let batches = store.load_batches("reviewtext", half, &[0, 1, 2], 2 * one + one / 2).unwrap();
    assert!(batches.len() >= 2 && batches.iter().all(|b| !b.is_empty()));
    for batch in batches {
        let steps: Vec<Step<'_>> = batch.iter().map(|(_, p)| Step { past: Some(p), tokens: &q }).collect();
        let out = dec.run(&steps, Want::default()).unwrap();
        for ((_, p), o) in batch.iter().zip(out) {
            let alone = logits(dec, p, &q);
            let d = alone.iter().zip(&o.logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(d < 1e-3, "{d}");
        }
    }
}

#[test]
fn a_compressed_ladder_keeps_its_token_budget_and_the_answer() {
    let dec = decoder();
    let q = dec.encode(&dec.question_suffix("Is this review clearly positive? Answer 1 or 0.")).unwrap();
    let (yes, no) = (dec.token_id("1").unwrap(), dec.token_id("0").unwrap());
    for text in &REVIEWS[..2] {
        let tokens = dec.encode(&dec.item_prefix(text)).unwrap();
        let out = dec.run(&[Step { past: None, tokens: &tokens }], Want { present: true, query_stats: true }).unwrap();
        let past = out[0].present.clone().unwrap();
        let stats = out[0].query_stats.clone().unwrap();
        let ladder =
            compress_ladder(Press::ExpectedAttention, Positions::Keep, dec.config(), &past, Some(&stats), &[0.0, 0.3])
                .unwrap();
        let odds = |p: &KvPast| {
            let l = logits(dec, p, &q);
            l[yes as usize] - l[no as usize]
        };
        let (full, pressed) = (odds(&ladder[0]), odds(&ladder[1]));
        eprintln!("log-odds full {full:.3}, at 0.3 {pressed:.3}");
        assert!(pressed.is_finite());
        assert_eq!(full > 0.0, pressed > 0.0, "the 0.3 cache flips the decision");
        assert_eq!(ladder[1].len, (past.len as f64 * 0.7 + 1e-9).floor() as usize);
    }
    let p = Profile::parse("smollm2-135m@key-norm-0.80").unwrap();
    assert_eq!(p.press, Press::KeyNorm);
}

/// A query's ad-hoc caches of a long item, prefilled within a tiny memory budget (chunks of 128 tokens), are the
/// caches one whole prefill gives: at ratio 0 and, through the merged query statistics, at ratio 0.5.
#[test]
fn a_past_source_within_a_memory_budget_caches_what_a_whole_prefill_does() {
    use stretto_kv::cache::PastSource;
    let dec = decoder();
    let item = REVIEWS.iter().cycle().take(20).copied().collect::<Vec<_>>().join(" ");
    let tokens = dec.encode(&dec.item_prefix(&item)).unwrap();
    assert!(tokens.len() > 2 * stretto_kv::decoder::MIN_PREFILL_CHUNK, "{} tokens", tokens.len());
    let whole = dec.run(&[Step { past: None, tokens: &tokens }], Want { present: true, query_stats: true }).unwrap();
    let (past, stats) = (whole[0].present.as_ref().unwrap(), whole[0].query_stats.as_ref().unwrap());
    let ratios = [0.0, 0.5];
    let want =
        compress_ladder(Press::ExpectedAttention, Positions::Keep, dec.config(), past, Some(stats), &ratios).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (ratio, want) in ratios.iter().zip(&want) {
        let profile = Profile {
            model: "smollm2-135m".into(),
            press: Press::ExpectedAttention,
            ratio: *ratio,
            positions: Positions::Keep,
        };
        let source = PastSource::new(profile, dir.path().join(format!("kv-{ratio}"))).with_memory_budget(0);
        let (got, computed) = source.get(dec, std::slice::from_ref(&item)).unwrap();
        assert_eq!(computed, [true]);
        let (got, want) = (&got[0], f16_rounded(want));
        assert_eq!((got.len, got.next_position), (want.len, want.next_position), "ratio {ratio}");
        for l in [0, 15, 29] {
            let scale = want.keys[l].iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = got.keys[l].iter().zip(&want.keys[l]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err <= 2e-3 * scale, "ratio {ratio}, layer {l}: {err} of {scale}");
        }
    }
}

/// `stretto kv build --memory-budget`: a build within a small budget prefills a long item in the smallest chunks
/// and stores the cache one whole prefill gives; at the default budget the chunks are larger.
#[test]
fn a_store_build_within_a_memory_budget_prefills_in_chunks_and_stores_the_whole_cache() {
    use stretto_kv::decoder::{MAX_PREFILL_CHUNK, MIN_PREFILL_CHUNK};
    let dec = decoder();
    let item = REVIEWS.iter().cycle().take(20).copied().collect::<Vec<_>>().join(" ");
    let tokens = dec.encode(&dec.item_prefix(&item)).unwrap();
    assert!(tokens.len() > MAX_PREFILL_CHUNK, "{} tokens", tokens.len());
    let spec = BuildSpec {
        column: "reviewtext".into(),
        models: vec!["smollm2-135m".into()],
        ratios: vec![0.0],
        press: Press::ExpectedAttention,
        positions: Positions::Keep,
    };
    let items = vec![(0, item.clone())];
    let (small, default) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = KvStore::open(small.path(), "movie").unwrap();
    let report = store.build_within(&default_home(), &spec, &items, 2, 0).unwrap();
    assert_eq!((report.built, report.longest_chunk), (1, MIN_PREFILL_CHUNK));
    let report = KvStore::open(default.path(), "movie").unwrap().build(&default_home(), &spec, &items, 2).unwrap();
    assert_eq!((report.built, report.longest_chunk), (1, MAX_PREFILL_CHUNK.min(tokens.len())));
    // The chunked record holds the whole prefill's cache, up to float rounding.
    let (whole, _) = dec.prefill_chunked(&tokens, false, tokens.len()).unwrap();
    let want = f16_rounded(&whole);
    let got = store.read("reviewtext", &spec.profiles()[0], 0).unwrap().past;
    assert_eq!(got.len, want.len);
    for l in [0, 15, 29] {
        let scale = want.keys[l].iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = got.keys[l].iter().zip(&want.keys[l]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err <= 2e-3 * scale, "layer {l}: {err} of {scale}");
    }
}

#[test]
fn an_item_longer_than_the_models_context_is_cut_to_its_head_in_its_caches() {
    use stretto_kv::cache::PastSource;
    use stretto_kv::decoder::item_token_limit;
    // The converted model records its context (from the GGUF header; filled in for folders converted before).
    assert_eq!(decoder().config().context_length, Some(8192));
    // The same files, told the model's context is 640 tokens.
    let home = default_home();
    let mut files = stretto_kv::prepare::ensure_decoder(&home, "smollm2-135m").unwrap();
    files.config.context_length = Some(640);
    let dec = Decoder::from_files(&home, "smollm2-135m", &files, 2).unwrap();
    let limit = item_token_limit(dec.config()).unwrap();
    assert!(limit < 640, "room is left for the question and the answer");
    let long = REVIEWS.iter().cycle().take(30).copied().collect::<Vec<_>>().join(" ");
    let whole = dec.encode(&dec.item_prefix(&long)).unwrap();
    assert!(whole.len() > limit, "{} tokens", whole.len());
    assert_eq!(dec.encode_item(&dec.item_prefix(&long)).unwrap(), whole[..limit], "the head is kept");
    let short = dec.encode(&dec.item_prefix(REVIEWS[0])).unwrap();
    assert_eq!(dec.encode_item(&dec.item_prefix(REVIEWS[0])).unwrap(), short, "a short item is not cut");

    let dir = tempfile::tempdir().unwrap();
    let profile =
        Profile { model: "smollm2-135m".into(), press: Press::KeyNorm, ratio: 0.0, positions: Positions::Keep };
    let items = vec![long.clone(), REVIEWS[0].to_string()];
    // Caches made with the whole context (as before items were cut) ...
    let (whole_pasts, computed) = PastSource::new(profile.clone(), dir.path().into()).get(decoder(), &items).unwrap();
    assert_eq!(computed, [true, true]);
    assert_eq!(whole_pasts[0].len, whole.len());
    // ... are made again where they hold more than the model's limit; the short item's is reused.
    let (pasts, computed) = PastSource::new(profile.clone(), dir.path().into()).get(&dec, &items).unwrap();
    assert_eq!(computed, [true, false]);
    assert_eq!((pasts[0].len, pasts[0].next_position), (limit, limit as i64), "the cache holds the head only");
    assert_eq!(pasts[1].len, short.len());
    // What was kept on disk is the cut cache, and its answers are those of the head prefilled alone.
    let (stored, computed) = PastSource::new(profile, dir.path().into()).get(&dec, &items).unwrap();
    assert_eq!(computed, [false, false]);
    assert_eq!(stored[0].len, limit);
    let q = dec.encode(&dec.question_suffix("Is this review clearly positive? Answer 1 or 0.")).unwrap();
    let (head, _) = dec.prefill(&whole[..limit], false).unwrap();
    let (a, b) = (logits(&dec, &stored[0], &q), logits(&dec, &f16_rounded(&head), &q));
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(worst <= 0.01 * scale, "{worst} (scale {scale})");
}

/// What a past source would add on disk is estimated without prefilling anything: the records `ensure` then writes
/// (every ladder ratio) take those bytes plus their headers, and once they are stored nothing is missing; an item is
/// stored exactly once its record is written.
#[test]
fn a_past_source_estimates_the_records_it_would_write() {
    use stretto_kv::cache::PastSource;
    let dec = decoder();
    let dir = tempfile::tempdir().unwrap();
    let profile = Profile::parse("smollm2-135m@expected-attention-0.00").unwrap();
    let source = PastSource::new(profile, dir.path().into());
    let items: Vec<String> = REVIEWS.iter().map(|r| r.to_string()).collect();
    let (missing, bytes) = source.missing_bytes(dec, &items).unwrap();
    assert_eq!(missing, 3);
    assert!(!source.is_stored(dec, &items[0]).unwrap());
    assert_eq!(source.ensure(dec, &items[..1]).unwrap(), 1);
    assert!(source.is_stored(dec, &items[0]).unwrap() && !source.is_stored(dec, &items[1]).unwrap());
    assert_eq!(source.ensure(dec, &items).unwrap(), 2);
    let written: u64 = walk(dir.path())
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .map(|p| p.metadata().unwrap().len())
        .sum();
    // Headers (tensor table and metadata) are a few KB per record; nine records.
    assert!(bytes <= written && written <= bytes + 9 * 8_000, "estimated {bytes}, written {written}");
    assert_eq!(source.missing_bytes(dec, &items).unwrap(), (0, 0));
    assert_eq!(
        PastSource::new(Profile::parse("smollm2-135m@expected-attention-0.50").unwrap(), dir.path().into())
            .missing_bytes(dec, &items)
            .unwrap()
            .0,
        0,
        "the sibling ratios were written too"
    );
}

/// A build the disk budget cannot hold stops at its first refused record instead of prefilling items only to drop
/// them; what it could not keep is prefilled where it is used.
#[test]
fn a_past_source_stops_building_once_the_budget_holds_no_more() {
    use stretto_kv::budget::DiskBudget;
    use stretto_kv::cache::PastSource;
    let dec = decoder();
    let dir = tempfile::tempdir().unwrap();
    let profile = Profile::parse("smollm2-135m@expected-attention-0.00").unwrap();
    let budget = std::sync::Arc::new(DiskBudget::new(dir.path(), None, 1));
    let source = PastSource::new(profile, dir.path().into()).with_budget(budget);
    let items: Vec<String> = REVIEWS.iter().map(|r| r.to_string()).collect();
    assert_eq!(source.ensure(dec, &items).unwrap(), 1, "one prefill showed that nothing fits");
    // Timed, the same: seconds for the one prefill, none for the items it stopped before.
    let seconds = source.ensure_timed(dec, &items).unwrap();
    assert!(seconds[0].is_some_and(|s| s > 0.0) && seconds[1..] == [None, None], "{seconds:?}");
    let (pasts, computed) = source.get(dec, &items).unwrap();
    assert_eq!((pasts.len(), computed), (3, vec![true; 3]));
}

/// A past computed on a miss is exactly what loading its stored record gives later (f16), at ratio 0 and at a
/// compressed ratio, so that a query answers the same whether or not the cache was there.
#[test]
fn a_miss_answers_with_the_past_its_record_gives_back() {
    use stretto_kv::cache::PastSource;
    let dec = decoder();
    let items: Vec<String> = REVIEWS.iter().map(|r| r.to_string()).collect();
    for id in ["smollm2-135m@expected-attention-0.00", "smollm2-135m@expected-attention-0.50"] {
        let dir = tempfile::tempdir().unwrap();
        let source = || PastSource::new(Profile::parse(id).unwrap(), dir.path().into());
        let (missed, computed) = source().get(dec, &items).unwrap();
        let (hit, again) = source().get(dec, &items).unwrap();
        assert_eq!(computed, vec![true; 3], "{id}");
        assert_eq!(again, vec![false; 3], "{id}");
        assert_eq!(missed, hit, "{id}");
    }
}

/// An item whose cache would outgrow the memory budget is cut to the head that fits ([`item_memory_limit`]), and a
/// cache made under a larger budget is made again, cut, when a smaller one asks for it.
///
/// [`item_memory_limit`]: stretto_kv::decoder::item_memory_limit
#[test]
fn an_items_cache_is_cut_to_what_the_memory_budget_holds() {
    use stretto_kv::cache::PastSource;
    use stretto_kv::decoder::MIN_ITEM_TOKENS;
    let dec = decoder();
    let item = REVIEWS.iter().cycle().take(60).copied().collect::<Vec<_>>().join(" ");
    let whole = dec.encode(&dec.item_prefix(&item)).unwrap().len();
    assert!(whole > MIN_ITEM_TOKENS, "{whole} tokens");
    let dir = tempfile::tempdir().unwrap();
    let source = |budget: u64| {
        PastSource::new(Profile::parse("smollm2-135m@expected-attention-0.00").unwrap(), dir.path().into())
            .with_memory_budget(budget)
    };
    let items = std::slice::from_ref(&item);
    let (roomy, computed) = source(1 << 30).get(dec, items).unwrap();
    assert_eq!((roomy[0].len, computed), (whole, vec![true]));
    // The smallest budget reads the fewest tokens a budget cuts to; the roomy record is too long for it.
    let (tight, computed) = source(0).get(dec, items).unwrap();
    assert_eq!((tight[0].len, computed), (MIN_ITEM_TOKENS, vec![true]));
    let (again, computed) = source(0).get(dec, items).unwrap();
    assert_eq!((again[0].len, computed), (MIN_ITEM_TOKENS, vec![false]), "the cut record is kept");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The calibration of `base`'s model at `ratios`, in both ways of asking (as `stretto kv build` measures it).
fn both<'a>(base: &'a Profile, ratios: &'a [f64]) -> stretto_kv::calibration::Rungs<'a> {
    stretto_kv::calibration::Rungs { base, ratios, passes: &stretto_kv::calibration::Pass::ALL }
}

/// A calibration times a fixed question over the items' pasts at every ratio, in the ways asked, keeps the figures
/// beside the caches, and reads them back rather than measuring again.
#[test]
fn a_calibration_is_measured_once_and_read_back() {
    use stretto_kv::calibration::{
        calibrate, calibration_items, recorded, Pass, Rungs, CALIBRATION_FILE, CALIBRATION_ITEMS,
    };
    let dec = decoder();
    let dir = tempfile::tempdir().unwrap();
    let base = Profile::parse("smollm2-135m@expected-attention-0.00").unwrap();
    // Ten long items (about 600 tokens each): the calibration takes the eight whose prefix hashes first.
    let items: Vec<String> = (0..10).map(|i| format!("Item {i}. {}", REVIEWS.join(" ").repeat(8))).collect();
    let chosen = calibration_items(dec.config(), &items);
    assert_eq!(chosen.len(), CALIBRATION_ITEMS);
    let mut reversed = items.clone();
    reversed.reverse();
    assert_eq!(calibration_items(dec.config(), &reversed), chosen, "the same items whatever their order");
    let filter = Rungs { base: &base, ratios: &[0.8], passes: &[Pass::Filter] };
    assert_eq!(recorded(dir.path(), dec.config(), &filter, &items).unwrap(), None, "nothing measured yet");
    // A filter's query measures the filter pass alone.
    let c = calibrate(dec, dir.path(), &filter, &items, 1 << 30, None).unwrap();
    assert_eq!(c.items, CALIBRATION_ITEMS);
    assert_eq!(recorded(dir.path(), dec.config(), &filter, &reversed).unwrap().as_ref(), Some(&c));
    let share = c.share_of_parent(Pass::Filter, 0.8).unwrap();
    // (How much compression saves is a timing, measured by the engine's runs, not asserted here.)
    assert!(share.is_finite() && share > 0.0, "{share}");
    assert!(c.seconds(Pass::Filter, 0.5).is_none(), "only the ratios asked");
    assert!(c.seconds(Pass::Map, 0.8).is_none() && c.seconds(Pass::Map, 0.0).is_none(), "only the pass asked");
    assert_eq!(recorded(dir.path(), dec.config(), &both(&base, &[0.8]), &items).unwrap(), None, "no map figures");
    let path = dir.path().join(CALIBRATION_FILE);
    let written = std::fs::read_to_string(&path).unwrap();
    // Two ratios, one pass, eight items.
    assert_eq!(written.lines().count(), 2 * CALIBRATION_ITEMS);
    // Read back: the same figures, and nothing measured or written again.
    assert_eq!(calibrate(dec, dir.path(), &filter, &reversed, 1 << 30, None).unwrap(), c);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), written);
    // Both ways (as a build asks): the map pass is measured and added, the filter figures kept as they were.
    let all = calibrate(dec, dir.path(), &both(&base, &[0.8]), &items, 1 << 30, None).unwrap();
    assert_eq!(all.seconds(Pass::Filter, 0.8), c.seconds(Pass::Filter, 0.8), "the filter pass not measured again");
    assert!(all.share_of_parent(Pass::Map, 0.8).is_some_and(|s| s.is_finite() && s > 0.0));
    let after_map = std::fs::read_to_string(&path).unwrap();
    assert_eq!(after_map.lines().count(), 2 * 2 * CALIBRATION_ITEMS);
    assert!(after_map.starts_with(&written), "the filter lines are kept as they were");
    // A ratio not measured yet is measured, with 0 and the ratio on record (0.8) for the pass asked, so that every
    // filter share's two figures come from one run; the map figures stay.
    let more = calibrate(dec, dir.path(), &filter_at(&base, &[0.5]), &items, 1 << 30, None).unwrap();
    assert!(more.seconds(Pass::Filter, 0.5).is_some());
    let lines = std::fs::read_to_string(&path).unwrap();
    assert_eq!(lines.lines().count(), (2 * 2 + 3) * CALIBRATION_ITEMS);
    let added: Vec<&str> = lines.lines().skip(2 * 2 * CALIBRATION_ITEMS).collect();
    for ratio in ["0.00", "0.50", "0.80"] {
        let at = format!("@expected-attention-{ratio}\",\"pass\":\"filter\"");
        assert_eq!(added.iter().filter(|l| l.contains(&at)).count(), CALIBRATION_ITEMS, "{ratio}: {added:?}");
    }
}

/// The calibration of `base`'s model at `ratios`, the filter pass alone (as a filter's query measures it).
fn filter_at<'a>(base: &'a Profile, ratios: &'a [f64]) -> stretto_kv::calibration::Rungs<'a> {
    stretto_kv::calibration::Rungs { base, ratios, passes: &[stretto_kv::calibration::Pass::Filter] }
}
