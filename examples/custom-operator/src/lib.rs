//! # stretto-example-custom-operator
//!
//! How to add a physical operator to Stretto from your own crate, with no edit to any Stretto crate: a *lexicon
//! filter* that scores a text by the sentiment words it contains (positive minus negative hits, negated for a
//! predicate that asks for the negative). It costs microseconds, so the optimizer can put it first in a cascade
//! and let an LLM decide only what it leaves unsure.
//!
//! Three things make it a plugin: a type implementing [`PhysicalOp`] (only what is its own: which tasks it accepts
//! and one evaluation over its items; the framework checks the task's kind, extracts items, memoises and times),
//! an `inventory::submit!`ed
//! [`OperatorFactory`] whose configuration is a typed `serde` struct, and a [`link`] function that the user's binary
//! names once so that rustc keeps this crate (and its registrations) in the binary.
//!
//! ```
//! use stretto_example_custom_operator as lexicon;
//! lexicon::link(); // name the crate once, so its registrations are linked in
//! let session = stretto::Session::builder(std::env::temp_dir().join("stretto-doc")).memo_off().build()?;
//! session.registry().require_plugins(&[lexicon::PLUGIN])?;
//! let op = session.registry().get("lexicon")?;
//! assert_eq!(op.properties().family, "lexicon-filter");
//! # Ok::<(), stretto::Error>(())
//! ```

#![warn(missing_docs)]

use std::sync::Arc;

use stretto_core::op::{
    parse_config, time_evenly, LogicalKind, Modality, OpOutput, OpProperties, OperatorFactory, PhysicalOp, PluginCrate,
    SemanticTask,
};
use stretto_core::{CoreError, OpContext, Result};

/// This crate's name in the plugin registry.
pub const PLUGIN: &str = "stretto-example-custom-operator";

stretto_core::inventory::submit! { PluginCrate { name: PLUGIN } }

/// Keeps this crate and its registrations in the binary: call it once from `main` (or any code that runs).
#[inline(never)]
pub fn link() -> &'static str {
    std::hint::black_box(PLUGIN)
}

/// Words that carry sentiment in reviews (a small hand-made lexicon; extend it through the configuration).
const POSITIVE: &[&str] = &[
    "amazing",
    "beautiful",
    "best",
    "brilliant",
    "delight",
    "delightful",
    "enjoyable",
    "enjoyed",
    "excellent",
    "fantastic",
    "fun",
    "funny",
    "great",
    "gripping",
    "love",
    "loved",
    "masterpiece",
    "moving",
    "perfect",
    "powerful",
    "remarkable",
    "superb",
    "terrific",
    "triumph",
    "wonderful",
];
const NEGATIVE: &[&str] = &[
    "awful",
    "bad",
    "boring",
    "bland",
    "disappointing",
    "dull",
    "fails",
    "flat",
    "forgettable",
    "mess",
    "mediocre",
    "poor",
    "predictable",
    "terrible",
    "tedious",
    "tiresome",
    "unfunny",
    "waste",
    "weak",
    "worst",
];

/// The factory's configuration.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LexiconConfig {
    /// Extra positive words.
    #[serde(default)]
    pub positive: Vec<String>,
    /// Extra negative words.
    #[serde(default)]
    pub negative: Vec<String>,
}

/// The lexicon filter.
#[derive(Debug)]
pub struct LexiconFilter {
    props: OpProperties,
    positive: Vec<String>,
    negative: Vec<String>,
}

impl LexiconFilter {
    /// Builds it from a configuration.
    pub fn new(config: LexiconConfig) -> Self {
        let words = |base: &[&str], extra: Vec<String>| -> Vec<String> {
            base.iter().map(|w| w.to_string()).chain(extra.into_iter().map(|w| w.to_lowercase())).collect()
        };
        Self {
            props: OpProperties {
                kind: LogicalKind::Filter,
                family: "lexicon-filter".into(),
                modality: Modality::Text,
                model: None,
                compression: None,
                tunable: true,
                gold: false,
                cost_hint: 2e-6,
                score_range: (-5.0, 5.0),
            },
            positive: words(POSITIVE, config.positive),
            negative: words(NEGATIVE, config.negative),
        }
    }

    /// Positive minus negative hits in `text`.
    pub fn polarity(&self, text: &str) -> f64 {
        let lower = text.to_lowercase();
        let tokens: Vec<&str> = lower.split(|c: char| !c.is_alphanumeric()).filter(|t| !t.is_empty()).collect();
        let count = |words: &[String]| tokens.iter().filter(|t| words.iter().any(|w| w == *t)).count() as f64;
        count(&self.positive) - count(&self.negative)
    }
}

/// The direction a predicate asks for: `Some(true)` for positive sentiment, `Some(false)` for negative.
fn direction(prompt: &str) -> Option<bool> {
    let p = prompt.to_lowercase();
    if p.contains("negative") {
        Some(false)
    } else if p.contains("positive") {
        Some(true)
    } else {
        None
    }
}

impl PhysicalOp for LexiconFilter {
    fn name(&self) -> &str {
        "lexicon"
    }

    fn properties(&self) -> &OpProperties {
        &self.props
    }

    fn memoise(&self) -> bool {
        false // microseconds per item: recomputing is cheaper than a memo lookup
    }

    fn accept(&self, task: &SemanticTask) -> Result<String> {
        // A predicate about something other than sentiment is not this operator's to answer.
        direction(&task.prompt).map(|_| self.name().to_string()).ok_or_else(|| CoreError::NotApplicable {
            operator: "lexicon".into(),
            reason: format!("\"{}\" asks for no sentiment", task.prompt),
        })
    }

    fn evaluate_items(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
        let sign = if direction(&task.prompt) == Some(false) { -1.0 } else { 1.0 };
        time_evenly(items.len(), || Ok(OpOutput::Scores(items.iter().map(|t| sign * self.polarity(t)).collect())))
    }
}

fn build(config: &serde_json::Value, _: &OpContext) -> Result<Arc<dyn PhysicalOp>> {
    Ok(Arc::new(LexiconFilter::new(parse_config("lexicon-filter", config)?)))
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "lexicon-filter",
        plugin: PLUGIN,
        about: "sentiment words in the text (positive minus negative hits): a microsecond first cascade stage",
        ladder: |_| vec![serde_json::json!({})],
        build,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polarity_counts_whole_words() {
        let op = LexiconFilter::new(LexiconConfig::default());
        assert_eq!(op.polarity("A great, funny film; never boring."), 1.0);
        assert_eq!(op.polarity("Greatness? No."), 0.0);
        let op = LexiconFilter::new(LexiconConfig { positive: vec!["Sublime".into()], negative: vec![] });
        assert_eq!(op.polarity("sublime"), 1.0);
    }
}
