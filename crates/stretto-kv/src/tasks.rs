//! Semantic work over cached items: filter log-odds and greedy map answers, batched under a memory budget, with
//! the seconds each item cost (cache loading and any prefill included).
//!
//! The prompt layout follows the method: the cached part is the chat prefix, the user turn's opening and the item
//! ([`Decoder::item_prefix`]); the question part closes the turn with the instruction and opens the assistant's
//! answer with `Answer: ` ([`Decoder::question_suffix`]).

use std::time::Instant;

use crate::cache::PastSource;
use crate::decoder::{Decoder, KvPast, Step, Want};
use crate::error::Result;
use crate::models::{AnswerWords, FilterProtocol};

/// What a text item's column references become in its questions.
pub const TEXT_SUBJECT: &str = "the text above";

/// The filter question for a predicate whose column references were replaced by "the text above".
pub fn filter_question(predicate: &str) -> String {
    filter_question_about(TEXT_SUBJECT, predicate)
}

/// The '1'/'0' filter question for a predicate whose column references were replaced by `subject` (e.g. "the
/// photo described above" for a caption): the instruction names the same subject as the question.
pub fn filter_question_about(subject: &str, predicate: &str) -> String {
    format!(
        "Answer the question about {subject} with 1 for yes or 0 for no.\nQuestion: is it true that {}?",
        predicate.trim().trim_end_matches(['.', '?'])
    )
}

/// The Yes/No filter question for a predicate whose column references were replaced by "the text above".
pub fn yes_no_question(predicate: &str) -> String {
    yes_no_question_about(TEXT_SUBJECT, predicate)
}

/// The Yes/No filter question for a predicate whose column references were replaced by `subject`.
pub fn yes_no_question_about(subject: &str, predicate: &str) -> String {
    format!(
        "Answer the question about {subject} with Yes or No.\nQuestion: is it true that {}?",
        predicate.trim().trim_end_matches(['.', '?'])
    )
}

/// A filter's question part under one protocol: what a filter operator appends to each item's cached past.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterPrompt {
    /// The question's text (the key its calibration and answers are kept under).
    pub text: String,
    /// What is appended to an item's cached prefix: the question closing the user turn and the answer's opening.
    pub suffix: String,
    /// The suffix's tokens.
    pub tokens: Vec<u32>,
    /// The (yes, no) answer tokens whose log-odds are the score.
    pub answers: (u32, u32),
}

/// The question part of a filter for `predicate` (about "the text above") under `protocol` (its calibration is the
/// caller's: see [`FilterProtocol::calibrated`]). A contrast protocol's question is derived by the model
/// ([`contrast_prompt`]), so it is a usage error here.
pub fn filter_prompt(dec: &Decoder, protocol: FilterProtocol, predicate: &str) -> Result<FilterPrompt> {
    filter_prompt_about(dec, protocol, TEXT_SUBJECT, predicate)
}

/// [`filter_prompt`] for a predicate whose column references were replaced by `subject`: the instruction asks
/// about that subject, as the question does.
pub fn filter_prompt_about(
    dec: &Decoder,
    protocol: FilterProtocol,
    subject: &str,
    predicate: &str,
) -> Result<FilterPrompt> {
    let Some((yes, no)) = protocol.answers.tokens() else {
        return Err(crate::error::KvError::Usage(format!(
            "the `{protocol}` protocol's question is derived by the model for each predicate: ask for it with \
             tasks::contrast_prompt or tasks::protocol_prompt"
        )));
    };
    let (text, suffix) = match protocol.answers {
        AnswerWords::Digits => {
            let text = filter_question_about(subject, predicate);
            let suffix = dec.question_suffix(&text);
            (text, suffix)
        }
        // (Contrast was refused above: it has no fixed words.)
        AnswerWords::YesNo | AnswerWords::Contrast => {
            // "Answer:" without the trailing space: the answer word carries its own (" Yes"), as models write it.
            let text = yes_no_question_about(subject, predicate);
            let suffix = dec.answer_suffix(&text, "").trim_end().to_string();
            (text, suffix)
        }
    };
    Ok(FilterPrompt { tokens: dec.encode(&suffix)?, suffix, text, answers: (dec.token_id(yes)?, dec.token_id(no)?) })
}

