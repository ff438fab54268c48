//! Closed-choice answers over cached pasts on the real SmolLM2-135M: the batched walk, which feeds a shared first
//! token over the question pass's extended past, picks what unbatched passes over the whole prompt pick.

use stretto_core::context::default_home;
use stretto_kv::cache::PastSource;
use stretto_kv::choice::spellings;
use stretto_kv::decoder::{Decoder, Step, Want};
use stretto_kv::press::{Positions, Press};
use stretto_kv::store::Profile;
use stretto_kv::tasks::{choice_answers, field_label, map_question};

const REVIEWS: [&str; 4] = [
    "A warm, funny and moving film; the best thing I have seen this year.",
    "Dull, predictable and far too long. I walked out.",
    "The acting is fine but the plot makes no sense at all.",
    "Gorgeous to look at, with a score that lifts every scene.",
];

fn softmax_share(logits: &[f32], chosen: &[u32], allowed: &[u32]) -> f64 {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e = |t: &u32| (logits[*t as usize] as f64 - m).exp();
    chosen.iter().map(e).sum::<f64>() / allowed.iter().map(e).sum::<f64>()
}

#[test]
fn a_walk_over_a_shared_first_token_picks_what_whole_prompt_passes_pick() {
    let dec = Decoder::load(&default_home(), "smollm2-135m", 2).expect("SmolLM2-135M converts and loads");
    let dir = tempfile::tempdir().unwrap();
    let profile =
        Profile { model: "smollm2-135m".into(), press: Press::KeyNorm, ratio: 0.0, positions: Positions::Keep };
    let source = PastSource::new(profile, dir.path().into());
    let items: Vec<String> = REVIEWS.iter().map(|r| r.to_string()).collect();
    // Every spelling of both choices starts with the same token (" very", "Very"...): no answer is decided by the
    // question pass alone, so every item takes the second step.
    let choices = ["very good".to_string(), "very bad".to_string()];
    let instruction = map_question("Is the text above very good or very bad");
    let label = field_label("verdict");
    let (answers, seconds) = choice_answers(&dec, &source, &items, &instruction, &label, &choices, 3).unwrap();
    assert_eq!((answers.len(), seconds.len()), (4, 4));
    assert!(seconds.iter().all(|s| *s > 0.0));

    let spelled: Vec<(Vec<u32>, usize)> = choices
        .iter()
        .enumerate()
        .flat_map(|(c, choice)| spellings(choice).into_iter().map(move |s| (s, c)))
        .map(|(s, c)| (dec.encode(&s).unwrap(), c))
        .collect();
    let q = dec.encode(&dec.map_suffix(&instruction, &label)).unwrap();
    let mut picked = Vec::new();
    for (i, item) in items.iter().enumerate() {
        // The reference: whole prompts from scratch, one item at a time, no past extended in place.
        let mut prompt = dec.encode(&dec.item_prefix(item)).unwrap();
        prompt.extend(&q);
        let run = |tokens: &[u32]| dec.run(&[Step { past: None, tokens }], Want::default()).unwrap().remove(0).logits;
        let first = run(&prompt);
        let firsts: Vec<u32> = spelled.iter().map(|(t, _)| t[0]).collect();
        let t1 = *firsts.iter().max_by(|a, b| first[**a as usize].total_cmp(&first[**b as usize])).unwrap();
        let mut dedup = firsts.clone();
        dedup.sort();
        dedup.dedup();
        let p1 = softmax_share(&first, &[t1], &dedup);
        let alive: Vec<&(Vec<u32>, usize)> = spelled.iter().filter(|(t, _)| t[0] == t1).collect();
        assert!(alive.iter().any(|(_, c)| *c == 0) && alive.iter().any(|(_, c)| *c == 1), "the first token is shared");
        prompt.push(t1);
        let second = run(&prompt);
        let nexts: Vec<u32> = alive.iter().map(|(t, _)| t[1]).collect();
        let (t2, c) = alive
            .iter()
            .map(|(t, c)| (t[1], *c))
            .max_by(|a, b| second[a.0 as usize].total_cmp(&second[b.0 as usize]))
            .unwrap();
        let mut dedup2 = nexts.clone();
        dedup2.sort();
        dedup2.dedup();
        let same: Vec<u32> = alive.iter().filter(|(_, d)| *d == c).map(|(t, _)| t[1]).collect();
        let p2 = softmax_share(&second, &same, &dedup2);
        assert_eq!(answers[i].0, c, "item {i}: walk {:?}, reference {c} (second token {t2})", answers[i]);
        assert!((answers[i].1 - p1 * p2).abs() < 1e-2, "item {i}: probability {} vs {}", answers[i].1, p1 * p2);
        picked.push(c);
    }
    eprintln!("picked {picked:?}: {answers:?}");
}
