//! Semantic joins: operators that judge the pairs of a *join predicate*, a prompt over two tables
//! (`{r1.reviewtext} and {r2.reviewtext} express the same sentiment`), each pair's two sides seen apart
//! ([`PhysicalOp::reads_pairs`]). A join's input is the cross product of its (relationally pre-filtered) sides,
//! so what an operator does once per side, rather than once per pair, decides whether the join finishes in
//! minutes or in hours. Three families, every one a candidate stage of the join's cascade, profiled and certified
//! like any other:
//!
//! - **`llm-pair`**: the LLM reads the first text's cached past (the same past every one-item question over it
//!   reads: no per-pair cache), then the second text and the question. Per pair it pays the second text's tokens
//!   and the question. The ladder's top model is the reference (gold) of join predicates in general.
//! - **`project-pair`** (project, then join, as LOTUS calls it): where the predicate compares one property of the
//!   two sides ("the same sentiment", "opposite sentiments", "a different genre": [`comparison`]), the LLM projects
//!   each side once, over the side's cached past, onto the property's two values as the model itself names them
//!   ("is the sentiment of the text above positive or negative?", [`stretto_kv::contrast::property_question`]),
//!   and a pair's score is the log-odds that its sides take the same value (or different ones). Where the model
//!   names no two values, it compares the sides' answers to "What is the genre of the text above?". Per pair it
//!   pays nothing but the comparison. The ladder's top model is the reference of the predicates it serves: the
//!   predicate is about each side's property, and asked about the pair as a whole Qwen2.5-Coder-0.5B ranks
//!   SemBench's review pairs at chance (`examples/pair_probe.rs`).
//! - **`embed-pair`**: the cosine of the two sides' sentence embeddings (each side embedded once, kept with the
//!   embedding filter's item embeddings). A cheap first stage for predicates of likeness ("is an item of"), a
//!   hopeless one for sentiment, which screening then drops.
//!
//! The per-side work of `project-pair` and `embed-pair` is spread over the pairs that share each side: shown the
//! whole input first ([`PhysicalOp::observe_input`]), they report per pair what a run over that input pays per
//! pair, so a sample of a few hundred pairs prices them as the whole join will.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use stretto_core::memo::{memo_key, Memo, MemoEntry};
use stretto_core::op::{
    parse_config, split_pair, LogicalKind, Modality, OpOutput, OpProperties, OperatorFactory, PhysicalOp, SemanticTask,
};
use stretto_core::{CoreError, OpContext, Result};
use stretto_kv::cache::PastSource;
use stretto_kv::contrast::ContrastQuestion;
use stretto_kv::models::FilterProtocol;
use stretto_kv::press::Positions;
use stretto_kv::store::Profile;

/// The prompt as a pair operator's model reads it: the first-named table's references become `first`, the other
/// table's `second` (a side referenced twice reads the same both times).
pub fn about_the_pair(prompt: &str, first: &str, second: &str) -> String {
    let mut out = String::with_capacity(prompt.len());
    let mut first_table: Option<String> = None;
    let mut rest = prompt;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}').map(|c| open + c) else { break };
        let table = rest[open + 1..close].trim().rsplit_once('.').map_or("", |(t, _)| t).to_string();
        let first_table = first_table.get_or_insert_with(|| table.clone());
        out.push_str(if *first_table == table { first } else { second });
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Whether a comparison predicate asks for the two sides' property to be the same or to differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// "the same sentiment", "share the genre".
    Same,
    /// "opposite sentiments", "a different genre", "differ in tone".
    Different,
}

/// A join predicate that compares one property of its two sides ([`comparison`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparison {
    /// The property, as a noun phrase ("sentiment", "overall tone").
    pub property: String,
    /// Same or different.
    pub relation: Relation,
}

/// Words that may stand between the comparison word and the property, or around it, and are no part of it.
const FILLER: &[&str] = &["the", "a", "an", "their", "its", "in", "of", "kind", "type", "sort", "exactly", "very"];
/// Words that are no part of a property and may follow it ("… the same sentiment as SECOND").
const STOP: &[&str] = &[
    "as", "and", "or", "but", "than", "from", "to", "with", "while", "whereas", "about", "for", "on", "toward", "that",
    "those", "one", "ones", "s", "is", "are", "be", "was", "were", "each", "other", "both", "first", "second",
];

fn comparison_word(w: &str) -> Option<Relation> {
    match w {
        "same" | "identical" | "share" | "shares" | "sharing" | "matching" => Some(Relation::Same),
        "opposite" | "different" | "differ" | "differs" | "differing" | "contrasting" => Some(Relation::Different),
        _ => None,
    }
}

