//! Caption-bridge LLM operators: an honest composition, named as what it is.
//!
//! The image is written as text — its top EfficientNet-Lite0 classes with their confidences — and that caption is
//! the cached item of the text LLM operators: the same KV caches, compression ratios, calibrated log-odds for
//! filters and greedy answers for maps. The LLM sees only what the classifier saw.

use std::sync::{Arc, OnceLock};

use stretto_core::memo::{open_or_warn, Memo};
use stretto_core::op::{LogicalKind, Modality, OperatorFactory, PhysicalOp};
use stretto_core::{CoreError, Result};
use stretto_ops_text::llm::{ladder_models, Bridge, LlmConfig, LlmOp};

use crate::bridge::{image_classes, Classes};

/// Classes written into a caption.
pub const CAPTION_CLASSES: usize = 5;

/// The caption of an image's classes: `A photo. An image classifier recognises: T-shirt (83%), sweatshirt (4%).`
pub fn caption(classes: &Classes) -> String {
    let parts: Vec<String> = classes.iter().map(|(c, p)| format!("{c} ({:.0}%)", p * 100.0)).collect();
    format!("A photo. An image classifier recognises in it: {}.", parts.join(", "))
}

fn classes_memo() -> Option<&'static Memo> {
    static MEMO: OnceLock<Option<Memo>> = OnceLock::new();
    MEMO.get_or_init(|| open_or_warn(&stretto_kv::models::default_home().join("memo"), "efficientnet-lite0.classes"))
        .as_ref()
}

/// The bridge: image paths → captions.
pub fn caption_bridge() -> Bridge {
    Bridge {
        transform: Arc::new(|paths: &[String]| {
            let (classes, secs) = image_classes(classes_memo(), paths, CAPTION_CLASSES)?;
            Ok((classes.iter().map(caption).collect(), secs))
        }),
        subject: "the photo described above",
        family: "caption",
        modality: Modality::Image,
    }
}

/// One rung per ladder model, uncompressed (captions are short: compression buys nothing).
fn ladder() -> Vec<serde_json::Value> {
    ladder_models().into_iter().map(|m| serde_json::json!({"model": m, "ratio": 0.0})).collect()
}

fn build(kind: LogicalKind, config: &serde_json::Value) -> Result<Arc<dyn PhysicalOp>> {
    let factory = if kind == LogicalKind::Filter { "caption-filter" } else { "caption-map" };
    let c: LlmConfig = serde_json::from_value(config.clone())
        .map_err(|e| CoreError::OperatorConfig { factory: factory.into(), message: e.to_string() })?;
    Ok(Arc::new(LlmOp::bridged(kind, c, caption_bridge())?))
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "caption-filter",
        plugin: crate::PLUGIN,
        about: "image filter bridged through text: the image's classifier caption is the LLM's cached item",
        ladder,
        build: |c| build(LogicalKind::Filter, c),
    }
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "caption-map",
        plugin: crate::PLUGIN,
        about: "image map bridged through text: an LLM answers from the image's classifier caption",
        ladder,
        build: |c| build(LogicalKind::Map, c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captions_list_classes_with_confidences() {
        let c = caption(&vec![("T-shirt".into(), 0.834), ("sweatshirt".into(), 0.04)]);
        assert_eq!(c, "A photo. An image classifier recognises in it: T-shirt (83%), sweatshirt (4%).");
    }
}
