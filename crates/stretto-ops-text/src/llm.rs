//! LLM filter and map operators over precomputed KV caches: one physical operator per (model, compression ratio).
//!
//! The item (the referenced columns) is the cached past; the question appends the predicate or instruction, with
//! its column references written as "the text above". A filter scores the log-odds of its model's answer protocol
//! (a model setting in the catalog, chosen by measurement: '1' over '0', " Yes" over " No", or the contrast
//! question below, with Yes/No for a predicate that has no derivable opposite), calibrated where
//! the protocol says by those of a content-free item ("N/A") so that its sign means something for small models
//! ([`stretto_kv::models::FilterProtocol`]); a map decodes
//! greedily and reports the answer's probability as its confidence, normalised to the output type.
//!
//! A *contrast* filter (`llm-contrast:…`, its own family) asks the same model to choose between the predicate and
//! an opposite the model derives itself, and scores the first answer token of one against the other
//! ([`stretto_kv::contrast`]). Small models that cannot map a judgement onto '1'/'0' often can onto words that
//! carry it: SmolLM2-135M's "is clearly positive" on movie reviews goes from AUC 0.57 to 0.80. Where the model
//! derives no usable opposite, the contrast filter declines the task ([`CoreError::NotApplicable`]) rather than
//! repeat the '1'/'0' filter under another name, and planners drop it from that task's candidates.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use stretto_core::context::MemoPolicy;
use stretto_core::op::{
    parse_config, LogicalKind, Modality, OpOutput, OpProperties, OperatorFactory, PhysicalOp, SemanticTask, ValueType,
};
use stretto_core::{CoreError, OpContext, Result};
use stretto_kv::cache::PastSource;
use stretto_kv::choice::closed_choices;
use stretto_kv::contrast::ContrastQuestion;
use stretto_kv::convert::Weights;
use stretto_kv::models::{AnswerWords, FilterProtocol};
use stretto_kv::press::{Positions, Press};
use stretto_kv::store::Profile;

use crate::normalize::{map_identity, normalize};

/// Configuration of an LLM operator.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// Catalog decoder model.
    pub model: String,
    /// KV compression ratio in [0, 1).
    #[serde(default)]
    pub ratio: f64,
    /// Press name (`expected-attention`, `key-norm`, `streaming`); default: expected-attention, or key-norm for a
    /// model whose graph returns no query statistics (a Hugging Face export), which expected-attention needs.
    #[serde(default)]
    pub press: Option<String>,
    /// Re-rotate kept keys.
    #[serde(default)]
    pub rerotate: bool,
    /// Items per decoder batch.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// Most tokens a map answer may take.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// KV cache directory (default: the context's).
    #[serde(default)]
    pub kv_dir: Option<PathBuf>,
    /// Whether this rung is its family's reference (gold candidate).
    #[serde(default)]
    pub gold: bool,
    /// A filter's answer protocol (`digits`, `digits-raw`, `yes-no`, `yes-no-raw`, `contrast`, `contrast-raw`):
    /// default, the catalog's setting for the model ([`stretto_kv::models::filter_protocol`]).
    #[serde(default)]
    pub protocol: Option<String>,
    /// The decoder's linear weights: `f32` (default), `int8` (8-bit `MatMulNBits`) or `int8-dyn` (8-bit weights and
    /// dynamically quantized 8-bit activations but for the down-projection), converted on first use. A quantized
    /// rung reads the caches its f32 model prefills and is never gold.
    #[serde(default)]
    pub weights: Weights,
}

fn default_batch() -> usize {
    8
}
fn default_max_tokens() -> usize {
    12
}