/// The property a join predicate compares between its two sides, if it reads as exactly one: "{a} and {b}
/// express the same sentiment", "… opposite sentiments", "… have a different genre", "{a} differs from {b} in
/// tone", "the sentiment of {a} is the same as that of {b}", "{a}'s tone matches …" is not read. It is strict on
/// purpose, since the projection of this property is the reference of the predicates it reads: a negation
/// ("do not share", "cannot"), two comparisons ("the same sentiment about different actors"), or words left over
/// after the property ("the same number of stars", "the same sentiment about the movie") give `None`.
pub fn comparison(prompt: &str) -> Option<Comparison> {
    let text = about_the_pair(prompt, " FIRST ", " SECOND ").to_lowercase();
    let words: Vec<&str> = text.split(|c: char| !(c.is_alphanumeric() || c == '-')).filter(|w| !w.is_empty()).collect();
    if !words.contains(&"first") || !words.contains(&"second") {
        return None;
    }
    let negation =
        |w: &&str| matches!(*w, "not" | "no" | "never" | "neither" | "nor" | "cannot" | "without" | "unlike");
    if words.iter().any(negation) || text.contains("n't") || text.contains("n\u{2019}t") {
        return None;
    }
    let mut hits: Vec<(usize, Relation)> =
        words.iter().enumerate().filter_map(|(i, w)| comparison_word(w).map(|r| (i, r))).collect();
    // "share the same sentiment" is one comparison.
    hits.dedup_by(|later, earlier| {
        later.1 == earlier.1 && later.0 <= earlier.0 + 2 && {
            *earlier = *later;
            true
        }
    });
    let [(at, relation)] = hits.as_slice() else { return None };
    let content = |w: &str| !FILLER.contains(&w) && !STOP.contains(&w);
    let mut i = at + 1;
    // "differ from SECOND in tone": the other side named right after the comparison word.
    if words.get(i).is_some_and(|w| matches!(*w, "from" | "to" | "with")) && words.get(i + 1) == Some(&"second") {
        i += 2;
    }
    while words.get(i).is_some_and(|w| FILLER.contains(w)) {
        i += 1;
    }
    let after: Vec<&str> = words[i.min(words.len())..].iter().copied().take_while(|w| content(w)).take(3).collect();
    let (phrase, rest) = if after.is_empty() {
        // "the sentiment of FIRST is the same as that of SECOND": the words before "of FIRST".
        let of = words.windows(2).position(|w| w == ["of", "first"])?;
        let before: Vec<&str> =
            words[..of].iter().rev().copied().take_while(|w| content(w)).take(3).collect::<Vec<_>>();
        let phrase: Vec<&str> = before.into_iter().rev().collect();
        // After the comparison word nothing but the same property may be named again.
        let rest: Vec<&str> = words[at + 1..].iter().copied().filter(|w| content(w) && !phrase.contains(w)).collect();
        (phrase, rest)
    } else {
        let rest: Vec<&str> = words[i + after.len()..].iter().copied().filter(|w| content(w)).collect();
        (after, rest)
    };
    if phrase.is_empty() || !rest.is_empty() {
        return None;
    }
    let mut property = phrase.join(" ");
    // "sentiments" → "sentiment", "genres" → "genre"; not "status", "series", "news", "class" or "analysis".
    if property.len() > 4
        && property.ends_with('s')
        && !["ss", "us", "is", "ws", "ies"].iter().any(|e| property.ends_with(e))
    {
        property.pop();
    }
    Some(Comparison { property, relation: *relation })
}

/// How many pairs of a query's input hold each side, per task prompt: the count a side's one-time work is spread
/// over ([`PhysicalOp::observe_input`]).
#[derive(Debug, Default)]
struct Fanout(Mutex<HashMap<String, HashMap<String, usize>>>);

impl Fanout {
    fn observe(&self, task: &SemanticTask, items: &[String]) {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for (l, r) in items.iter().filter_map(|i| split_pair(i)) {
            *counts.entry(l.to_string()).or_default() += 1;
            *counts.entry(r.to_string()).or_default() += 1;
        }
        if let Ok(mut m) = self.0.lock() {
            m.insert(task.prompt.clone(), counts);
        }
    }

    /// The pairs holding `side` (at least 1: a side never shown is priced as if in one pair).
    fn of(&self, task: &SemanticTask, side: &str) -> f64 {
        self.0.lock().ok().and_then(|m| m.get(&task.prompt).and_then(|c| c.get(side).copied())).unwrap_or(1).max(1)
            as f64
    }
}

/// Per-side answers kept in the process and in a memo beside the operator's own ([`OpContext::open_memo`]).
#[derive(Debug)]
struct SideStore {
    memory: Mutex<HashMap<String, MemoEntry>>,
    memo: Option<Memo>,
}

impl SideStore {
    fn open(ctx: &OpContext, name: &str) -> Self {
        Self { memory: Mutex::default(), memo: ctx.open_memo(name) }
    }

    fn get(&self, key: &str) -> Option<MemoEntry> {
        if let Some(e) = self.memory.lock().ok().and_then(|m| m.get(key).cloned()) {
            return Some(e);
        }
        let e = self.memo.as_ref()?.get(key)?;
        if let Ok(mut m) = self.memory.lock() {
            m.insert(key.to_string(), e.clone());
        }
        Some(e)
    }

    fn put(&self, entries: Vec<MemoEntry>) -> Result<()> {
        if let Ok(mut m) = self.memory.lock() {
            for e in &entries {
                m.insert(e.key.clone(), e.clone());
            }
        }
        match &self.memo {
            Some(memo) => memo.put(entries),
            None => Ok(()),
        }
    }
}

/// The distinct sides of `pairs`, in order of first appearance.
fn distinct_sides(pairs: &[(String, String)]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (l, r) in pairs {
        for s in [l, r] {
            if seen.insert(s.as_str()) {
                out.push(s.clone());
            }
        }
    }
    out
}

