//! Embedding filter: cosine similarity of sentence embeddings (MiniLM by default, MPNet or a registered encoder
//! export: one filter per encoder of [`OpContext::encoders`]) of the item and of the predicate.
//!
//! Item embeddings do not depend on the predicate, so they are kept in their own memo (keyed by item) and computed
//! once per item across every query; the predicate is embedded with its column references removed.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use stretto_core::memo::{memo_key, Memo, MemoEntry};
use stretto_core::op::{
    parse_config, LogicalKind, Modality, OpOutput, OpProperties, OperatorFactory, PhysicalOp, SemanticTask,
};
use stretto_core::{CoreError, OpContext, Result};
use stretto_kv::embed::cosine;

/// Configuration.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingConfig {
    /// Catalog sentence encoder.
    #[serde(default = "default_model")]
    pub model: String,
    /// Texts per encoder batch.
    #[serde(default = "default_batch")]
    pub batch: usize,
}

fn default_model() -> String {
    "minilm".into()
}
fn default_batch() -> usize {
    32
}

/// The predicate as a sentence: references removed, whitespace collapsed.
pub fn predicate_sentence(prompt: &str) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    for c in prompt.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The embedding filter.
#[derive(Debug)]
pub struct EmbeddingFilter {
    name: String,
    props: OpProperties,
    config: EmbeddingConfig,
    ctx: OpContext,
    items: OnceLock<Option<Memo>>,
}

impl EmbeddingFilter {
    /// Builds it (cheap; the model loads on first use).
    pub fn new(config: EmbeddingConfig, ctx: &OpContext) -> Result<Self> {
        stretto_kv::prepare::check_encoder_name(&ctx.model_home, &config.model)
            .map_err(|e| CoreError::OperatorConfig { factory: "embedding-filter".into(), message: e.to_string() })?;
        Ok(Self {
            name: format!("embed:{}", config.model),
            props: OpProperties {
                kind: LogicalKind::Filter,
                family: "embedding-filter".into(),
                modality: Modality::Text,
                model: Some(config.model.clone()),
                compression: None,
                tunable: true,
                gold: false,
                cost_hint: 0.004,
                score_range: (-1.0, 1.0),
            },
            config,
            ctx: ctx.clone(),
            items: OnceLock::new(),
        })
    }

    /// Item embeddings, kept by text across every task.
    fn item_store(&self) -> Option<&Memo> {
        self.items.get_or_init(|| self.ctx.open_memo(&format!("{}.items", self.name))).as_ref()
    }
}

/// Embeddings of `texts` by `model` (loaded under `ctx`), reusing those in `store` (keyed by text) and adding the
/// new ones; with seconds per text.
pub fn embed_cached(
    ctx: &OpContext,
    model: &str,
    store: Option<&Memo>,
    texts: &[String],
    batch: usize,
) -> Result<(Vec<Vec<f32>>, Vec<f64>)> {
    // (A catalog encoder's answers are kept under its name alone; a user's, under its registration too.)
    let identity = crate::under_registration(ctx, model.to_string(), model)?;
    let key = |t: &str| memo_key(&identity, "", t);
    let mut out: Vec<Option<Vec<f32>>> = vec![None; texts.len()];
    let mut seconds = vec![0.0; texts.len()];
    for (i, t) in texts.iter().enumerate() {
        if let Some(e) = store.and_then(|m| m.get(&key(t))) {
            if let Some(v) = e.value.as_deref().and_then(|v| serde_json::from_str::<Vec<f32>>(v).ok()) {
                out[i] = Some(v);
                seconds[i] = e.seconds;
            }
        }
    }
    let missing: Vec<usize> = (0..texts.len()).filter(|&i| out[i].is_none()).collect();
    if !missing.is_empty() {
        let enc = crate::embedder(ctx, model).map_err(|e| CoreError::operator_failed(model, e))?;
        let start = Instant::now();
        let refs: Vec<&str> = missing.iter().map(|&i| texts[i].as_str()).collect();
        let vecs = enc.embed(&refs, batch).map_err(|e| CoreError::operator_failed(model, e))?;
        let each = start.elapsed().as_secs_f64() / missing.len() as f64;
        let mut entries = Vec::new();
        for (&i, v) in missing.iter().zip(vecs) {
            entries.push(MemoEntry {
                key: key(&texts[i]),
                score: None,
                value: Some(serde_json::to_string(&v).unwrap_or_default()),
                confidence: None,
                seconds: each,
            });
            out[i] = Some(v);
            seconds[i] = each;
        }
        if let Some(m) = store {
            m.put(entries)?;
        }
    }
    Ok((out.into_iter().map(Option::unwrap_or_default).collect(), seconds))
}

impl PhysicalOp for EmbeddingFilter {
    fn name(&self) -> &str {
        &self.name
    }

    fn accept(&self, _: &SemanticTask) -> Result<String> {
        // A user's encoder's answers are kept under its registration too.
        crate::under_registration(&self.ctx, self.name.clone(), &self.config.model)
    }

    fn properties(&self) -> &OpProperties {
        &self.props
    }

    fn evaluate_items(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
        let store = self.item_store();
        let ctx = &self.ctx;
        let (vecs, secs) = embed_cached(ctx, &self.config.model, store, items, self.config.batch)?;
        let (pred, _) = embed_cached(ctx, &self.config.model, store, &[predicate_sentence(&task.prompt)], 1)?;
        let scores = vecs.iter().map(|v| cosine(v, &pred[0]) as f64).collect();
        Ok((OpOutput::Scores(scores), secs))
    }
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "embedding-filter",
        plugin: crate::PLUGIN,
        about: "cosine similarity of sentence embeddings (MiniLM, or the session's encoders) of the item and the predicate",
        ladder: |ctx| ctx.encoders.iter().map(|m| serde_json::json!({"model": m})).collect(),
        build: |c, ctx| Ok(Arc::new(EmbeddingFilter::new(parse_config("embedding-filter", c)?, ctx)?)),
    }
}
