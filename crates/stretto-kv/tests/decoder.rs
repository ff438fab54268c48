//! The converted SmolLM2-135M decoder on ONNX Runtime, checked against an independent f64 forward pass and against
//! itself under KV pasts, batching and padding.

use std::sync::OnceLock;

use stretto_core::context::default_home;
use stretto_kv::decoder::{Decoder, KvPast, Step, Want};
use stretto_kv::gguf::Gguf;

mod support;
use support::Llama;

const MODEL: &str = "smollm2-135m";

fn decoder() -> &'static Decoder {
    static DEC: OnceLock<Decoder> = OnceLock::new();
    DEC.get_or_init(|| Decoder::load(&default_home(), MODEL, 2).expect("SmolLM2-135M converts and loads"))
}

fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-12);
    a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).abs()).fold(0.0, f64::max) / scale
}

fn full(dec: &Decoder, tokens: &[u32]) -> Vec<f32> {
    dec.run(&[Step { past: None, tokens }], Want::default()).unwrap().remove(0).logits
}

#[test]
fn answers_the_capital_question() {
    let dec = decoder();
    let ids = dec.encode(&dec.chat_prompt("What is the capital of France?")).unwrap();
    let out = dec.generate(&[Step { past: None, tokens: &ids }], 24).unwrap().remove(0);
    assert!(out.text.contains("Paris"), "answer: {:?}", out.text);
    assert!(out.stopped, "the answer should end with the end-of-turn token: {out:?}");
    assert!(out.confidence > 0.0 && out.confidence <= 1.0);
}

/// A row that goes on after its first line stops at the token that ends it: the same tokens as full generation up
/// to there, the same first line, and the confidence over the tokens kept; a row that starts with blank lines is not
/// stopped by them; and rows stop apart within a batch.
#[test]
fn generate_line_stops_each_row_at_the_end_of_its_first_line() {
    let dec = decoder();
    // A raw few-shot prompt whose completion runs on into the next example after its answer line.
    let few_shot = dec.encode("Colour of the sky: blue\nColour of grass: green\nColour of snow:").unwrap();
    let blank = dec.encode("A list of three fruits, one per line, after a blank line:\n\n").unwrap();
    let rows = [Step { past: None, tokens: &few_shot }, Step { past: None, tokens: &blank }];
    let full = dec.generate(&rows, 16).unwrap();
    let line = dec.generate_line(&rows, 16).unwrap();
    assert!(full[1].text.starts_with('\n'), "the second row's answer opens with a blank line: {:?}", full[1].text);
    for (f, l) in full.iter().zip(&line) {
        assert!(f.text.trim_start().contains('\n'), "the full text runs past its first line: {:?}", f.text);
        assert!(l.tokens.len() < f.tokens.len(), "{l:?} vs {f:?}");
        assert_eq!(l.tokens[..], f.tokens[..l.tokens.len()], "the same tokens up to the line's end");
        assert!(l.stopped && l.text.trim_start().contains('\n'), "{l:?}");
        let first = |t: &str| t.lines().map(str::trim).find(|x| !x.is_empty()).map(String::from);
        assert_eq!(first(&l.text), first(&f.text));
        assert!(l.confidence >= f.confidence && l.confidence <= 1.0, "{} vs {}", l.confidence, f.confidence);
    }
}