fn pairs_of(items: &[String], operator: &str) -> Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|i| {
            split_pair(i)
                .map(|(l, r)| (l.to_string(), r.to_string()))
                .ok_or_else(|| CoreError::operator(operator, "was given an item that is not a pair"))
        })
        .collect()
}

fn kv_err(name: &str) -> impl Fn(stretto_kv::KvError) -> CoreError + '_ {
    move |e| CoreError::operator_failed(name, e)
}

/// The uncompressed cache profile of a ladder model: the past one-item operators read at ratio 0.
fn ratio_zero(ctx: &OpContext, model: &str) -> Profile {
    Profile {
        model: model.to_string(),
        press: crate::llm::default_press(ctx, model),
        ratio: 0.0,
        positions: Positions::Keep,
    }
}

fn past_source(ctx: &OpContext, model: &str, factory: &str) -> Result<PastSource> {
    let budget = stretto_kv::budget::shared(&ctx.kv_dir, ctx.memo_dir(), ctx.disk_budget)
        .map_err(|e| CoreError::OperatorConfig { factory: factory.into(), message: e.to_string() })?;
    Ok(PastSource::new(ratio_zero(ctx, model), ctx.kv_dir.clone())
        .with_budget(budget)
        .with_memory_budget(ctx.memory_budget.unwrap_or(stretto_kv::decoder::DEFAULT_MEMORY_BUDGET)))
}

/// Prior seconds per item of a ladder model's question pass, replaced by profiled costs.
fn per_item_hint(model: &str) -> f64 {
    if model.contains("1.5b") {
        1.4
    } else if model.contains("0.5b") {
        0.45
    } else {
        0.05
    }
}

/// Configuration of an `llm-pair` filter.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairLlmConfig {
    /// Catalog decoder model (or a session's own).
    pub model: String,
    /// Pairs per decoder batch.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// Whether this rung is the join's reference (gold candidate).
    #[serde(default)]
    pub gold: bool,
    /// The answer protocol (`digits`, `yes-no`, … as for `llm-filter`): default, the catalog's for the model; a
    /// contrast protocol asks Yes/No (its derived opposites are about one text).
    #[serde(default)]
    pub protocol: Option<String>,
}

fn default_batch() -> usize {
    8
}

/// The LLM judging a pair: the first text's cached past, then the second text and the question.
#[derive(Debug)]
pub struct PairLlm {
    name: String,
    props: OpProperties,
    config: PairLlmConfig,
    ctx: OpContext,
    source: PastSource,
    protocol: FilterProtocol,
    baselines: Mutex<HashMap<String, f64>>,
}

/// Family of the LLM pair filters.
pub const PAIR_LLM_FAMILY: &str = "llm-pair-filter";

impl PairLlm {
    /// Builds the operator (cheap: the model loads on first evaluation).
    pub fn new(config: PairLlmConfig, ctx: &OpContext) -> Result<Self> {
        let bad = |m: String| CoreError::OperatorConfig { factory: PAIR_LLM_FAMILY.into(), message: m };
        stretto_kv::prepare::check_decoder_name(&ctx.model_home, &config.model).map_err(|e| bad(e.to_string()))?;
        let protocol = match &config.protocol {
            Some(p) => FilterProtocol::parse(p).map_err(|e| bad(e.to_string()))?,
            None => stretto_kv::models::filter_protocol(&config.model),
        }
        .fallback();
        Ok(Self {
            name: format!("llm-pair:{}", config.model),
            props: OpProperties {
                kind: LogicalKind::Filter,
                family: PAIR_LLM_FAMILY.into(),
                modality: Modality::Text,
                model: Some(config.model.clone()),
                compression: Some(0.0),
                tunable: true,
                gold: config.gold,
                // The second text's tokens as well as the question's.
                cost_hint: 2.0 * per_item_hint(&config.model),
                score_range: (-10.0, 10.0),
            },
            source: past_source(ctx, &config.model, PAIR_LLM_FAMILY)?,
            config,
            ctx: ctx.clone(),
            protocol,
            baselines: Mutex::default(),
        })
    }

    fn statement(task: &SemanticTask) -> String {
        about_the_pair(&task.prompt, "the first text", "the second text")
    }
}

impl PhysicalOp for PairLlm {
    fn name(&self) -> &str {
        &self.name
    }

    fn properties(&self) -> &OpProperties {
        &self.props
    }

    fn kv_cache_model(&self) -> Option<&str> {
        Some(&self.config.model)
    }

    fn reads_pairs(&self) -> bool {
        true
    }

    fn is_gold_for(&self, task: &SemanticTask) -> bool {
        // A predicate that compares one property of the two sides has the ladder's top model's projection as its
        // reference (`project-pair`): asked about the pair as a whole, Qwen2.5-Coder-0.5B ranked SemBench's pairs of
        // reviews by opposite sentiment at chance (AUC 0.509 against the labels on 240 pairs, `examples/pair_probe`).
        self.config.gold && comparison(&task.prompt).is_none()
    }

    fn accept(&self, _: &SemanticTask) -> Result<String> {
        crate::under_model(&self.ctx, format!("{}#{}", self.name, self.protocol), &self.config.model)
    }

