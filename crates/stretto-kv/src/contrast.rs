//! Contrastive filter questions: a predicate scored against its *opposite*, with answer words that carry the
//! meaning, instead of a generic '1' over '0'.
//!
//! Why: SmolLM2-135M can tell the sentiment of a movie review but cannot map it onto a generic yes/no answer. On
//! 240 reviews against the derived `is_positive` label (`examples/prompt_auc.rs`), "is clearly positive" scored
//! AUC 0.571 with '1'/'0' and 0.588 / 0.653 with Yes/No and true/false answers, but 0.800 when the question offers
//! the predicate and its opposite and the answer continues the shared words ("Answer: the text above is clearly")
//! with " positive" against " negative". Contrasts by negation ("… or not clearly positive") scored 0.415: a
//! small model reads "not" as a word, not as a negation, so negated opposites are refused here.
//!
//! The opposite comes from the model itself: a few-shot completion ([`opposite_prompt`]) whose first line is
//! checked ([`parse_opposite`]), and whose own opposite must lead back to the statement ([`derive_opposite`]), so
//! that a near-synonym is not taken for an opposite; a model that only echoes the statement or an example, or whose
//! opposite does not come back, gets no contrast (the contrast filter of `stretto-ops-text` then declines the task,
//! and the `contrast` filter protocol asks Yes/No instead). [`ContrastQuestion::new`] then forms the question and the two answer
//! tokens from the token sequences of both answers, so it needs no assumption about how the tokenizer merges words.
//! Deriving takes the model two generations (measured on 2 cores: 2.5 s for Qwen2.5-Coder-0.5B, 0.8 s for
//! SmolLM2-135M), so the LLM filters of `stretto-ops-text` call [`derive_question_kept`], which keeps each model's
//! opposite (or its absence) in [`OPPOSITES_FILE`] in the memo directory and reads it back in later queries; the
//! joins' side projections keep theirs there too ([`property_question_kept`]: a property's values, then their
//! opposite, three generations).
//!
//! ```no_run
//! use stretto_kv::contrast::{derive_opposite, ContrastQuestion};
//! use stretto_kv::decoder::Decoder;
//! use stretto_core::context::default_home;
//! let dec = Decoder::load(&default_home(), "smollm2-135m", 0)?;
//! let statement = "the text above is clearly positive";
//! if let Some(opposite) = derive_opposite(&dec, "the text above", statement)? {
//!     let q = ContrastQuestion::new(&dec, "the text above", statement, &opposite)?.expect("distinct answers");
//!     println!("{} Answer: {}", q.question, q.lead); // Question: is the text above clearly positive or …
//! }
//! # Ok::<(), stretto_kv::KvError>(())
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::decoder::{Decoder, Step};
use crate::error::{KvError, Result};
use crate::store::{append_lines, sha256_text};

/// The file, in a memo directory, where [`derive_question_kept`] and [`property_question_kept`] keep what models
/// derived: opposites, and a property's two values.
pub const OPPOSITES_FILE: &str = "opposites.jsonl";

/// The version of the derivations (their checks, [`parse_opposite`], [`round_trips`] and [`parse_values`], and their
/// generation, e.g. `MAX_TOKENS`): a kept opposite or pair of values of another version is derived again. (A change
/// of a prompt changes its digest, which the kept lines are keyed by.) Raise it with any change that can change a
/// derived opposite or pair of values.
const DERIVATION: u32 = 1;

/// The few-shot pairs of [`opposite_prompt`], as (statement, opposite) predicates after the subject. None is a
/// predicate of the bundled benchmarks, so the derivation is not told their answers.
const EXAMPLES: &[(&str, &str)] = &[
    ("is long", "is short"),
    ("mentions a dog", "mentions a cat"),
    ("is written in French", "is written in English"),
    ("praises the food", "criticises the food"),
];

/// Most tokens the derivation may generate: one line of a short statement.
const MAX_TOKENS: usize = 24;

/// The raw (non-chat) few-shot prompt that asks for the opposite of `statement`, whose examples are about `subject`.
pub fn opposite_prompt(subject: &str, statement: &str) -> String {
    let mut out = String::from("Each statement is followed by its opposite.\n");
    for (s, o) in EXAMPLES {
        out.push_str(&format!("Statement: {subject} {s}.\nOpposite: {subject} {o}.\n"));
    }
    out.push_str(&format!("Statement: {}.\nOpposite:", clean(statement)));
    out
}