/// The contrast question for `statement` (about `subject`, e.g. "the text above") as a filter's question part: the
/// statement against an opposite the model derives ([`crate::contrast`]), scored by the first tokens where the two
/// answers differ. `None` where the model derives no usable opposite. The derivation generates text (seconds with
/// a 0.5B model), so callers keep the prompt for every batch.
pub fn contrast_prompt(dec: &Decoder, subject: &str, statement: &str) -> Result<Option<FilterPrompt>> {
    let Some(c) = crate::contrast::derive_question(dec, subject, statement)? else {
        return Ok(None);
    };
    Ok(Some(FilterPrompt {
        text: format!("{}\n{}", c.question, c.lead),
        // The tokens' own text, chat markers kept: what a peer engine is given as the same question part.
        suffix: dec
            .tokenizer()
            .decode(&c.tokens, false)
            .map_err(|e| crate::error::KvError::Runtime(format!("tokenizer: {e}")))?,
        tokens: c.tokens,
        answers: (c.yes, c.no),
    }))
}

/// The question part of a filter for `statement` (about `subject`) under `protocol`, and the protocol it was asked
/// under: a contrast protocol whose opposite the model cannot derive asks with [`FilterProtocol::fallback`].
pub fn protocol_prompt(
    dec: &Decoder,
    protocol: FilterProtocol,
    subject: &str,
    statement: &str,
) -> Result<(FilterPrompt, FilterProtocol)> {
    if protocol.answers == AnswerWords::Contrast {
        if let Some(p) = contrast_prompt(dec, subject, statement)? {
            return Ok((p, protocol));
        }
        tracing::info!(model = dec.name(), statement, "no usable opposite: the filter asks Yes/No instead");
    }
    let asked = protocol.fallback();
    Ok((filter_prompt_about(dec, asked, subject, statement)?, asked))
}

/// What follows the first text's cached item in a pair prompt: the second text, labelled. The pair's first text is
/// the item whose past is cached (the same past every one-item question over it reads); only this continuation and
/// the question are new tokens for each pair.
pub fn second_text(right: &str) -> String {
    format!("\n\nSecond text:\n{right}")
}

/// The question part of a pair filter for `statement` (its references written as "the first text" and "the
/// second text") under `protocol`'s answer words: a contrast protocol asks Yes/No here (its few-shot opposites
/// are about one text). The question's text is the key its calibration and answers are kept under.
pub fn pair_filter_prompt(dec: &Decoder, protocol: FilterProtocol, statement: &str) -> Result<FilterPrompt> {
    let statement = statement.trim().trim_end_matches(['.', '?']);
    let (text, suffix, (yes, no)) = match protocol.answers {
        AnswerWords::Digits => {
            let text = format!(
                "Answer the question about the two texts above with 1 for yes or 0 for no.\nQuestion: is it true \
                 that {statement}?"
            );
            let suffix = dec.question_suffix(&text);
            (text, suffix, ("1", "0"))
        }
        AnswerWords::YesNo | AnswerWords::Contrast => {
            let text = format!(
                "Answer the question about the two texts above with Yes or No.\nQuestion: is it true that {statement}?"
            );
            let suffix = dec.answer_suffix(&text, "").trim_end().to_string();
            (text, suffix, (" Yes", " No"))
        }
    };
    Ok(FilterPrompt { tokens: dec.encode(&suffix)?, suffix, text, answers: (dec.token_id(yes)?, dec.token_id(no)?) })
}