    fn evaluate_items(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
        let kv = kv_err(&self.name);
        let pairs = pairs_of(items, &self.name)?;
        let dec = crate::decoder(&self.ctx, &self.config.model, stretto_kv::convert::Weights::F32).map_err(&kv)?;
        let prompt = stretto_kv::tasks::pair_filter_prompt(&dec, self.protocol, &Self::statement(task)).map_err(&kv)?;
        let (scores, secs) =
            stretto_kv::tasks::pair_filter_scores(&dec, &self.source, &pairs, &prompt, self.config.batch)
                .map_err(&kv)?;
        if !self.protocol.calibrated {
            return Ok((OpOutput::Scores(scores), secs));
        }
        // Contextual calibration, as the one-item filters do it: the log-odds of a pair of content-free texts.
        let base = {
            let mut cache =
                self.baselines.lock().map_err(|_| CoreError::operator(&self.name, "calibration lock poisoned"))?;
            match cache.get(&prompt.text) {
                Some(b) => *b,
                None => {
                    let free = crate::llm::CONTENT_FREE.to_string();
                    let (b, _) =
                        stretto_kv::tasks::pair_filter_scores(&dec, &self.source, &[(free.clone(), free)], &prompt, 1)
                            .map_err(&kv)?;
                    cache.insert(prompt.text.clone(), b[0]);
                    b[0]
                }
            }
        };
        Ok((OpOutput::Scores(scores.into_iter().map(|s| s - base).collect()), secs))
    }
}

/// The `llm-pair` rungs: every ladder model, uncompressed; the last is the gold candidate.
pub fn pair_llm_ladder(ctx: &OpContext) -> Vec<serde_json::Value> {
    let last = ctx.ladder.len().saturating_sub(1);
    ctx.ladder.iter().enumerate().map(|(i, m)| serde_json::json!({"model": m, "gold": i == last})).collect()
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: PAIR_LLM_FAMILY,
        plugin: crate::PLUGIN,
        about: "LLM judging the pairs of a semantic join: the first text's cached KV past, then the second text and \
                the question (log-odds of yes over no), one rung per ladder model, the last the join's gold",
        ladder: pair_llm_ladder,
        build: |c, ctx| Ok(Arc::new(PairLlm::new(parse_config(PAIR_LLM_FAMILY, c)?, ctx)?)),
    }
}

/// Configuration of a `project-pair` filter.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectPairConfig {
    /// Catalog decoder model (or a session's own).
    pub model: String,
    /// Sides per decoder batch.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// Most tokens a side's answer may take (where the model names no two values of the property).
    #[serde(default = "default_side_tokens")]
    pub max_tokens: usize,
    /// Whether this rung is the reference of the join predicates it serves (gold candidate).
    #[serde(default)]
    pub gold: bool,
    /// Whether a side's projection is calibrated by a content-free item's (default: as the model's filter
    /// protocol in the catalog says).
    #[serde(default)]
    pub calibrated: Option<bool>,
}

fn default_side_tokens() -> usize {
    12
}

/// Project, then join: the compared property of each side, named once by the LLM over the side's cached past; a
/// pair's score compares the two answers.
#[derive(Debug)]
pub struct ProjectPair {
    name: String,
    props: OpProperties,
    config: ProjectPairConfig,
    ctx: OpContext,
    source: PastSource,
    sides: SideStore,
    fanout: Fanout,
    /// The content-free item's log-odds per projection question, computed once.
    baselines: Mutex<HashMap<String, f64>>,
}

/// Family of the project-then-join filters.
pub const PROJECT_PAIR_FAMILY: &str = "project-pair-filter";

impl ProjectPair {
    /// Builds the operator (cheap: the model loads on first evaluation).
    pub fn new(config: ProjectPairConfig, ctx: &OpContext) -> Result<Self> {
        stretto_kv::prepare::check_decoder_name(&ctx.model_home, &config.model)
            .map_err(|e| CoreError::OperatorConfig { factory: PROJECT_PAIR_FAMILY.into(), message: e.to_string() })?;
        let name = format!("project-pair:{}", config.model);
        Ok(Self {
            props: OpProperties {
                kind: LogicalKind::Filter,
                family: PROJECT_PAIR_FAMILY.into(),
                modality: Modality::Text,
                model: Some(config.model.clone()),
                // Not a rung of the LLM ladder (no compression ratio): it is gold only where it declares itself the
                // reference of a task (`is_gold_for`), never by the fallback to the dearest uncompressed rung.
                compression: None,
                tunable: true,
                gold: config.gold,
                // Two side answers per pair before the input is seen; shown it, each side's answer is spread over
                // the pairs that hold it.
                cost_hint: 2.0 * per_item_hint(&config.model),
                // Log-odds margins of the sides' projections (or, without two values, answer confidences in ±1).
                score_range: (-10.0, 10.0),
            },
            source: past_source(ctx, &config.model, PROJECT_PAIR_FAMILY)?,
            sides: SideStore::open(ctx, &format!("{name}.sides")),
            name,
            config,
            ctx: ctx.clone(),
            fanout: Fanout::default(),
            baselines: Mutex::default(),
        })
    }

    fn comparison_or_decline(&self, task: &SemanticTask) -> Result<Comparison> {
        comparison(&task.prompt).ok_or_else(|| CoreError::NotApplicable {
            operator: self.name.clone(),
            reason: format!("`{}` compares no one property of its two sides", task.prompt),
        })
    }

