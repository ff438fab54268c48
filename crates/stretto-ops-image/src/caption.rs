//! Caption-bridge LLM operators: an honest composition, named as what it is.
//!
//! The image is written as text — its top EfficientNet-Lite0 classes with their confidences — and that caption is
//! the cached item of the text LLM operators: the same KV caches, compression ratios, calibrated log-odds for
//! filters and greedy answers for maps. The LLM sees only what the classifier saw.

use std::sync::Arc;

use stretto_core::op::{parse_config, LogicalKind, Modality, OperatorFactory, PhysicalOp};
use stretto_core::{OpContext, Result};
use stretto_ops_text::llm::{Bridge, LlmOp};

use crate::bridge::{image_classes, Classes};

/// Classes written into a caption.
pub const CAPTION_CLASSES: usize = 5;

/// The caption of an image's classes: `A photo. An image classifier recognises: T-shirt (83%), sweatshirt (4%).`
/// A tuple without an image (no classes) is captioned [`NO_PHOTO`], so the LLM answers knowing there is none.
pub fn caption(classes: &Classes) -> String {
    if classes.is_empty() {
        return NO_PHOTO.to_string();
    }
    let parts: Vec<String> = classes.iter().map(|(c, p)| format!("{c} ({:.0}%)", p * 100.0)).collect();
    format!("A photo. An image classifier recognises in it: {}.", parts.join(", "))
}

/// The caption of a tuple without an image.
pub const NO_PHOTO: &str = "There is no photo.";

/// What a column reference becomes in a caption filter's question: the LLM reads the caption, not the photo.
pub const CAPTION_SUBJECT: &str = "the photo described above";

/// The captions of the images at `paths` as the caption operators write them, with the seconds the classifier
/// took per image (memoised classes report what computing them cost).
pub fn captions(ctx: &OpContext, paths: &[String]) -> Result<(Vec<String>, Vec<f64>)> {
    let memo = ctx.open_memo("efficientnet-lite0.classes");
    let (classes, secs) = image_classes(ctx, memo.as_ref(), paths, CAPTION_CLASSES)?;
    Ok((classes.iter().map(caption).collect(), secs))
}

/// The bridge: image paths → captions, by the classifier loaded under `ctx`.
pub fn caption_bridge(ctx: &OpContext) -> Bridge {
    let ctx = ctx.clone();
    let memo = Arc::new(ctx.open_memo("efficientnet-lite0.classes"));
    Bridge {
        transform: Arc::new(move |paths: &[String]| {
            let (classes, secs) = image_classes(&ctx, memo.as_ref().as_ref(), paths, CAPTION_CLASSES)?;
            Ok((classes.iter().map(caption).collect(), secs))
        }),
        subject: CAPTION_SUBJECT,
        family: "caption",
        modality: Modality::Image,
    }
}

/// One rung per ladder model, uncompressed (captions are short: compression buys nothing).
fn ladder(ctx: &OpContext) -> Vec<serde_json::Value> {
    ctx.ladder.iter().map(|m| serde_json::json!({"model": m, "ratio": 0.0})).collect()
}

fn build(kind: LogicalKind, config: &serde_json::Value, ctx: &OpContext) -> Result<Arc<dyn PhysicalOp>> {
    let factory = if kind == LogicalKind::Filter { "caption-filter" } else { "caption-map" };
    Ok(Arc::new(LlmOp::bridged(kind, parse_config(factory, config)?, caption_bridge(ctx), ctx)?))
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "caption-filter",
        plugin: crate::PLUGIN,
        about: "image filter bridged through text: the image's classifier caption is the LLM's cached item",
        ladder,
        build: |c, ctx| build(LogicalKind::Filter, c, ctx),
    }
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "caption-map",
        plugin: crate::PLUGIN,
        about: "image map bridged through text: an LLM answers from the image's classifier caption",
        ladder,
        build: |c, ctx| build(LogicalKind::Map, c, ctx),
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

    #[test]
    fn a_tuple_without_an_image_is_captioned_as_having_none_without_the_classifier() {
        // An empty model home: a classifier asked for would fail to load.
        let dir = tempfile::tempdir().unwrap();
        let ctx = OpContext::new(dir.path().to_path_buf());
        let (texts, secs) = captions(&ctx, &[String::new(), String::new()]).unwrap();
        assert_eq!(texts, [NO_PHOTO, NO_PHOTO]);
        assert_eq!(secs, [0.0, 0.0]);
    }
}
