//! The label-bridge image filter: an honest composition, named as what it is.
//!
//! No CLIP-like image–text model is available offline, so the image is described by EfficientNet-Lite0's ImageNet
//! class posterior, and the description is embedded through text: the image's embedding is the posterior-weighted
//! mean of MiniLM embeddings of "a photo of a <class>" over its top classes. The score is that embedding's cosine
//! with the embedded predicate. It works where the predicate names things ImageNet knows (garments, shoes, bags),
//! and cannot see what ImageNet has no class for.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use stretto_core::memo::{memo_key, Memo, MemoEntry};
use stretto_core::op::{
    parse_config, LogicalKind, Modality, OpOutput, OpProperties, OperatorFactory, PhysicalOp, SemanticTask,
};
use stretto_core::{CoreError, OpContext, Result};
use stretto_kv::embed::cosine;
use stretto_kv::vision::top_k;
use stretto_ops_text::embedding::{embed_cached, predicate_sentence};

/// Classes of the posterior that describe an image.
pub const TOP_CLASSES: usize = 5;

/// Configuration.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelBridgeConfig {
    /// Sentence encoder bridging labels and predicates.
    #[serde(default = "default_encoder")]
    pub encoder: String,
    /// Classes used per image.
    #[serde(default = "default_top")]
    pub top: usize,
}

fn default_encoder() -> String {
    "minilm".into()
}
fn default_top() -> usize {
    TOP_CLASSES
}

/// The label-bridge filter.
#[derive(Debug)]
pub struct LabelBridge {
    name: String,
    props: OpProperties,
    config: LabelBridgeConfig,
    ctx: OpContext,
    stores: OnceLock<(Option<Memo>, Option<Memo>)>,
}

/// An image's top classes with their renormalised weights.
pub type Classes = Vec<(String, f32)>;

/// An image's top classes with renormalised weights by the classifier loaded under `ctx`, memoised by file path and
/// size. A tuple without an image (an empty path: a null or empty cell) has no classes, at no cost.
pub fn image_classes(
    ctx: &OpContext,
    store: Option<&Memo>,
    paths: &[String],
    top: usize,
) -> Result<(Vec<Classes>, Vec<f64>)> {
    let key = |p: &str| {
        let len = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        memo_key("efficientnet-lite0", &top.to_string(), &format!("{p}#{len}"))
    };
    let mut out: Vec<Option<Classes>> = vec![None; paths.len()];
    let mut seconds = vec![0.0; paths.len()];
    for (i, p) in paths.iter().enumerate() {
        if p.is_empty() {
            out[i] = Some(Classes::new());
        } else if let Some(e) = store.and_then(|m| m.get(&key(p))) {
            if let Some(v) = e.value.as_deref().and_then(|v| serde_json::from_str(v).ok()) {
                out[i] = Some(v);
                seconds[i] = e.seconds;
            }
        }
    }
    let missing: Vec<usize> = (0..paths.len()).filter(|&i| out[i].is_none()).collect();
    if !missing.is_empty() {
        let c = stretto_ops_text::classifier(ctx).map_err(|e| CoreError::operator_failed("label-bridge", e))?;
        let mut entries = Vec::new();
        for &i in &missing {
            let start = Instant::now();
            let probs = c
                .classify_files(&[Path::new(&paths[i])], 1)
                .map_err(|e| CoreError::operator_failed("label-bridge", e))?
                .remove(0);
            let best = top_k(&probs, top);
            let z: f32 = best.iter().map(|(_, p)| p).sum::<f32>().max(1e-12);
            let classes: Classes = best.iter().map(|(k, p)| (c.classes()[*k].clone(), p / z)).collect();
            let secs = start.elapsed().as_secs_f64();
            entries.push(MemoEntry {
                key: key(&paths[i]),
                score: None,
                value: Some(serde_json::to_string(&classes).unwrap_or_default()),
                confidence: None,
                seconds: secs,
            });
            out[i] = Some(classes);
            seconds[i] = secs;
        }
        if let Some(m) = store {
            m.put(entries)?;
        }
    }
    Ok((out.into_iter().map(Option::unwrap_or_default).collect(), seconds))
}