/// The rungs: every ladder model of the context at ratios 0, 0.5 and 0.8; the last (largest) model uncompressed is
/// the gold candidate. Caches are compressed with the expected-attention press, or key-norm for a model whose graph
/// returns no query statistics (a Hugging Face export). With the context's `int8_rungs`, every catalog model also
/// gets its two weight-quantized rungs, uncompressed: `int8` (8-bit `MatMulNBits` weights) and `int8-dyn` (8-bit
/// activations too, but for the down-projection). Neither is offered by default: Qwen2.5-Coder-1.5B's `int8-dyn`
/// clears the per-item bar (about 2x faster than f32 with its decisions kept, `bench/results/quant/int8-dyn/`), but
/// offering it made the small scale's labelled movie queries dearer end to end (`bench/results/totals/int8-dyn/`).
pub fn ladder(ctx: &OpContext) -> Vec<serde_json::Value> {
    let models = &ctx.ladder;
    let last = models.len().saturating_sub(1);
    let mut out = Vec::new();
    // (Each rung's press is the model's default, [`default_press`].)
    for (i, m) in models.iter().enumerate() {
        for ratio in [0.0, 0.5, 0.8] {
            out.push(serde_json::json!({"model": m, "ratio": ratio, "gold": i == last && ratio == 0.0}));
        }
        if ctx.int8_rungs && stretto_kv::models::spec(m).is_ok() {
            for weights in Weights::QUANTIZED {
                out.push(serde_json::json!({"model": m, "ratio": 0.0, "weights": weights}));
            }
        }
    }
    out
}

/// An LLM filter or map at one cache profile.
#[derive(Debug)]
pub struct LlmOp {
    name: String,
    props: OpProperties,
    config: LlmConfig,
    ctx: OpContext,
    source: PastSource,
    bridge: Option<Bridge>,
    /// Calibration log-odds per question: one question pass each, not one per batch.
    baselines: Mutex<HashMap<String, f64>>,
    /// Whether filters ask a contrastive question instead of the protocol's.
    contrastive: bool,
    /// How a filter outside the contrast family asks its question.
    protocol: FilterProtocol,
}

/// (model, subject, statement) → contrastive question.
type ContrastCache = HashMap<(String, String, String), Option<ContrastQuestion>>;

/// Contrastive questions per (model, subject, statement), `None` where the model gave no usable opposite. Shared by
/// every operator instance in the process: a registry is built per query, and a derivation with the 0.5B coder
/// takes seconds.
fn contrasts() -> &'static Mutex<ContrastCache> {
    static CONTRASTS: OnceLock<Mutex<ContrastCache>> = OnceLock::new();
    CONTRASTS.get_or_init(Mutex::default)
}

/// Turns items that are not text (image paths) into the text an LLM reads, with the seconds each took.
pub type ItemTransform = Arc<dyn Fn(&[String]) -> Result<(Vec<String>, Vec<f64>)> + Send + Sync>;

/// How a bridged LLM operator sees its items: the transform, and how questions refer to the item.
#[derive(Clone)]
pub struct Bridge {
    /// Items → texts.
    pub transform: ItemTransform,
    /// What a column reference becomes in the question ("the photo described above").
    pub subject: &'static str,
    /// Operator-name prefix and family.
    pub family: &'static str,
    /// Modality of the items.
    pub modality: Modality,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge").field("family", &self.family).field("subject", &self.subject).finish()
    }
}

/// The press a rung of `model` compresses with when its configuration names none: expected-attention, or key-norm
/// for a model whose graph returns no query statistics (a Hugging Face export), which expected-attention needs. The
/// engine's cache step, the pair operators and the caption rungs choose the same way, so they share records.
pub fn default_press(ctx: &OpContext, model: &str) -> Press {
    if stretto_kv::prepare::has_query_stats(&ctx.model_home, model) {
        Press::ExpectedAttention
    } else {
        Press::KeyNorm
    }
}