/// Log-odds of the prompt's yes over no for `pairs` of (first, second) texts: each first text's cached past,
/// then [`second_text`] and the question; and the seconds each pair cost (its first text's past loaded once for
/// every pair that shares it). Pairs run `batch` at a time, their first texts' pasts loaded in groups that fit
/// the source's memory budget.
pub fn pair_filter_scores(
    dec: &Decoder,
    source: &PastSource,
    pairs: &[(String, String)],
    prompt: &FilterPrompt,
    batch: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let _span = tracing::info_span!("llm_pair_filter", model = dec.name(), pairs = pairs.len()).entered();
    let mut firsts: Vec<String> = Vec::new();
    let mut by_first: std::collections::HashMap<&str, Vec<usize>> = std::collections::HashMap::new();
    for (i, (l, _)) in pairs.iter().enumerate() {
        let rows = by_first.entry(l.as_str()).or_default();
        if rows.is_empty() {
            firsts.push(l.clone());
        }
        rows.push(i);
    }
    let (yes, no) = prompt.answers;
    let mut scores = vec![0.0; pairs.len()];
    let mut seconds = vec![0.0; pairs.len()];
    let max_chars = group_chars(dec.config(), source.memory_budget());
    for group in groups_within(&firsts, batch, max_chars) {
        let start = Instant::now();
        let texts: Vec<String> = group.iter().map(|&g| firsts[g].clone()).collect();
        let (pasts, _) = source.get(dec, &texts)?;
        let rows: Vec<(usize, usize)> = group
            .iter()
            .enumerate()
            .flat_map(|(k, &g)| by_first[firsts[g].as_str()].iter().map(move |&i| (k, i)))
            .collect();
        let load_each = start.elapsed().as_secs_f64() / rows.len().max(1) as f64;
        // Runs of at most `batch` pairs whose padded rows (first and second text) fit the budget's characters; a
        // pair longer than that runs alone.
        let len = |&(k, i): &(usize, usize)| texts[k].len() + pairs[i].1.len();
        let mut chunks: Vec<Vec<(usize, usize)>> = Vec::new();
        let mut current: Vec<(usize, usize)> = Vec::new();
        let mut longest = 0;
        for row in rows {
            let l = len(&row).max(longest);
            if !current.is_empty() && (current.len() >= batch.max(1) || (current.len() + 1) * l > max_chars) {
                chunks.push(std::mem::take(&mut current));
                longest = 0;
            }
            longest = longest.max(len(&row));
            current.push(row);
        }
        chunks.extend((!current.is_empty()).then_some(current));
        for chunk in &chunks {
            let t0 = Instant::now();
            let tokens: Vec<Vec<u32>> = chunk
                .iter()
                .map(|&(k, i)| {
                    // The second text gives way where the pair would run past the model's context.
                    let tokens = dec.encode(&format!("{}{}", second_text(&pairs[i].1), prompt.suffix))?;
                    let start = usize::try_from(pasts[k].next_position).unwrap_or(0);
                    Ok(crate::decoder::fit_after(dec.config(), start, tokens, prompt.tokens.len()))
                })
                .collect::<Result<_>>()?;
            let steps: Vec<Step<'_>> =
                chunk.iter().zip(&tokens).map(|(&(k, _), t)| Step { past: Some(&pasts[k]), tokens: t }).collect();
            let out = dec.run(&steps, Want::default())?;
            let each = t0.elapsed().as_secs_f64() / chunk.len() as f64;
            for (&(_, i), row) in chunk.iter().zip(out) {
                scores[i] = (row.logits[yes as usize] - row.logits[no as usize]) as f64;
                seconds[i] = each + load_each;
            }
        }
    }
    Ok((scores, seconds))
}

/// The map question for an extraction whose column references were replaced by "the text above".
pub fn map_question(instruction: &str) -> String {
    format!("{}.", instruction.trim().trim_end_matches(['.', '?']))
}

/// The answer label of a map's output field: `movie_title` → `Movie title`.
pub fn field_label(field: &str) -> String {
    let words = field.replace('_', " ");
    let mut c = words.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => "Answer".into(),
    }
}