#[test]
fn logits_match_an_independent_f64_forward_pass() {
    let dec = decoder();
    let dir = stretto_kv::models::model_dir(&default_home(), MODEL);
    let g = Gguf::open(&dir.join("model.gguf")).unwrap();
    let reference = Llama::load(&g);
    let ids = dec.encode("The quick brown fox jumps over 13 lazy dogs.").unwrap();
    let mut cache = Vec::new();
    let mut queries = Vec::new();
    let want: Vec<f32> = reference.forward_capture(&ids, &mut cache, &mut queries).iter().map(|v| *v as f32).collect();
    let out = dec.run(&[Step { past: None, tokens: &ids }], Want { present: true, query_stats: true }).unwrap();
    let rel = max_rel(&out[0].logits, &want);
    eprintln!("max relative logit error vs f64: {rel:.2e}");
    assert!(rel <= 1e-3, "{rel}");

    // The press's query statistics: mean and covariance of the pre-RoPE queries, per layer and head.
    let stats = out[0].query_stats.as_ref().unwrap();
    let (heads, hd, n) = (reference.heads, reference.hd, ids.len() as f64);
    for (l, layer) in queries.iter().enumerate().step_by(7) {
        let mut mean = vec![0f64; heads * hd];
        for q in layer {
            mean.iter_mut().zip(q).for_each(|(m, v)| *m += v / n);
        }
        let mean32: Vec<f32> = mean.iter().map(|v| *v as f32).collect();
        let rel = max_rel(&stats.mean[l], &mean32);
        assert!(rel <= 1e-3, "layer {l} query mean: {rel}");
        let mut cov = vec![0f32; heads * hd * hd];
        for h in 0..heads {
            for i in 0..hd {
                for j in 0..hd {
                    let c: f64 = layer
                        .iter()
                        .map(|q| (q[h * hd + i] - mean[h * hd + i]) * (q[h * hd + j] - mean[h * hd + j]))
                        .sum::<f64>()
                        / n;
                    cov[(h * hd + i) * hd + j] = c as f32;
                }
            }
        }
        let rel = max_rel(&stats.cov[l], &cov);
        assert!(rel <= 1e-3, "layer {l} query covariance: {rel}");
    }
    // The present cache holds every token's key and value.
    let present = out[0].present.as_ref().unwrap();
    assert_eq!(present.len, ids.len());
    assert_eq!(present.next_position, ids.len() as i64);
}

#[test]
fn prefill_then_question_equals_one_full_pass() {
    let dec = decoder();
    let item = dec.encode(&dec.chat_prompt("Review: a warm, funny film with a great cast.")).unwrap();
    let question = dec.encode("Is the review positive? Answer 1 or 0. Answer:").unwrap();
    let (past, _) = dec.prefill(&item, false).unwrap();
    let cached = dec.run(&[Step { past: Some(&past), tokens: &question }], Want::default()).unwrap();
    let whole: Vec<u32> = item.iter().chain(&question).copied().collect();
    let rel = max_rel(&cached[0].logits, &full(dec, &whole));
    eprintln!("prefill-then-question vs full pass: {rel:.2e}");
    assert!(rel <= 1e-4, "{rel}");
}

#[test]
fn a_chunked_prefill_equals_one_whole_prefill() {
    let dec = decoder();
    let review = "Review: I wanted to like it, but the plot made no sense at all, the dialogue was wooden and the \
                  ending dragged on for another forty minutes after the story had clearly run out of ideas.";
    let item = dec.encode(&dec.chat_prompt(review)).unwrap();
    let whole = dec.run(&[Step { past: None, tokens: &item }], Want { present: true, query_stats: true }).unwrap();
    let (wp, ws) = (whole[0].present.as_ref().unwrap(), whole[0].query_stats.as_ref().unwrap());
    // Uneven chunks: the last one is shorter, so the merged statistics must weight chunks by their token counts.
    let chunk = item.len() / 3 + 1;
    let (past, stats) = dec.prefill_chunked(&item, true, chunk).unwrap();
    let stats = stats.unwrap();
    assert_eq!((past.len, past.next_position), (wp.len, wp.next_position));
    for l in [0, 7, 29] {
        let (k, v) = (max_rel(&past.keys[l], &wp.keys[l]), max_rel(&past.values[l], &wp.values[l]));
        assert!(k <= 1e-4 && v <= 1e-4, "layer {l}: keys {k:.2e}, values {v:.2e}");
        let (m, c) = (max_rel(&stats.mean[l], &ws.mean[l]), max_rel(&stats.cov[l], &ws.cov[l]));
        eprintln!("layer {l}: chunked vs whole query mean {m:.2e}, covariance {c:.2e}");
        assert!(m <= 1e-4 && c <= 1e-3, "layer {l}: mean {m:.2e}, covariance {c:.2e}");
    }
    // A question over the chunked cache answers as over the whole one.
    let question = dec.encode("Is the review positive? Answer 1 or 0. Answer:").unwrap();
    let ask = |p: &KvPast| dec.run(&[Step { past: Some(p), tokens: &question }], Want::default()).unwrap().remove(0);
    assert!(max_rel(&ask(&past).logits, &ask(wp).logits) <= 1e-4);
    // Within a budget that holds the item, the prefill is one run; a tiny one still answers, in minimal chunks.
    let c = dec.config();
    assert_eq!(stretto_kv::decoder::prefill_chunk(c, item.len(), 1 << 30), item.len());
    assert_eq!(stretto_kv::decoder::prefill_chunk(c, 13_000, 0), stretto_kv::decoder::MIN_PREFILL_CHUNK);
    assert_eq!(stretto_kv::decoder::prefill_chunk(c, 13_000, 16 << 30), stretto_kv::decoder::MAX_PREFILL_CHUNK);
    // 13,000 tokens of SmolLM2's cache are 0.6 GB, held three times over; what is left of 2.04 GB sets the chunk.
    let mid = stretto_kv::decoder::prefill_chunk(c, 13_000, 2_040_000_000);
    assert!(stretto_kv::decoder::MIN_PREFILL_CHUNK < mid && mid < stretto_kv::decoder::MAX_PREFILL_CHUNK, "{mid}");
    let (tiny, _) = dec.prefill_within(&item, false, 0).unwrap();
    assert!(max_rel(&tiny.keys[3], &wp.keys[3]) <= 1e-4);
    assert!(dec.prefill_chunked(&[], false, 8).is_err());
}