    fn calibrated(&self) -> bool {
        self.config.calibrated.unwrap_or_else(|| stretto_kv::models::filter_protocol(&self.config.model).calibrated)
    }

    /// The side question for a property the model names no two values of, and its answer's label.
    fn map_question(property: &str) -> (String, String) {
        (
            stretto_kv::tasks::map_question(&format!("What is the {property} of the text above")),
            stretto_kv::tasks::field_label(property),
        )
    }

    /// How this operator's model projects a side onto `property`: the contrast between the property's two values
    /// as the model names them, derived once per model and property in the process ([`projections`]) and kept
    /// beside the memoised answers for later queries (none with memo off).
    fn projection(&self, property: &str) -> Result<Option<ContrastQuestion>> {
        let mut cache =
            projections().lock().map_err(|_| CoreError::operator(&self.name, "projection lock poisoned"))?;
        let key = (self.config.model.clone(), property.to_string());
        if let Some(q) = cache.get(&key) {
            return Ok(q.clone());
        }
        let kv = kv_err(&self.name);
        let dec = crate::decoder(&self.ctx, &self.config.model, stretto_kv::convert::Weights::F32).map_err(&kv)?;
        let dir = match &self.ctx.memo {
            stretto_core::context::MemoPolicy::Dir(dir) => Some(dir.as_path()),
            stretto_core::context::MemoPolicy::Off => None,
        };
        let q = stretto_kv::contrast::property_question_kept(&dec, dir, "the text above", property).map_err(&kv)?;
        match &q {
            Some(q) => tracing::info!(op = %self.name, question = %q.question, lead = %q.lead, "side projection"),
            None => tracing::info!(op = %self.name, property, "no two values named: each side's answer is compared"),
        }
        cache.insert(key, q.clone());
        Ok(q)
    }

    /// Each side's projection, computing those not known yet: under a contrast projection its log-odds of the
    /// first value over the second (`score`), else its normalised answer and confidence (`value`, `confidence`);
    /// with the seconds each cost.
    fn side_answers(&self, property: &str, sides: &[String]) -> Result<HashMap<String, MemoEntry>> {
        let projection = self.projection(property)?;
        // The key a side's projection is kept under: the question, and whether its log-odds are calibrated.
        let question = match &projection {
            Some(q) => format!("{}\n{}\n{}", q.question, q.lead, if self.calibrated() { "calibrated" } else { "raw" }),
            // (Free answers stop at their first line's end, their confidence over it: those kept before, whose
            // confidence ran on over the text after it, are not read.)
            None => format!("{}#line", Self::map_question(property).0),
        };
        let identity = crate::under_model(&self.ctx, self.name.clone(), &self.config.model)?;
        let key = |s: &str| memo_key(&identity, &question, s);
        let mut known: HashMap<String, MemoEntry> = HashMap::new();
        let mut missing = Vec::new();
        for s in sides {
            match self.sides.get(&key(s)) {
                Some(e) => {
                    known.insert(s.clone(), e);
                }
                None => missing.push(s.clone()),
            }
        }
        if missing.is_empty() {
            return Ok(known);
        }
        let kv = kv_err(&self.name);
        let dec = crate::decoder(&self.ctx, &self.config.model, stretto_kv::convert::Weights::F32).map_err(&kv)?;
        let entry =
            |s: &str, score, value, confidence, seconds| MemoEntry { key: key(s), score, value, confidence, seconds };
        let entries: Vec<MemoEntry> = match &projection {
            Some(q) => {
                let (scores, secs) = stretto_kv::tasks::filter_scores_after(
                    &dec,
                    &self.source,
                    &missing,
                    &q.tokens,
                    (q.yes, q.no),
                    self.config.batch,
                )
                .map_err(&kv)?;
                // Calibrated as the model's filters are (a content-free item's lean subtracted), so that each side's
                // sign says which value it is.
                let base = if self.calibrated() {
                    let mut cache = self
                        .baselines
                        .lock()
                        .map_err(|_| CoreError::operator(&self.name, "calibration lock poisoned"))?;
                    match cache.get(&question) {
                        Some(b) => *b,
                        None => {
                            let free = [crate::llm::CONTENT_FREE.to_string()];
                            let (b, _) = stretto_kv::tasks::filter_scores_after(
                                &dec,
                                &self.source,
                                &free,
                                &q.tokens,
                                (q.yes, q.no),
                                1,
                            )
                            .map_err(&kv)?;
                            cache.insert(question.clone(), b[0]);
                            b[0]
                        }
                    }
                } else {
                    0.0
                };
                missing
                    .iter()
                    .zip(scores)
                    .zip(secs)
                    .map(|((s, v), t)| entry(s, Some(v - base), None, None, t))
                    .collect()
            }
            None => {
                let (question, label) = Self::map_question(property);
                let (answers, secs) = stretto_kv::tasks::map_answers(
                    &dec,
                    &self.source,
                    &missing,
                    &question,
                    &label,
                    self.config.max_tokens,
                    self.config.batch,
                )
                .map_err(&kv)?;
                missing
                    .iter()
                    .zip(answers)
                    .zip(secs)
                    .map(|((s, (text, conf)), t)| {
                        let value = side_value(&text);
                        let c = if value.is_some() { conf } else { 0.0 };
                        entry(s, None, value, Some(c), t)
                    })
                    .collect()
            }
        };
        for (s, e) in missing.iter().zip(&entries) {
            known.insert(s.clone(), e.clone());
        }
        self.sides.put(entries)?;
        Ok(known)
    }
}