/// The statement without surrounding space and final punctuation.
fn clean(s: &str) -> &str {
    s.trim().trim_end_matches(['.', '?', '!']).trim()
}

fn words(s: &str) -> Vec<String> {
    clean(s).split_whitespace().map(str::to_lowercase).collect()
}

/// The opposite in a model's completion of [`opposite_prompt`], if it is one: the first line, about the same
/// `subject`, different from the statement, not a copy of an example, and not a negation (see the module docs).
pub fn parse_opposite(subject: &str, statement: &str, completion: &str) -> Option<String> {
    let line = clean(completion.trim_start().lines().next()?);
    let (w, s) = (words(line), words(statement));
    let subj = words(subject);
    if w.is_empty() || w == s || !w.starts_with(&subj) || w.len() == subj.len() {
        return None;
    }
    if EXAMPLES.iter().any(|(a, b)| {
        [a, b].iter().any(|e| words(&format!("{subject} {e}")) == w)
            && !s.starts_with(&words(&format!("{subject} {a}")))
    }) {
        return None;
    }
    let negations = |v: &[String]| v.iter().filter(|x| *x == "not" || *x == "no" || x.ends_with("n't")).count();
    if negations(&w) > negations(&s) {
        return None;
    }
    Some(line.to_string())
}

/// The model's opposite of `statement` (about `subject`), checked both ways: the opposite's own opposite must be
/// the statement again ([`round_trips`]). `None` when either completion is not a usable one or the way back leads
/// elsewhere.
///
/// Why the way back: a small model asked for an opposite often gives a near-synonym, and a question that contrasts a
/// predicate with its synonym ranks items at random or inverted. `stretto bench protocols` measured it (development
/// slices, AUC against the labels): Qwen2.5-Coder-0.5B's one-way "opposites" of "describes footwear" ("describes
/// shoes") and "describes a t-shirt or a top" ("describes a shirt or a top") scored 0.565 and 0.594, and
/// SmolLM2-135M's "t-shirt" contrast 0.240. Antonyms come back: "clearly positive" ↔ "clearly negative" for both
/// models, "an item for men" ↔ "an item for women" for the 0.5B model; the synonyms do not ("shoes" → "boots",
/// "a shirt or a top" → "pants or a skirt").
pub fn derive_opposite(dec: &Decoder, subject: &str, statement: &str) -> Result<Option<String>> {
    let _span = tracing::info_span!("derive_opposite", model = dec.name(), statement).entered();
    let Some(opposite) = propose_opposite(dec, subject, statement)? else {
        return Ok(None);
    };
    let back = propose_opposite(dec, subject, &opposite)?;
    let kept = round_trips(statement, back.as_deref());
    tracing::debug!(opposite, ?back, kept, "opposite derived");
    Ok(kept.then_some(opposite))
}

/// The contrast question for `statement` (about `subject`) against the model's round-trip opposite
/// ([`derive_opposite`]); `None` without one, or when the two answers share every token.
pub fn derive_question(dec: &Decoder, subject: &str, statement: &str) -> Result<Option<ContrastQuestion>> {
    match derive_opposite(dec, subject, statement)? {
        Some(opposite) => ContrastQuestion::new(dec, subject, statement, &opposite),
        None => Ok(None),
    }
}

/// [`derive_question`], with the opposite (or its absence) kept in [`OPPOSITES_FILE`] in `dir`: read from there where
/// an earlier derivation by the same model of the same prompt left it, else derived and added. Deriving costs the
/// model two generations (seconds on a CPU for each query that asks a contrast otherwise). `None` for `dir`
/// derives without keeping anything. A torn or foreign line of the file is skipped. Lines are keyed by the model's
/// name: call it with the f32 decoder, as the operators do (a quantized rung asks its f32 model's question).
pub fn derive_question_kept(
    dec: &Decoder,
    dir: Option<&Path>,
    subject: &str,
    statement: &str,
) -> Result<Option<ContrastQuestion>> {
    match kept_opposite(dec, dir, subject, statement)? {
        Some(opposite) => ContrastQuestion::new(dec, subject, statement, &opposite),
        None => Ok(None),
    }
}

/// One line of [`OPPOSITES_FILE`]: what one model derived from one prompt (an opposite's, or a property's values').
#[derive(Serialize, Deserialize)]
struct Kept {
    model: String,
    derivation: u32,
    /// SHA-256 of the prompt: [`opposite_prompt`] for the statement, or [`values_prompt`] for the property.
    prompt: String,
    /// The opposite (of an [`opposite_prompt`] line), or `None` where the model derived none.
    opposite: Option<String>,
    /// The two values (of a [`values_prompt`] line), or `None` where the model named none. Absent from the lines
    /// of opposites.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    values: Option<(String, String)>,
}