#[test]
fn a_batch_of_left_padded_pasts_equals_per_item_runs() {
    let dec = decoder();
    let items = [
        "Review: dull.",
        "Review: an astonishing, moving piece of cinema; the best film of the year by far.",
        "Review: I wanted to like it, but the plot made no sense at all and the ending dragged on.",
    ];
    let pasts: Vec<KvPast> =
        items.iter().map(|t| dec.prefill(&dec.encode(&dec.chat_prompt(t)).unwrap(), false).unwrap().0).collect();
    let questions = [
        dec.encode("Positive? Answer:").unwrap(),
        dec.encode("Is the sentiment of this review positive? Answer 1 or 0. Answer:").unwrap(),
        dec.encode("Answer:").unwrap(),
    ];
    let steps: Vec<Step<'_>> = pasts.iter().zip(&questions).map(|(p, q)| Step { past: Some(p), tokens: q }).collect();
    let want = Want { present: true, query_stats: true };
    let batched = dec.run(&steps, want).unwrap();
    for (i, step) in steps.iter().enumerate() {
        let single = dec.run(std::slice::from_ref(step), want).unwrap().remove(0);
        let rel = max_rel(&batched[i].logits, &single.logits);
        eprintln!("row {i}: batched vs alone {rel:.2e}");
        assert!(rel <= 1e-4, "row {i}: {rel}");
        let (bp, sp) = (batched[i].present.as_ref().unwrap(), single.present.as_ref().unwrap());
        assert_eq!((bp.len, bp.next_position), (sp.len, sp.next_position));
        assert!(max_rel(&bp.keys[5], &sp.keys[5]) <= 1e-4);
        let (bq, sq) = (batched[i].query_stats.as_ref().unwrap(), single.query_stats.as_ref().unwrap());
        assert!(max_rel(&bq.cov[3], &sq.cov[3]) <= 1e-4, "padding leaked into the query statistics");
    }
    // Log-odds in batches of two give the same as one at a time.
    let yes = dec.token_id("1").unwrap();
    let no = dec.token_id("0").unwrap();
    let refs: Vec<&KvPast> = pasts.iter().collect();
    let a = dec.log_odds(&refs, &questions[1], yes, no, 2).unwrap();
    let b = dec.log_odds(&refs, &questions[1], yes, no, 1).unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-3 * y.abs().max(1.0), "{x} vs {y}");
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let dec = decoder();
    assert!(dec.run(&[Step { past: None, tokens: &[] }], Want::default()).is_err());
    assert!(dec.run(&[Step { past: None, tokens: &[u32::MAX] }], Want::default()).is_err());
    let mut past = dec.prefill(&[1, 2, 3], false).unwrap().0;
    past.keys[0].pop();
    assert!(dec.run(&[Step { past: Some(&past), tokens: &[4] }], Want::default()).is_err());
    assert!(dec.token_id("hello world").is_err());
}