/// (model, property) → the contrast question projecting a side onto the property's two values, `None` where the
/// model names none. Shared by every operator instance in the process, as the contrast filters' questions are.
type ProjectionCache = HashMap<(String, String), Option<ContrastQuestion>>;

fn projections() -> &'static Mutex<ProjectionCache> {
    static PROJECTIONS: std::sync::OnceLock<Mutex<ProjectionCache>> = std::sync::OnceLock::new();
    PROJECTIONS.get_or_init(Mutex::default)
}

/// A pair's score from its sides' projections onto a property's two values (each side's log-odds of the first
/// value over the second, read as a probability): the log-odds that the two sides take the same value (for
/// [`Relation::Same`]) or different ones (for [`Relation::Different`]).
pub fn polar_pair_score(relation: Relation, left: f64, right: f64) -> f64 {
    let (p, q) = (sigmoid(left), sigmoid(right));
    // The two sides take the same value with probability p q + (1 - p)(1 - q).
    // Clamped so that the score stays within the operator's score range (±10).
    let same = (p * q + (1.0 - p) * (1.0 - q)).clamp(4.6e-5, 1.0 - 4.6e-5);
    let want = if relation == Relation::Same { same } else { 1.0 - same };
    (want / (1.0 - want)).ln()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// A side's answer as compared: its first sentence, lower case, words only ("Positive." and "positive" agree, and
/// so do "Positive. The critic liked it" and "positive").
pub fn side_value(answer: &str) -> Option<String> {
    let line = answer.lines().map(str::trim).find(|l| !l.is_empty())?.to_lowercase();
    let line = line.split(['.', ';', '!', '?', '(']).next().unwrap_or_default();
    let words: Vec<&str> = line.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect();
    (!words.is_empty()).then(|| words.join(" "))
}

/// A pair's score from its sides' answers: the less confident answer's confidence, positive where the answers
/// relate as the predicate asks (equal for [`Relation::Same`], unequal for [`Relation::Different`]), negative where
/// they do not, 0 where a side has no answer.
pub fn pair_score(relation: Relation, left: (Option<&str>, f64), right: (Option<&str>, f64)) -> f64 {
    let (Some(l), Some(r)) = (left.0, right.0) else { return 0.0 };
    let weight = left.1.min(right.1).clamp(0.0, 1.0);
    let agree = (l == r) == (relation == Relation::Same);
    if agree {
        weight
    } else {
        -weight
    }
}

impl PhysicalOp for ProjectPair {
    fn name(&self) -> &str {
        &self.name
    }

    fn properties(&self) -> &OpProperties {
        &self.props
    }

    fn kv_cache_model(&self) -> Option<&str> {
        Some(&self.config.model)
    }

    fn reads_pairs(&self) -> bool {
        true
    }

    fn memoise(&self) -> bool {
        // Its work is per side, kept in its own store; a pair's answer is a comparison, and the cost it reports is
        // spread over the input it was shown, which a memoised answer would carry over to another input.
        false
    }

    fn observe_input(&self, task: &SemanticTask, items: &[String]) {
        self.fanout.observe(task, items);
    }

    fn is_gold_for(&self, task: &SemanticTask) -> bool {
        self.config.gold && comparison(&task.prompt).is_some()
    }

    fn accept(&self, task: &SemanticTask) -> Result<String> {
        // The answers depend on how a side is projected: they are memoised under the projection's question.
        let c = self.comparison_or_decline(task)?;
        let identity = match self.projection(&c.property)? {
            Some(q) => format!("{}#{:?}#{}#{}#{}", self.name, c.relation, q.question, q.lead, self.calibrated()),
            None => format!("{}#{:?}#{}", self.name, c.relation, Self::map_question(&c.property).0),
        };
        crate::under_model(&self.ctx, identity, &self.config.model)
    }

    fn evaluate_items(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
        let c = self.comparison_or_decline(task)?;
        let pairs = pairs_of(items, &self.name)?;
        let answers = self.side_answers(&c.property, &distinct_sides(&pairs))?;
        let start = Instant::now();
        let side =
            |s: &str| answers.get(s).map(|e| (e.value.as_deref(), e.confidence.unwrap_or(0.0), e.seconds, e.score));
        let mut scores = Vec::with_capacity(pairs.len());
        let mut seconds = Vec::with_capacity(pairs.len());
        for (l, r) in &pairs {
            let (Some(a), Some(b)) = (side(l), side(r)) else {
                return Err(CoreError::operator(&self.name, "a side was left without an answer"));
            };
            scores.push(match (a.3, b.3) {
                (Some(x), Some(y)) => polar_pair_score(c.relation, x, y),
                _ => pair_score(c.relation, (a.0, a.1), (b.0, b.1)),
            });
            // Each side's answer is paid once for all the pairs of the input that hold it.
            seconds.push(a.2 / self.fanout.of(task, l) + b.2 / self.fanout.of(task, r));
        }
        let compare = (start.elapsed().as_secs_f64() / pairs.len().max(1) as f64).max(1e-9);
        Ok((OpOutput::Scores(scores), seconds.into_iter().map(|s| s + compare).collect()))
    }
}

/// The `project-pair` rungs: every ladder model; the last is the reference of the predicates it serves.
pub fn project_pair_ladder(ctx: &OpContext) -> Vec<serde_json::Value> {
    let last = ctx.ladder.len().saturating_sub(1);
    ctx.ladder.iter().enumerate().map(|(i, m)| serde_json::json!({"model": m, "gold": i == last})).collect()
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: PROJECT_PAIR_FAMILY,
        plugin: crate::PLUGIN,
        about: "project, then join: where a join predicate compares one property of its two sides (the same / \
                opposite sentiment), the LLM names it once per side over the side's cached KV past and the pair's \
                score compares the answers; one rung per ladder model; declines other predicates",
        ladder: project_pair_ladder,
        build: |c, ctx| Ok(Arc::new(ProjectPair::new(parse_config(PROJECT_PAIR_FAMILY, c)?, ctx)?)),
    }
}