impl LabelBridge {
    /// Builds it (cheap; models load on first use).
    pub fn new(config: LabelBridgeConfig, ctx: &OpContext) -> Result<Self> {
        // A catalog sentence encoder or one the user registered; a decoder embeds nothing.
        stretto_kv::prepare::check_encoder_name(&ctx.model_home, &config.encoder)
            .map_err(|e| CoreError::OperatorConfig { factory: "label-bridge".into(), message: e.to_string() })?;
        if config.top == 0 {
            return Err(CoreError::OperatorConfig {
                factory: "label-bridge".into(),
                message: "top must be ≥ 1".into(),
            });
        }
        Ok(Self {
            name: format!("label-bridge:efficientnet-lite0+{}", config.encoder),
            props: OpProperties {
                kind: LogicalKind::Filter,
                family: "label-bridge".into(),
                modality: Modality::Image,
                model: Some(format!("efficientnet-lite0+{}", config.encoder)),
                compression: None,
                tunable: true,
                gold: false,
                cost_hint: 0.03,
                score_range: (-1.0, 1.0),
            },
            config,
            ctx: ctx.clone(),
            stores: OnceLock::new(),
        })
    }

    /// Image classes (by file) and label embeddings (by text), kept across every task.
    fn stores(&self) -> (Option<&Memo>, Option<&Memo>) {
        let (a, b) = self.stores.get_or_init(|| {
            let open = |n: &str| self.ctx.open_memo(n);
            (open("efficientnet-lite0.classes"), open(&format!("embed:{}.items", self.config.encoder)))
        });
        (a.as_ref(), b.as_ref())
    }
}

impl PhysicalOp for LabelBridge {
    fn name(&self) -> &str {
        &self.name
    }

    fn accept(&self, _: &SemanticTask) -> Result<String> {
        // A user's encoder's answers are kept under its registration too.
        stretto_ops_text::under_registration(&self.ctx, self.name.clone(), &self.config.encoder)
    }

    fn properties(&self) -> &OpProperties {
        &self.props
    }

    fn evaluate_items(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
        let (classes_store, text_store) = self.stores();
        let (classes, mut secs) = image_classes(&self.ctx, classes_store, items, self.config.top)?;
        let pred_text = format!("a photo that {}", predicate_sentence(&task.prompt));
        let (pred, _) = embed_cached(&self.ctx, &self.config.encoder, text_store, &[pred_text], 1)?;
        let mut scores = Vec::with_capacity(items.len());
        for (i, cls) in classes.iter().enumerate() {
            if cls.is_empty() {
                // No image: nothing in it can be what the predicate asks for, so the lowest score there is.
                scores.push(self.props.score_range.0);
                continue;
            }
            let start = Instant::now();
            let texts: Vec<String> = cls.iter().map(|(c, _)| format!("a photo of a {c}")).collect();
            let (vecs, _) = embed_cached(&self.ctx, &self.config.encoder, text_store, &texts, 16)?;
            let mut mix = vec![0f32; vecs.first().map_or(0, Vec::len)];
            for ((_, w), v) in cls.iter().zip(&vecs) {
                mix.iter_mut().zip(v).for_each(|(m, x)| *m += w * x);
            }
            scores.push(cosine(&mix, &pred[0]) as f64);
            secs[i] += start.elapsed().as_secs_f64();
        }
        Ok((OpOutput::Scores(scores), secs))
    }
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "label-bridge",
        plugin: crate::PLUGIN,
        about: "image filter bridged through text: EfficientNet class posterior -> MiniLM label embeddings -> cosine",
        ladder: |_| vec![serde_json::json!({})],
        build: |c, ctx| Ok(Arc::new(LabelBridge::new(parse_config("label-bridge", c)?, ctx)?)),
    }
}