/// Qwen2.5-Coder-0.5B (qwen2: biases, untied head, no Q/K permutation), the gold of the default ladder.
#[test]
fn qwen_answers_the_capital_question() {
    let dec = Decoder::load(&default_home(), "qwen2.5-coder-0.5b", 2).unwrap();
    let ids = dec.encode(&dec.chat_prompt("What is the capital of France?")).unwrap();
    let out = dec.generate(&[Step { past: None, tokens: &ids }], 24).unwrap().remove(0);
    assert!(out.text.contains("Paris"), "answer: {:?}", out.text);
    // KV pasts work the same way for qwen2.
    let split = ids.len() - 4;
    let (past, _) = dec.prefill(&ids[..split], false).unwrap();
    let cached = dec.run(&[Step { past: Some(&past), tokens: &ids[split..] }], Want::default()).unwrap();
    assert!(max_rel(&cached[0].logits, &full(&dec, &ids)) <= 1e-4);
}

/// int8-dyn's weight codes in either range the converter makes: ±127 where the CPU adds u8 × s8 products in 32 bits
/// (VNNI), ±63 elsewhere, so that AVX2's 16-bit pair sums cannot saturate. Both are converted here whatever the CPU
/// (this one adds either range's products exactly only if it has VNNI; without it the 7-bit range is the one it
/// reads). Asked over the f32 model's pasts, as the rung asks, each answers as f32 does within quantization noise.
#[test]
fn int8_dyn_codes_of_either_range_answer_like_f32_over_its_pasts() {
    use stretto_kv::convert::{convert_gguf_with_code_max, int8_dyn_code_max, Weights};
    let home = default_home();
    let f32_dec = decoder();
    let gguf = stretto_kv::models::model_dir(&home, MODEL).join("model.gguf");
    let scratch = tempfile::tempdir().unwrap();
    let reviews = [
        "Review: an astonishing, moving piece of cinema; the best film of the year by far.",
        "Review: I wanted to like it, but the plot made no sense at all and the ending dragged on.",
        "Review: dull, overlong and badly acted.",
        "Review: a warm, funny film with a great cast.",
        "Review: the effects are fine, the script is not; I checked my watch twice.",
        "Review: a quiet triumph. Every performance lands and the last scene is unforgettable.",
        "Review: neither good nor bad, just forgettable.",
        "Review: the worst sequel in years, loud and joyless.",
    ];
    let question = f32_dec.encode("Is the review positive? Answer 1 or 0. Answer:").unwrap();
    let (yes, no) = (f32_dec.token_id("1").unwrap(), f32_dec.token_id("0").unwrap());
    let pasts: Vec<KvPast> = reviews
        .iter()
        .map(|r| f32_dec.prefill(&f32_dec.encode(&f32_dec.chat_prompt(r)).unwrap(), false).unwrap().0)
        .collect();
    let refs: Vec<&KvPast> = pasts.iter().collect();
    let reference = f32_dec.log_odds(&refs, &question, yes, no, 4).unwrap();
    let exact_here = |code_max: i8| code_max == 63 || int8_dyn_code_max() == 127;
    for code_max in [127, 63] {
        let out = scratch.path().join(code_max.to_string());
        let files = convert_gguf_with_code_max(&gguf, &out, Weights::Int8Dyn, code_max).unwrap();
        let dec = Decoder::from_files(&home, MODEL, &files, 2).unwrap();
        let ours = dec.log_odds(&refs, &question, yes, no, 4).unwrap();
        let change = ours.iter().zip(&reference).map(|(a, b)| (a - b).abs()).sum::<f32>() / reviews.len() as f32;
        eprintln!("int8-dyn codes ±{code_max} vs f32 over f32 pasts: mean |log-odds change| {change:.3}; {ours:?} vs {reference:?}");
        // Measured on a CPU with VNNI: 0.214 (±127) and 0.283 (±63) on these 8 reviews. Codes read without their
        // offset, or a kernel that saturates, move the log-odds by whole units (40 when the offset was dropped).
        if exact_here(code_max) {
            assert!(change < 0.5, "codes ±{code_max}: mean log-odds change {change}");
        }
    }
    assert!(convert_gguf_with_code_max(&gguf, &scratch.path().join("0"), Weights::Int8Dyn, 0).is_err());
}