impl LlmOp {
    /// Builds the operator (cheap: models load on first evaluation).
    pub fn new(kind: LogicalKind, config: LlmConfig, ctx: &OpContext) -> Result<Self> {
        let bad = |m: String| CoreError::OperatorConfig { factory: family(kind).into(), message: m };
        stretto_kv::prepare::check_decoder_name(&ctx.model_home, &config.model).map_err(|e| bad(e.to_string()))?;
        if !(0.0..1.0).contains(&config.ratio) {
            return Err(bad(format!("ratio {} is outside [0, 1)", config.ratio)));
        }
        let press = match &config.press {
            Some(p) => Press::parse(p).map_err(|e| bad(e.to_string()))?,
            None => default_press(ctx, &config.model),
        };
        let protocol = match &config.protocol {
            Some(p) => FilterProtocol::parse(p).map_err(|e| bad(e.to_string()))?,
            None => stretto_kv::models::filter_protocol(&config.model),
        };
        let profile = Profile {
            model: config.model.clone(),
            press,
            ratio: config.ratio,
            positions: if config.rerotate { Positions::Rerotate } else { Positions::Keep },
        };
        if config.gold && config.weights != Weights::F32 {
            return Err(bad("an int8-weight rung cannot be gold: gold is its f32 model".into()));
        }
        let prefix = if kind == LogicalKind::Filter { "llm" } else { "llm-map" };
        let name = format!("{prefix}:{}", rung_id(&profile, config.weights));
        let per_item = if config.model.contains("1.5b") {
            1.4
        } else if config.model.contains("0.5b") {
            0.45
        } else {
            0.05
        };
        // A prior, replaced by profiled costs: the probe's bare question pass took about half the f32 time; the
        // operator as a whole measured 0.66-0.83x of f32 (`stretto bench quant`, bench/results/quant/).
        let per_item = match config.weights {
            Weights::F32 => per_item,
            Weights::Int8 => per_item * 0.55,
            Weights::Int8Dyn => per_item * 0.5,
        };
        let props = OpProperties {
            kind,
            family: family(kind).into(),
            modality: Modality::Text,
            model: Some(config.model.clone()),
            compression: Some(config.ratio),
            tunable: true,
            gold: config.gold,
            cost_hint: per_item * (1.0 - 0.2 * config.ratio),
            score_range: if kind == LogicalKind::Filter { (-10.0, 10.0) } else { (0.0, 1.0) },
        };
        let kv_dir = config.kv_dir.clone().unwrap_or_else(|| ctx.kv_dir.clone());
        let mut source = PastSource::new(profile, kv_dir.clone())
            .with_budget(
                stretto_kv::budget::shared(&kv_dir, ctx.memo_dir(), ctx.disk_budget).map_err(|e| bad(e.to_string()))?,
            )
            .with_memory_budget(ctx.memory_budget.unwrap_or(stretto_kv::decoder::DEFAULT_MEMORY_BUDGET));
        if config.weights != Weights::F32 {
            // The same pasts as the f32 rungs: only the question pass runs on the quantized weights.
            let (ctx, model) = (ctx.clone(), config.model.clone());
            source = source.with_prefill(Arc::new(move || crate::decoder(&ctx, &model, Weights::F32)));
        }
        Ok(Self {
            name,
            props,
            source,
            config,
            ctx: ctx.clone(),
            bridge: None,
            baselines: Mutex::default(),
            contrastive: false,
            protocol,
        })
    }

    /// A contrast filter ([`stretto_kv::contrast`]): the model chooses between the predicate and its opposite.
    pub fn contrastive(config: LlmConfig, ctx: &OpContext) -> Result<Self> {
        let mut op = Self::new(LogicalKind::Filter, config, ctx)?;
        op.name = format!("llm-contrast:{}", rung_id(op.source.profile(), op.config.weights));
        op.props.family = CONTRAST_FAMILY.into();
        op.contrastive = true;
        Ok(op)
    }

    /// An LLM operator over items that a bridge first turns into text (e.g. an image into its caption).
    pub fn bridged(kind: LogicalKind, config: LlmConfig, bridge: Bridge, ctx: &OpContext) -> Result<Self> {
        let mut op = Self::new(kind, config, ctx)?;
        let suffix = if kind == LogicalKind::Filter { "" } else { "-map" };
        op.name = format!("{}{suffix}:{}", bridge.family, rung_id(op.source.profile(), op.config.weights));
        op.props.family = format!("{}{}", bridge.family, if kind == LogicalKind::Filter { "-filter" } else { "-map" });
        op.props.modality = bridge.modality;
        op.bridge = Some(bridge);
        Ok(op)
    }

    /// How its filter asks: the configured protocol, else the catalog's for its model.
    pub fn protocol(&self) -> FilterProtocol {
        self.protocol
    }

    /// The log-odds of the content-free item for question tokens `q` (named `key`), computed once per question.
    fn baseline(&self, dec: &stretto_kv::Decoder, key: &str, q: &[u32], answers: (u32, u32)) -> Result<f64> {
        let mut cache =
            self.baselines.lock().map_err(|_| CoreError::operator(&self.name, "calibration lock poisoned"))?;
        if let Some(b) = cache.get(key) {
            return Ok(*b);
        }
        let (base, _) =
            stretto_kv::tasks::filter_scores_after(dec, &self.source, &[CONTENT_FREE.to_string()], q, answers, 1)
                .map_err(kv_err(&self.name))?;
        cache.insert(key.to_string(), base[0]);
        Ok(base[0])
    }