/// The latest line of [`OPPOSITES_FILE`] in `dir` that `dec` derived from the prompt whose digest is `prompt`, if any.
fn kept_line(dec: &Decoder, dir: &Path, prompt: &str) -> Result<Option<Kept>> {
    let path = dir.join(OPPOSITES_FILE);
    // (Read lossily: a line of damaged bytes is skipped as foreign, not an error for every later query.)
    let text = match std::fs::read(&path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(KvError::io(&path, e)),
    };
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Kept>(l).ok())
        .filter(|k| k.model == dec.identity() && k.derivation == DERIVATION && k.prompt == prompt)
        .last())
}

/// Adds `line` to [`OPPOSITES_FILE`] in `dir`.
fn keep_line(dir: &Path, line: &Kept) -> Result<()> {
    let mut text = serde_json::to_string(line).map_err(|e| KvError::Runtime(e.to_string()))?;
    text.push('\n');
    append_lines(&dir.join(OPPOSITES_FILE), &text)
}

/// The opposite `dec` derives for `statement`, as [`OPPOSITES_FILE`] in `dir` keeps it (the latest line wins), or
/// derived now and added; derived alone without a `dir`.
fn kept_opposite(dec: &Decoder, dir: Option<&Path>, subject: &str, statement: &str) -> Result<Option<String>> {
    let Some(dir) = dir else { return derive_opposite(dec, subject, statement) };
    let prompt = sha256_text(&opposite_prompt(subject, statement));
    if let Some(k) = kept_line(dec, dir, &prompt)? {
        tracing::debug!(model = dec.name(), statement, opposite = ?k.opposite, "opposite read back");
        return Ok(k.opposite);
    }
    let opposite = derive_opposite(dec, subject, statement)?;
    let line = Kept { model: dec.identity(), derivation: DERIVATION, prompt, opposite, values: None };
    keep_line(dir, &line)?;
    Ok(line.opposite)
}

/// The two values `dec` names for `property`, as [`OPPOSITES_FILE`] in `dir` keeps them, or derived now
/// ([`derive_values`]) and added; derived alone without a `dir`.
fn kept_values(dec: &Decoder, dir: Option<&Path>, property: &str) -> Result<Option<(String, String)>> {
    let Some(dir) = dir else { return derive_values(dec, property) };
    let prompt = sha256_text(&values_prompt(property));
    if let Some(k) = kept_line(dec, dir, &prompt)? {
        tracing::debug!(model = dec.name(), property, values = ?k.values, "values read back");
        return Ok(k.values);
    }
    let values = derive_values(dec, property)?;
    let line = Kept { model: dec.identity(), derivation: DERIVATION, prompt, opposite: None, values };
    keep_line(dir, &line)?;
    Ok(line.values)
}

/// The model's one-way opposite of `statement`: its completion of [`opposite_prompt`], if usable
/// ([`parse_opposite`]).
pub fn propose_opposite(dec: &Decoder, subject: &str, statement: &str) -> Result<Option<String>> {
    let ids = dec.encode(&opposite_prompt(subject, statement))?;
    let out = dec.generate_line(&[Step { past: None, tokens: &ids }], MAX_TOKENS)?;
    Ok(out.first().and_then(|g| parse_opposite(subject, statement, &g.text)))
}

/// Whether the opposite of an opposite (`back`) is `statement` again, word for word (case and final punctuation
/// aside).
pub fn round_trips(statement: &str, back: Option<&str>) -> bool {
    back.is_some_and(|b| words(b) == words(statement))
}

/// A filter question that offers a statement and its opposite, and the answer tokens that tell them apart.
#[derive(Debug, Clone, PartialEq)]
pub struct ContrastQuestion {
    /// The question, e.g. "Question: is the text above clearly positive or clearly negative?".
    pub question: String,
    /// The words both answers share, which open the answer ("the text above is clearly").
    pub lead: String,
    /// The tokens after the cached item: question, end of turn, answer prefix and lead, up to where the two answers
    /// differ.
    pub tokens: Vec<u32>,
    /// The first token of the statement's answer.
    pub yes: u32,
    /// The first token of the opposite's answer.
    pub no: u32,
}