/// Most characters a group may hold once padded to its longest item (about 4,000 tokens): a batch of pasts is
/// left-padded to its longest row, so eight long emails would hold gigabytes of keys and values at once.
pub const GROUP_CHARS: usize = 16_000;

/// Fewest characters per token assumed when sizing a group (Enron emails measured 2.1: 24,842 characters, 11,689
/// SmolLM2 tokens; reviews about 4.5).
pub const MIN_CHARS_PER_TOKEN: u64 = 2;

/// Most characters a group of questions over `config`'s pasts may hold once padded, so that it fits
/// `memory_budget` bytes: [`GROUP_CHARS`], or fewer when the budget is small. The padded pasts are held about three
/// times (as loaded, in the padded batch, and as the run's concatenated keys and values), at no fewer than
/// [`MIN_CHARS_PER_TOKEN`] characters a token.
pub fn group_chars(config: &crate::convert::DecoderConfig, memory_budget: u64) -> usize {
    let kv_per_token = (config.layers * 2 * config.kv_heads * config.head_dim * 4) as u64;
    let tokens = memory_budget / (3 * kv_per_token).max(1);
    (tokens.saturating_mul(MIN_CHARS_PER_TOKEN)).min(GROUP_CHARS as u64) as usize
}

/// Groups of item indices: items ordered by length (so a group pads little), at most `batch` per group and at most
/// [`GROUP_CHARS`] once padded, an item longer than that alone.
pub fn groups(items: &[String], batch: usize) -> Vec<Vec<usize>> {
    groups_within(items, batch, GROUP_CHARS)
}