    /// The contrastive question for `statement` (about `subject`), derived once per model and statement.
    ///
    /// The derivation always runs on the f32 model, whatever this rung's weights: the question is then the same
    /// for every rung of the model (an int8 rung and its f32 gold ask alike), whichever derives it first.
    fn contrast(&self, subject: &str, statement: &str) -> Result<Option<ContrastQuestion>> {
        let mut cache = contrasts().lock().map_err(|_| CoreError::operator(&self.name, "contrast lock poisoned"))?;
        let key = (self.config.model.clone(), subject.to_string(), statement.to_string());
        if let Some(c) = cache.get(&key) {
            return Ok(c.clone());
        }
        let kv = kv_err(&self.name);
        let dec = crate::decoder(&self.ctx, &self.config.model, Weights::F32).map_err(&kv)?;
        // Kept beside the memoised answers, so that a later query asking the same contrast does not derive it again.
        let dir = match &self.ctx.memo {
            MemoPolicy::Dir(dir) => Some(dir.as_path()),
            MemoPolicy::Off => None,
        };
        let question = stretto_kv::contrast::derive_question_kept(&dec, dir, subject, statement).map_err(&kv)?;
        match &question {
            Some(q) => tracing::info!(op = %self.name, question = %q.question, lead = %q.lead, "contrastive question"),
            None => tracing::info!(op = %self.name, statement, "the model derived no usable opposite"),
        }
        cache.insert(key, question.clone());
        Ok(question)
    }

    /// What column references become in its questions.
    fn subject(&self) -> &'static str {
        self.bridge.as_ref().map_or(stretto_kv::tasks::TEXT_SUBJECT, |b| b.subject)
    }

    /// The contrast filter's question for `statement`, or [`CoreError::NotApplicable`] without an opposite:
    /// this operator would then only repeat the '1'/'0' filter of the same rung.
    fn contrast_or_decline(&self, statement: &str) -> Result<ContrastQuestion> {
        self.contrast(self.subject(), statement)?.ok_or_else(|| CoreError::NotApplicable {
            operator: self.name.clone(),
            reason: format!("{} derives no usable opposite of \"{statement}\"", self.config.model),
        })
    }

    /// Calibrated filter scores of `todo` for `statement` (by `contrast` where given), with the seconds each took.
    fn filter(
        &self,
        dec: &stretto_kv::Decoder,
        statement: &str,
        contrast: Option<ContrastQuestion>,
        todo: &[String],
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        let kv = kv_err(&self.name);
        // The contrast family always calibrates; a contrast protocol as its protocol says.
        let calibrated_contrast = self.contrastive || self.protocol.calibrated;
        let (key, q, answers, calibrated) = match contrast {
            Some(c) => (format!("{}\n{}", c.question, c.lead), c.tokens, (c.yes, c.no), calibrated_contrast),
            None => {
                let asked = self.protocol.fallback();
                let p = stretto_kv::tasks::filter_prompt_about(dec, asked, self.subject(), statement).map_err(&kv)?;
                (p.text, p.tokens, p.answers, asked.calibrated)
            }
        };
        let (scores, secs) =
            stretto_kv::tasks::filter_scores_after(dec, &self.source, todo, &q, answers, self.config.batch)
                .map_err(&kv)?;
        if !calibrated {
            return Ok((scores, secs));
        }
        // Contextual calibration: small models lean to one answer whatever the item; the log-odds of a content-free
        // item measure that lean, and subtracting it centres the gold rule (score > 0).
        let base = self.baseline(dec, &key, &q, answers)?;
        Ok((scores.into_iter().map(|s| s - base).collect(), secs))
    }

    /// The task's prompt as the model reads it: column references become the item's subject.
    fn question(&self, task: &SemanticTask) -> String {
        match &self.bridge {
            Some(b) => about(&task.prompt, b.subject),
            None => about_the_text(&task.prompt),
        }
    }

    /// The context's shared copy of this operator's model.
    fn decoder(&self) -> Result<Arc<stretto_kv::Decoder>> {
        crate::decoder(&self.ctx, &self.config.model, self.config.weights).map_err(kv_err(&self.name))
    }
}