/// Configuration of an `embed-pair` filter.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedPairConfig {
    /// Sentence encoder.
    #[serde(default = "default_encoder")]
    pub model: String,
    /// Texts per encoder batch.
    #[serde(default = "default_embed_batch")]
    pub batch: usize,
}

fn default_encoder() -> String {
    "minilm".into()
}
fn default_embed_batch() -> usize {
    32
}

/// The cosine of the two sides' sentence embeddings.
#[derive(Debug)]
pub struct EmbedPair {
    name: String,
    props: OpProperties,
    config: EmbedPairConfig,
    ctx: OpContext,
    items: std::sync::OnceLock<Option<Memo>>,
    fanout: Fanout,
}

/// Family of the embedding pair filters.
pub const EMBED_PAIR_FAMILY: &str = "embedding-pair-filter";

impl EmbedPair {
    /// Builds the operator (cheap: the encoder loads on first use).
    pub fn new(config: EmbedPairConfig, ctx: &OpContext) -> Result<Self> {
        stretto_kv::prepare::check_encoder_name(&ctx.model_home, &config.model)
            .map_err(|e| CoreError::OperatorConfig { factory: EMBED_PAIR_FAMILY.into(), message: e.to_string() })?;
        Ok(Self {
            name: format!("embed-pair:{}", config.model),
            props: OpProperties {
                kind: LogicalKind::Filter,
                family: EMBED_PAIR_FAMILY.into(),
                modality: Modality::Text,
                model: Some(config.model.clone()),
                compression: None,
                tunable: true,
                gold: false,
                cost_hint: 0.008,
                score_range: (-1.0, 1.0),
            },
            config,
            ctx: ctx.clone(),
            items: std::sync::OnceLock::new(),
            fanout: Fanout::default(),
        })
    }
}

impl PhysicalOp for EmbedPair {
    fn name(&self) -> &str {
        &self.name
    }

    fn properties(&self) -> &OpProperties {
        &self.props
    }

    fn reads_pairs(&self) -> bool {
        true
    }

    fn memoise(&self) -> bool {
        // Its work is per side, kept in its own store; a pair's answer is a comparison, and the cost it reports is
        // spread over the input it was shown, which a memoised answer would carry over to another input.
        false
    }

    fn observe_input(&self, task: &SemanticTask, items: &[String]) {
        self.fanout.observe(task, items);
    }