impl ContrastQuestion {
    /// The question for `statement` against `opposite`, both about `subject`; `None` if the two answers share
    /// every token (nothing to compare).
    ///
    /// The words both share form the answer's lead ("the text above is clearly"). A copular statement becomes a
    /// yes/no-style question with both alternatives ("is the text above clearly positive or clearly negative?"),
    /// any other a choice between the two sentences.
    pub fn new(dec: &Decoder, subject: &str, statement: &str, opposite: &str) -> Result<Option<Self>> {
        let (s, o) = (clean(statement), clean(opposite));
        let sw: Vec<&str> = s.split_whitespace().collect();
        let ow: Vec<&str> = o.split_whitespace().collect();
        let k = sw.iter().zip(&ow).take_while(|(a, b)| a.eq_ignore_ascii_case(b)).count();
        if k == sw.len() || k == ow.len() {
            return Ok(None);
        }
        let subj = subject.split_whitespace().count();
        let copula = k > subj && sw[..subj].join(" ").eq_ignore_ascii_case(subject) && matches!(sw[subj], "is" | "are");
        let question = if copula {
            let tail = &sw[subj + 1..k];
            let alt = |rest: &[&str]| tail.iter().chain(rest).copied().collect::<Vec<_>>().join(" ");
            format!("Question: {} {} {} or {}?", sw[subj], sw[..subj].join(" "), alt(&sw[k..]), alt(&ow[k..]))
        } else {
            format!("Question: which is true: {s}, or {o}?")
        };
        let lead = sw[..k].join(" ");
        let prefix = dec.answer_suffix(&question, &lead);
        let join = |rest: &[&str]| {
            if lead.is_empty() {
                format!("{prefix}{}", rest.join(" "))
            } else {
                format!("{prefix} {}", rest.join(" "))
            }
        };
        let (yes, no) = (dec.encode(&join(&sw[k..]))?, dec.encode(&join(&ow[k..]))?);
        let d = yes.iter().zip(&no).take_while(|(a, b)| a == b).count();
        if d == yes.len() || d == no.len() {
            return Ok(None);
        }
        Ok(Some(Self { question, lead, tokens: yes[..d].to_vec(), yes: yes[d], no: no[d] }))
    }
}

/// The few-shot properties of [`values_prompt`] with their two opposite values. None is a property the bundled
/// benchmarks compare, so the derivation is not told their answers.
const VALUE_EXAMPLES: &[(&str, &str, &str)] =
    &[("size", "big", "small"), ("temperature", "hot", "cold"), ("speed", "fast", "slow")];

/// The raw (non-chat) few-shot prompt that asks for the two opposite values of `property`.
pub fn values_prompt(property: &str) -> String {
    let mut out = String::from("Each property is followed by its two opposite values.\n");
    for (p, a, b) in VALUE_EXAMPLES {
        out.push_str(&format!("Property: {p}\nValues: {a} or {b}\n"));
    }
    out.push_str(&format!("Property: {}\nValues:", clean(property)));
    out
}

/// The two values in a model's completion of [`values_prompt`], if usable: the first line reads `X or Y`, each of
/// one to three words, the two different, neither a negation, and not an example's values.
pub fn parse_values(completion: &str) -> Option<(String, String)> {
    let line = clean(completion.trim_start().lines().next()?).to_lowercase();
    let (a, b) = line.split_once(" or ")?;
    let ok = |v: &str| {
        let w: Vec<&str> = v.split_whitespace().collect();
        (1..=3).contains(&w.len())
            && w.iter().all(|x| x.chars().all(|c| c.is_alphanumeric() || c == '-'))
            && !w.iter().any(|x| matches!(*x, "not" | "no" | "non") || x.ends_with("n't"))
    };
    let (a, b) = (clean(a).to_string(), clean(b).to_string());
    if !ok(&a) || !ok(&b) || a == b || b.contains(" or ") {
        return None;
    }
    if VALUE_EXAMPLES.iter().any(|(_, x, y)| [x, y].contains(&&a.as_str()) || [x, y].contains(&&b.as_str())) {
        return None;
    }
    Some((a, b))
}

/// The two opposite values of `property` as the model names them ("sentiment" → "positive" / "negative"), or
/// `None` when its completion is not a usable pair ([`parse_values`]).
pub fn derive_values(dec: &Decoder, property: &str) -> Result<Option<(String, String)>> {
    let _span = tracing::info_span!("derive_values", model = dec.name(), property).entered();
    let ids = dec.encode(&values_prompt(property))?;
    let out = dec.generate_line(&[Step { past: None, tokens: &ids }], MAX_TOKENS)?;
    Ok(out.first().and_then(|g| parse_values(&g.text)))
}