/// [`groups`] of at most `max_chars` once padded.
pub fn groups_within(items: &[String], batch: usize, max_chars: usize) -> Vec<Vec<usize>> {
    let mut idx: Vec<usize> = (0..items.len()).collect();
    idx.sort_by_key(|&i| items[i].len());
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    for i in idx {
        // Sorted ascending: the new item is the group's longest.
        let padded = (current.len() + 1) * items[i].len();
        if !current.is_empty() && (current.len() >= batch.max(1) || padded > max_chars) {
            out.push(std::mem::take(&mut current));
        }
        current.push(i);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Loads or computes the pasts of `items` in [`groups`], calling `f` per group with the group's item indices and
/// pasts; returns per-item seconds (group time split evenly over the group).
fn grouped(
    dec: &Decoder,
    source: &PastSource,
    items: &[String],
    batch: usize,
    mut f: impl FnMut(&[usize], &[KvPast]) -> Result<()>,
) -> Result<Vec<f64>> {
    let mut seconds = vec![0.0; items.len()];
    for group in groups_within(items, batch, group_chars(dec.config(), source.memory_budget())) {
        let group = group.as_slice();
        let start = Instant::now();
        let texts: Vec<String> = group.iter().map(|&i| items[i].clone()).collect();
        let (pasts, _) = source.get(dec, &texts)?;
        f(group, &pasts)?;
        let each = start.elapsed().as_secs_f64() / group.len() as f64;
        for &i in group {
            seconds[i] = each;
        }
    }
    Ok(seconds)
}

/// Log-odds of `yes` over `no` after `question` for every item; and the seconds each cost.
pub fn filter_scores(
    dec: &Decoder,
    source: &PastSource,
    items: &[String],
    question: &str,
    (yes, no): (u32, u32),
    batch: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let q = dec.encode(&dec.question_suffix(question))?;
    filter_scores_after(dec, source, items, &q, (yes, no), batch)
}

/// Log-odds of `yes` over `no` after the question tokens `q` (everything after the cached item) for every item; and
/// the seconds each cost. [`filter_scores`] for a question that is not the standard '1'/'0' one.
pub fn filter_scores_after(
    dec: &Decoder,
    source: &PastSource,
    items: &[String],
    q: &[u32],
    (yes, no): (u32, u32),
    batch: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let _span = tracing::info_span!("llm_filter", model = dec.name(), items = items.len()).entered();
    let mut scores = vec![0.0; items.len()];
    let seconds = grouped(dec, source, items, batch, |group, pasts| {
        let steps: Vec<Step<'_>> = pasts.iter().map(|p| Step { past: Some(p), tokens: q }).collect();
        for (&i, row) in group.iter().zip(dec.run(&steps, Want::default())?) {
            scores[i] = (row.logits[yes as usize] - row.logits[no as usize]) as f64;
        }
        Ok(())
    })?;
    Ok((scores, seconds))
}

/// A map answer: the decoded text and its probability.
pub type Answer = (String, f64);

/// Greedy answers (at most `max_tokens`, up to the end of the first line: [`Decoder::generate_line`]) with their
/// probabilities for every item; and the seconds each cost.
pub fn map_answers(
    dec: &Decoder,
    source: &PastSource,
    items: &[String],
    instruction: &str,
    label: &str,
    max_tokens: usize,
    batch: usize,
) -> Result<(Vec<Answer>, Vec<f64>)> {
    let _span = tracing::info_span!("llm_map", model = dec.name(), items = items.len()).entered();
    let q = dec.encode(&dec.map_suffix(instruction, label))?;
    let mut answers = vec![(String::new(), 0.0); items.len()];
    let seconds = grouped(dec, source, items, batch, |group, pasts| {
        let steps: Vec<Step<'_>> = pasts.iter().map(|p| Step { past: Some(p), tokens: &q }).collect();
        for (&i, g) in group.iter().zip(dec.generate_line(&steps, max_tokens)?) {
            answers[i] = (g.text.trim().to_string(), g.confidence);
        }
        Ok(())
    })?;
    Ok((answers, seconds))
}

/// A closed-choice answer: the index of the chosen choice and its probability.
pub type Choice = (usize, f64);

/// One item's walk through the choices' tokens ([`choice_answers`]).
struct Walk {
    item: usize,
    /// The spellings still possible.
    alive: Vec<usize>,
    /// Tokens fed after the question so far.
    depth: usize,
    /// The product of the steps' probabilities so far.
    probability: f64,
}

/// Closed-choice answers ([`crate::choice`]): for every item, the index of the choice in `choices` the model
/// picks after the map question, and that choice's probability among the allowed continuations (the product over
/// the walk's steps); and the seconds each item cost. Choices whose first tokens differ are decided by the question
/// pass alone; items whose leading choices share tokens take one more single-token step per shared token.
pub fn choice_answers(
    dec: &Decoder,
    source: &PastSource,
    items: &[String],
    instruction: &str,
    label: &str,
    choices: &[String],
    batch: usize,
) -> Result<(Vec<Choice>, Vec<f64>)> {
    use crate::choice::{spellings, ChoiceStep, ChoiceTrie};
    let _span =
        tracing::info_span!("llm_choice", model = dec.name(), items = items.len(), choices = choices.len()).entered();
    let mut spelled = Vec::new();
    for (c, choice) in choices.iter().enumerate() {
        for s in spellings(choice) {
            spelled.push((dec.encode(&s)?, c));
        }
    }
    let trie = ChoiceTrie::new(spelled);
    let q = dec.encode(&dec.map_suffix(instruction, label))?;
    let want = Want { present: trie.may_continue(), query_stats: false };
    let mut answers = vec![(0, 0.0); items.len()];
    let seconds = grouped(dec, source, items, batch, |group, pasts| {
        let steps: Vec<Step<'_>> = pasts.iter().map(|p| Step { past: Some(p), tokens: &q }).collect();
        let mut outs = dec.run(&steps, want)?;
        let mut walks: Vec<Walk> =
            group.iter().map(|&item| Walk { item, alive: trie.all(), depth: 0, probability: 1.0 }).collect();
        loop {
            // Walks going on, with the extended past and the token to feed next.
            let mut next: Vec<(Walk, Option<KvPast>, [u32; 1])> = Vec::new();
            for (w, out) in walks.drain(..).zip(outs.drain(..)) {
                match trie.step(&w.alive, w.depth, &out.logits) {
                    ChoiceStep::Done { choice, probability } => answers[w.item] = (choice, w.probability * probability),
                    ChoiceStep::Continue { token, alive, probability } => {
                        let walk =
                            Walk { item: w.item, alive, depth: w.depth + 1, probability: w.probability * probability };
                        next.push((walk, out.present, [token]));
                    }
                }
            }
            if next.is_empty() {
                return Ok(());
            }
            // A walk continues only where two choices share a first token, and then the question pass kept its
            // extended past; a step without it would answer over nothing.
            let steps = next
                .iter()
                .map(|(_, past, token)| match past {
                    Some(past) => Ok(Step { past: Some(past), tokens: token }),
                    None => Err(crate::KvError::Runtime("a choice walk continued without its extended past".into())),
                })
                .collect::<Result<Vec<Step<'_>>>>()?;
            outs = dec.run(&steps, Want { present: true, query_stats: false })?;
            walks = next.into_iter().map(|(w, _, _)| w).collect();
        }
    })?;
    Ok((answers, seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_words_questions_name_their_subject_and_keep_the_text_wording() {
        // A text item's questions are worded as they always were: the memo keeps their answers under that text.
        assert_eq!(
            filter_question("the text above is clearly positive."),
            "Answer the question about the text above with 1 for yes or 0 for no.\nQuestion: is it true that the \
             text above is clearly positive?"
        );
        assert_eq!(yes_no_question("x?"), yes_no_question_about(TEXT_SUBJECT, "x"));
        // A caption's instruction asks about the photo, as its question does.
        assert_eq!(
            yes_no_question_about("the photo described above", "the photo described above shows footwear"),
            "Answer the question about the photo described above with Yes or No.\nQuestion: is it true that the \
             photo described above shows footwear?"
        );
        assert!(filter_question_about("the photo described above", "p")
            .starts_with("Answer the question about the photo described above with 1 for yes or 0 for no."));
    }

    #[test]
    fn groups_cover_every_item_once_and_bound_padding() {
        let items: Vec<String> = [300, 20, 9_000, 40, 30_000, 10, 5_000, 25].iter().map(|&n| "x".repeat(n)).collect();
        let gs = groups(&items, 3);
        let mut seen: Vec<usize> = gs.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..items.len()).collect::<Vec<_>>());
        for g in &gs {
            assert!(g.len() <= 3);
            let longest = g.iter().map(|&i| items[i].len()).max().unwrap();
            assert!(g.len() == 1 || g.len() * longest <= GROUP_CHARS, "{g:?}");
        }
        // Short items share groups; the 30,000-character one is alone.
        assert_eq!(gs[0], vec![5, 1, 7]);
        assert!(gs.contains(&vec![4]));
        assert!(groups(&[], 8).is_empty());
        // A tighter bound splits the short ones too; zero leaves every item alone.
        assert_eq!(
            groups_within(&items, 3, 60),
            vec![vec![5, 1], vec![7], vec![3], vec![0], vec![6], vec![2], vec![4]]
        );
        assert_eq!(groups_within(&items, 8, 0).len(), items.len());
    }

    #[test]
    fn a_group_fits_the_memory_budget() {
        // SmolLM2-135M: 30 layers, 3 KV heads of 64, so 46,080 bytes of keys and values a token.
        let c = crate::decoder::tests::smollm2_shape(None);
        // The default budget allows about the usual bound (7,767 tokens, 15,534 characters); a large one the bound
        // itself; 100 MB about 723 tokens (1,446 characters); none, no grouping.
        assert_eq!(group_chars(&c, crate::decoder::DEFAULT_MEMORY_BUDGET), 15_534);
        assert_eq!(group_chars(&c, 16 << 30), GROUP_CHARS);
        assert_eq!(group_chars(&c, 100_000_000), 2 * (100_000_000 / (3 * 46_080)));
        assert_eq!(group_chars(&c, 0), 0);
    }
}