    fn evaluate_items(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
        let pairs = pairs_of(items, &self.name)?;
        let sides = distinct_sides(&pairs);
        // Likeness is what the cosine measures: for a predicate that asks the sides to differ, unlike sides score
        // higher.
        let sign = match comparison(&task.prompt) {
            Some(Comparison { relation: Relation::Different, .. }) => -1.0,
            _ => 1.0,
        };
        // The embedding filter's own store of item embeddings: a side embedded for either is embedded for both.
        let store = self.items.get_or_init(|| self.ctx.open_memo(&format!("embed:{}.items", self.config.model)));
        let (vecs, secs) =
            crate::embedding::embed_cached(&self.ctx, &self.config.model, store.as_ref(), &sides, self.config.batch)?;
        let at: HashMap<&str, usize> = sides.iter().enumerate().map(|(i, s)| (s.as_str(), i)).collect();
        let mut scores = Vec::with_capacity(pairs.len());
        let mut seconds = Vec::with_capacity(pairs.len());
        for (l, r) in &pairs {
            let (a, b) = (at[l.as_str()], at[r.as_str()]);
            scores.push(sign * stretto_kv::embed::cosine(&vecs[a], &vecs[b]) as f64);
            seconds.push(secs[a] / self.fanout.of(task, l) + secs[b] / self.fanout.of(task, r) + 1e-9);
        }
        Ok((OpOutput::Scores(scores), seconds))
    }
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: EMBED_PAIR_FAMILY,
        plugin: crate::PLUGIN,
        about: "cosine of the sentence embeddings of a semantic join's two sides (each side embedded once), one \
                rung per encoder",
        ladder: |ctx| ctx.encoders.iter().map(|m| serde_json::json!({"model": m})).collect(),
        build: |c, ctx| Ok(Arc::new(EmbedPair::new(parse_config(EMBED_PAIR_FAMILY, c)?, ctx)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_become_the_first_and_the_second_text() {
        assert_eq!(
            about_the_pair("{r1.text} and {r2.text} agree, says {r1.author}", "A", "B"),
            "A and B agree, says A"
        );
    }

    #[test]
    fn comparisons_of_one_property_are_read_and_others_are_not() {
        let c = |p: &str| comparison(p).map(|c| (c.property, c.relation));
        let same = |p: &str| Some((p.to_string(), Relation::Same));
        let diff = |p: &str| Some((p.to_string(), Relation::Different));
        assert_eq!(c("{r1.t} and {r2.t} express the same sentiment"), same("sentiment"));
        assert_eq!(c("{r1.t} and {r2.t} express opposite sentiments"), diff("sentiment"));
        assert_eq!(c("{a.t} and {b.t} have a different genre"), diff("genre"));
        assert_eq!(c("{a.t} differs from {b.t} in tone"), diff("tone"));
        assert_eq!(c("{a.t} and {b.t} share the same overall sentiment."), same("overall sentiment"));
        assert_eq!(c("The sentiment of {a.t} is the same as the sentiment of {b.t}"), same("sentiment"));
        assert_eq!(c("{a.t} and {b.t} are of the same class"), same("class"));
        assert_eq!(c("The sentiment of {a.t} is the same as that of {b.t}"), same("sentiment"));
        assert_eq!(c("{a.t} has the same sentiment as {b.t}"), same("sentiment"));
        assert_eq!(c("{a.t} and {b.t} have the same status"), same("status"));
        // Negated, no property, a property with words left over, two comparisons, or one side only: no comparison.
        assert_eq!(c("{a.t} and {b.t} do not express the same sentiment"), None);
        assert_eq!(c("{a.t} and {b.t} don't share a topic"), None);
        assert_eq!(c("{a.t} and {b.t} cannot share a genre"), None);
        assert_eq!(c("{a.t} is the same as {b.t}"), None);
        assert_eq!(c("{a.t} is the opposite of {b.t}"), None);
        assert_eq!(c("{a.t} is identical to {b.t} in terms of sentiment"), None);
        assert_eq!(c("{a.t} and {b.t} give the same number of stars"), None);
        assert_eq!(c("{a.t} and {b.t} express the same sentiment about the same movie"), None);
        assert_eq!(c("{a.t} and {b.t} express the same sentiment but mention different actors"), None);
        assert_eq!(c("{a.t}'s sentiment is the same as {b.t}'s"), None);
        assert_eq!(c("{a.t} is an item of {b.kind}"), None);
        assert_eq!(c("{a.t} has the same sentiment as the rest"), None);
    }

    #[test]
    fn a_pair_scores_its_sides_agreement_by_the_less_sure_side() {
        let (p, n) = (Some("positive"), Some("negative"));
        assert_eq!(pair_score(Relation::Same, (p, 0.9), (p, 0.6)), 0.6);
        assert_eq!(pair_score(Relation::Same, (p, 0.9), (n, 0.8)), -0.8);
        assert_eq!(pair_score(Relation::Different, (p, 0.9), (n, 0.8)), 0.8);
        assert_eq!(pair_score(Relation::Different, (p, 0.7), (p, 0.95)), -0.7);
        assert_eq!(pair_score(Relation::Same, (None, 0.0), (p, 0.9)), 0.0);
        // Projections onto two values: sure sides that agree make a sure "same", and one unsure side an unsure pair.
        let (sure_same, unsure) =
            (polar_pair_score(Relation::Same, 4.0, 5.0), polar_pair_score(Relation::Same, 4.0, 0.1));
        assert!(sure_same > 3.0 && unsure.abs() < 0.2, "{sure_same} {unsure}");
        assert!(polar_pair_score(Relation::Same, 4.0, -4.0) < -3.0);
        assert!(
            (polar_pair_score(Relation::Different, 2.0, -3.0) + polar_pair_score(Relation::Same, 2.0, -3.0)).abs()
                < 1e-9
        );
        assert_eq!(polar_pair_score(Relation::Same, 1.5, -0.5), polar_pair_score(Relation::Same, -0.5, 1.5));
        assert_eq!(side_value(" Positive.\nmore"), Some("positive".into()));
        assert_eq!(side_value("Very positive. The critic loved it"), Some("very positive".into()));
        assert_eq!(side_value("  \n"), None);
    }

    #[test]
    fn a_side_in_many_pairs_is_priced_once_over_all_of_them() {
        let task = SemanticTask::filter("j", "{a.t} and {b.t} express the same sentiment");
        let f = Fanout::default();
        let items: Vec<String> =
            [("x", "y"), ("x", "z"), ("y", "x")].iter().map(|(l, r)| stretto_core::op::pair_item(l, r)).collect();
        f.observe(&task, &items);
        assert_eq!((f.of(&task, "x"), f.of(&task, "y"), f.of(&task, "z")), (3.0, 2.0, 1.0));
        assert_eq!(f.of(&task, "never shown"), 1.0);
        assert_eq!(f.of(&SemanticTask::filter("k", "{a.t} is x"), "x"), 1.0);
    }
}