/// The contrast question that projects an item onto one of `property`'s two values: "is the sentiment of the text
/// above positive or negative?", scored by the first answer token of the first value against the second's. Only
/// for a *polar* property: the two values must be each other's opposite as [`derive_opposite`] finds it (with its
/// way back), so that a property with many values ("genre" → "fiction or non-fiction") is not squeezed onto two.
/// `None` when the model names no usable values, they are not opposites, or the two answers share every token.
pub fn property_question(dec: &Decoder, item: &str, property: &str) -> Result<Option<ContrastQuestion>> {
    property_question_kept(dec, None, item, property)
}

/// [`property_question`], with the values and the opposite it derives (or their absence) kept in
/// [`OPPOSITES_FILE`] in `dir` and read back from there by later calls, as [`derive_question_kept`] keeps an
/// opposite: deriving costs the model three generations. `None` for `dir` derives without keeping anything.
pub fn property_question_kept(
    dec: &Decoder,
    dir: Option<&Path>,
    item: &str,
    property: &str,
) -> Result<Option<ContrastQuestion>> {
    let _span = tracing::info_span!("property_question", model = dec.name(), property).entered();
    let Some((a, b)) = kept_values(dec, dir, property)? else { return Ok(None) };
    let subject = format!("the {} of {item}", clean(property));
    let (first, second) = (format!("{subject} is {a}"), format!("{subject} is {b}"));
    match kept_opposite(dec, dir, &subject, &first)? {
        Some(o) if words(&o) == words(&second) => ContrastQuestion::new(dec, &subject, &first, &second),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUBJECT: &str = "the text above";

    #[test]
    fn a_propertys_values_are_two_short_different_words() {
        assert_eq!(parse_values(" positive or negative\nProperty: x"), Some(("positive".into(), "negative".into())));
        assert_eq!(parse_values(" Very Happy or sad."), Some(("very happy".into(), "sad".into())));
        for bad in
            [" positive", " good or good", " big or small", " good or not good", " a b c d or e", "\n", " a or b or c"]
        {
            assert_eq!(parse_values(bad), None, "{bad:?}");
        }
        let p = values_prompt("sentiment");
        assert!(p.ends_with("Property: sentiment\nValues:"), "{p}");
    }

    #[test]
    fn opposites_are_checked() {
        let s = "the text above is clearly positive";
        assert_eq!(
            parse_opposite(SUBJECT, s, " the text above is clearly negative.\n\nThe text above is written in French"),
            Some("the text above is clearly negative".into())
        );
        // Echoes of the statement or of an example, other subjects, negations and empty lines are refused.
        assert_eq!(parse_opposite(SUBJECT, s, " the text above is clearly positive.\nStatement: x"), None);
        assert_eq!(parse_opposite(SUBJECT, "the text above praises the cast", " the text above is short."), None);
        assert_eq!(parse_opposite(SUBJECT, s, " the photo is clearly negative."), None);
        assert_eq!(parse_opposite(SUBJECT, s, " the text above is not clearly positive."), None);
        assert_eq!(parse_opposite(SUBJECT, s, "\n"), None);
        assert_eq!(parse_opposite(SUBJECT, s, " the text above."), None);
        // An example's opposite is fine when the statement is that example.
        assert_eq!(
            parse_opposite(SUBJECT, "the text above is long", " the text above is short."),
            Some("the text above is short".into())
        );
        // A statement that is itself negated may keep its negation.
        assert_eq!(
            parse_opposite(SUBJECT, "the text above is not funny", " the text above is not serious."),
            Some("the text above is not serious".into())
        );
    }

    #[test]
    fn an_opposite_counts_only_when_its_opposite_is_the_statement_again() {
        let s = "the text above is clearly positive";
        assert!(round_trips(s, Some("The text above is clearly positive.")));
        // A synonym's opposite leads elsewhere; no way back at all is no opposite either.
        assert!(!round_trips("the text above describes footwear", Some("the text above describes boots")));
        assert!(!round_trips(s, None));
    }

    #[test]
    fn the_prompt_ends_where_the_model_continues() {
        let p = opposite_prompt(SUBJECT, "the text above is clearly positive.");
        assert!(p.ends_with("Statement: the text above is clearly positive.\nOpposite:"), "{p}");
        assert_eq!(p.matches("Opposite:").count(), EXAMPLES.len() + 1);
    }
}