/// A rung's name after its family: the cache profile, and `+int8` for quantized weights.
fn rung_id(profile: &Profile, weights: Weights) -> String {
    match weights {
        Weights::F32 => profile.id(),
        w => format!("{}+{}", profile.id(), w.as_str()),
    }
}

fn family(kind: LogicalKind) -> &'static str {
    if kind == LogicalKind::Filter {
        "llm-filter"
    } else {
        "llm-map"
    }
}

/// The content-free item whose log-odds calibrate a filter question.
pub const CONTENT_FREE: &str = "N/A";

/// The prompt with every `{table.column}` written as "the text above".
pub fn about_the_text(prompt: &str) -> String {
    about(prompt, "the text above")
}

/// The prompt with every `{table.column}` written as `subject`.
pub fn about(prompt: &str, subject: &str) -> String {
    let mut out = String::with_capacity(prompt.len());
    let mut depth = 0usize;
    for c in prompt.chars() {
        match c {
            '{' => {
                if depth == 0 {
                    out.push_str(subject);
                }
                depth += 1;
            }
            '}' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

fn kv_err(name: &str) -> impl Fn(stretto_kv::KvError) -> CoreError + '_ {
    move |e| CoreError::operator_failed(name, e)
}

impl PhysicalOp for LlmOp {
    fn name(&self) -> &str {
        &self.name
    }

    fn properties(&self) -> &OpProperties {
        &self.props
    }

    fn kv_cache_model(&self) -> Option<&str> {
        // A bridged operator caches what its bridge makes of the item (a caption), built as it goes.
        self.bridge.is_none().then_some(self.config.model.as_str())
    }

    fn weights_variant(&self) -> Option<&str> {
        (self.config.weights != Weights::F32).then_some(self.config.weights.as_str())
    }

    fn accept(&self, task: &SemanticTask) -> Result<String> {
        let mut identity = self.identity(task)?;
        // int8-dyn's answers depend on the code range this CPU's conversion has (7-bit without VNNI): answers of
        // the other range, or of conversions made before 7-bit codes existed, are never read for them.
        if self.config.weights == Weights::Int8Dyn && stretto_kv::convert::int8_dyn_code_max() < 127 {
            identity.push_str("~codes7");
        }
        // Whatever the task, the answers depend on the system prompt every item's past starts with.
        crate::under_model(&self.ctx, identity, &self.config.model)
    }

    fn evaluate_items(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
        self.answer(task, items)
    }
}

impl LlmOp {
    /// What its answers to `task` are memoised under, but for the system prompt and the registration
    /// ([`crate::under_model`]).
    fn identity(&self, task: &SemanticTask) -> Result<String> {
        // A contrast filter's answers depend on the question its model derived, so they are memoised under it: a
        // changed derivation never reads answers to another question. Without an opposite, it declines.
        if self.contrastive && task.kind == LogicalKind::Filter {
            let c = self.contrast_or_decline(&self.question(task))?;
            return Ok(format!("{}#{}#{}", self.name, c.question, c.lead));
        }
        // Under a contrast protocol, the same: answers are kept under the derived question, or under the protocol
        // the filter falls back to where there is none.
        if task.kind == LogicalKind::Filter && self.protocol.answers == AnswerWords::Contrast {
            return Ok(match self.contrast(self.subject(), &self.question(task))? {
                Some(c) => format!("{}#{}#{}#{}", self.name, self.protocol, c.question, c.lead),
                None => self.fixed_words(format!("{}#{}", self.name, self.protocol.fallback())),
            });
        }
        // A filter's answers depend on its protocol: answers memoised under another protocol are never read. The
        // default protocol keeps the bare name, which answers memoised before protocols existed were stored under.
        if task.kind == LogicalKind::Filter && self.protocol != FilterProtocol::DEFAULT {
            return Ok(self.fixed_words(format!("{}#{}", self.name, self.protocol)));
        }
        if task.kind == LogicalKind::Filter {
            return Ok(self.fixed_words(self.name.clone()));
        }
        // A closed-choice map answers by walking its choices, not by free generation: its answers are kept apart
        // from free answers memoised before choices were read. A free answer stops at its first line's end
        // ([`stretto_kv::decoder::Decoder::generate_line`]), its confidence the product over that line: free answers
        // memoised before, whose confidence ran on over up to `max_tokens` of text after it, are not read.
        if task.kind == LogicalKind::Map {
            let question = self.question(task);
            return Ok(match stretto_kv::choice::closed_choices(&question) {
                Some(_) => map_identity(&self.name, &question),
                None => format!("{}#line", self.name),
            });
        }
        Ok(self.name.clone())
    }

    /// The identity of a filter asked a fixed-words question ('1'/'0' or Yes/No). A bridged filter's instruction
    /// names its subject ("Answer the question about the photo described above…"), where it once said "the text
    /// above" whatever the item: its answers are kept under that subject, so none asked the old way is read.
    fn fixed_words(&self, identity: String) -> String {
        match &self.bridge {
            Some(b) => format!("{identity}#about {}", b.subject),
            None => identity,
        }
    }

    /// Its answers to `task` on `items`, with the seconds each took.
    fn answer(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
        let question = self.question(task);
        let dec = self.decoder()?;
        let contrast = if self.contrastive && task.kind == LogicalKind::Filter {
            Some(self.contrast_or_decline(&question)?)
        } else if self.protocol.answers == AnswerWords::Contrast && task.kind == LogicalKind::Filter {
            // None: the fallback protocol's question (see `filter`).
            self.contrast(self.subject(), &question)?
        } else {
            None
        };
        let (todo, bridge_secs) = match &self.bridge {
            Some(b) => (b.transform)(items)?,
            None => (items.to_vec(), vec![0.0; items.len()]),
        };
        let add = |secs: Vec<f64>| -> Vec<f64> { secs.iter().zip(&bridge_secs).map(|(a, b)| a + b).collect() };
        match task.kind {
            LogicalKind::Filter => {
                let (scores, secs) = self.filter(&dec, &question, contrast, &todo)?;
                Ok((OpOutput::Scores(scores), add(secs)))
            }
            LogicalKind::Map => {
                let ty = task.output.as_ref().map(|o| o.1).unwrap_or(ValueType::String);
                let label = stretto_kv::tasks::field_label(task.output.as_ref().map_or("answer", |o| o.0.as_str()));
                let q = stretto_kv::tasks::map_question(&question);
                if let Some(choices) = closed_choices(&question) {
                    let (picked, secs) = stretto_kv::tasks::choice_answers(
                        &dec,
                        &self.source,
                        &todo,
                        &q,
                        &label,
                        &choices,
                        self.config.batch,
                    )
                    .map_err(kv_err(&self.name))?;
                    // A choice is an answer even where it normalises to no value ('none'): its probability stays,
                    // so a cascade can trust a confident "none".
                    let (values, confidences) =
                        picked.into_iter().map(|(c, p)| (normalize(&choices[c], ty), p)).unzip();
                    return Ok((OpOutput::Values { values, confidences }, add(secs)));
                }
                let (answers, secs) = stretto_kv::tasks::map_answers(
                    &dec,
                    &self.source,
                    &todo,
                    &q,
                    &label,
                    self.config.max_tokens,
                    self.config.batch,
                )
                .map_err(kv_err(&self.name))?;
                let (values, confidences) = answers
                    .into_iter()
                    .map(|(text, conf)| {
                        let v = normalize(&text, ty);
                        let c = if v.is_some() { conf } else { 0.0 };
                        (v, c)
                    })
                    .unzip();
                Ok((OpOutput::Values { values, confidences }, add(secs)))
            }
        }
    }
}

fn build(kind: LogicalKind, config: &serde_json::Value, ctx: &OpContext) -> Result<Arc<dyn PhysicalOp>> {
    Ok(Arc::new(LlmOp::new(kind, parse_config(family(kind), config)?, ctx)?))
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "llm-filter",
        plugin: crate::PLUGIN,
        about: "LLM filter over precomputed KV caches (log-odds of the model's answer protocol: '1' over '0', Yes \
                over No, or the contrast question), one rung per model and ratio",
        ladder,
        build: |c, ctx| build(LogicalKind::Filter, c, ctx),
    }
}

/// Family of the contrast filters.
pub const CONTRAST_FAMILY: &str = "llm-contrast-filter";

/// The contrast filter's rungs: every ladder model whose own filter protocol is not already the contrast question
/// (its `llm-filter` rungs ask that question already, calibrated as its protocol says and with Yes/No where there is
/// no opposite, where this family would always calibrate and decline instead), uncompressed. None is a gold candidate: gold stays the filter question
/// of the model's protocol, as the method specifies. Compressed contrast filters can be built from a configuration.
pub fn contrast_ladder(ctx: &OpContext) -> Vec<serde_json::Value> {
    ctx.ladder
        .iter()
        .filter(|m| stretto_kv::models::filter_protocol(m).answers != AnswerWords::Contrast)
        .map(|m| serde_json::json!({"model": m, "ratio": 0.0}))
        .collect()
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: CONTRAST_FAMILY,
        plugin: crate::PLUGIN,
        about: "LLM filter over precomputed KV caches that chooses between the predicate and an opposite the model \
                derives (log-odds of their first differing answer tokens), one rung per model; declines predicates \
                without a usable opposite",
        ladder: contrast_ladder,
        build: |c, ctx| Ok(Arc::new(LlmOp::contrastive(parse_config(CONTRAST_FAMILY, c)?, ctx)?)),
    }
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "llm-map",
        plugin: crate::PLUGIN,
        about: "LLM map over precomputed KV caches (greedy answer, its probability as confidence)",
        ladder,
        build: |c, ctx| build(LogicalKind::Map, c, ctx),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_become_the_text_above() {
        assert_eq!(about_the_text("{reviews.reviewtext} is clearly positive"), "the text above is clearly positive");
        assert_eq!(about_the_text("Extract the [title] in {a.b}"), "Extract the [title] in the text above");
    }

    #[test]
    fn bad_configs_are_typed_errors() {
        let ctx = OpContext::new("/nonexistent-home");
        let build = |kind, c: &serde_json::Value| build(kind, c, &ctx);
        let e = build(LogicalKind::Filter, &serde_json::json!({"model": "gpt-9"})).unwrap_err().to_string();
        assert!(e.contains("unknown model"), "{e}");
        let e = build(LogicalKind::Filter, &serde_json::json!({"model": "smollm2-135m", "ratio": 1.0}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside"), "{e}");
        let e = build(LogicalKind::Map, &serde_json::json!({"model": "smollm2-135m", "press": "x"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown press"), "{e}");
        let op = build(LogicalKind::Filter, &serde_json::json!({"model": "smollm2-135m", "ratio": 0.5})).unwrap();
        assert_eq!(op.name(), "llm:smollm2-135m@expected-attention-0.50");
    }

    #[test]
    fn int8_rungs_offer_both_quantized_variants_of_every_catalog_model_and_none_is_gold() {
        let mut ctx = OpContext::new("/nonexistent-home");
        ctx.ladder = vec!["smollm2-135m".into(), "qwen2.5-coder-1.5b".into()];
        let rungs = |ctx: &OpContext| -> Vec<(String, bool)> {
            ladder(ctx)
                .iter()
                .map(|c| (build(LogicalKind::Filter, c, ctx).unwrap().name().to_string(), c["gold"] == true))
                .collect()
        };
        let quantized = |rungs: &[(String, bool)]| -> Vec<String> {
            rungs.iter().filter(|(n, _)| n.contains('+')).map(|(n, _)| n.clone()).collect()
        };
        // By default, f32 rungs only.
        let default = rungs(&ctx);
        assert_eq!(default.len(), 6, "{default:?}");
        assert!(quantized(&default).is_empty(), "{default:?}");
        ctx.int8_rungs = true;
        let all = rungs(&ctx);
        assert_eq!(
            quantized(&all),
            [
                "llm:smollm2-135m@expected-attention-0.00+int8",
                "llm:smollm2-135m@expected-attention-0.00+int8-dyn",
                "llm:qwen2.5-coder-1.5b@expected-attention-0.00+int8",
                "llm:qwen2.5-coder-1.5b@expected-attention-0.00+int8-dyn",
            ]
        );
        let gold: Vec<&String> = all.iter().filter(|(_, g)| *g).map(|(n, _)| n).collect();
        assert_eq!(gold, ["llm:qwen2.5-coder-1.5b@expected-attention-0.00"], "gold stays the f32 model");
    }
}
