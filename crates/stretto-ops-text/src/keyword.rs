//! A keyword filter: scores a tuple by how many of the predicate's keywords its text contains.
//!
//! Keywords are the double-quoted phrases of the predicate (`{reviews.reviewtext} mentions "acting" or "cast"`)
//! or, when it quotes none, its content words (stop words and column references removed). Matching is
//! case-insensitive on whole words. The score is the number of distinct keywords found, so the gold rule
//! (`score > 0`) means "mentions at least one", and thresholds can ask for more.

use std::sync::Arc;

use stretto_core::op::{
    parse_config, time_evenly, LogicalKind, Modality, OpOutput, OpProperties, OperatorFactory, PhysicalOp, SemanticTask,
};
use stretto_core::{CoreError, OpContext, Result};

/// Words that carry no topic in a predicate.
const STOP_WORDS: &[&str] = &[
    "a",
    "about",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "by",
    "clearly",
    "contains",
    "describes",
    "does",
    "for",
    "from",
    "has",
    "have",
    "in",
    "is",
    "it",
    "its",
    "mention",
    "mentions",
    "of",
    "on",
    "or",
    "review",
    "says",
    "some",
    "talks",
    "text",
    "that",
    "the",
    "this",
    "to",
    "was",
    "with",
];

/// Configuration: optional explicit keywords (otherwise taken from the predicate).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeywordConfig {
    /// Operator name; defaults to `keyword`.
    #[serde(default)]
    pub name: Option<String>,
    /// Keywords to look for instead of those in the predicate.
    #[serde(default)]
    pub keywords: Vec<String>,
}

/// The keyword filter operator.
#[derive(Debug)]
pub struct KeywordFilter {
    name: String,
    keywords: Vec<String>,
    props: OpProperties,
}

impl KeywordFilter {
    /// Builds the operator from its configuration.
    pub fn new(config: KeywordConfig) -> Self {
        Self {
            name: config.name.unwrap_or_else(|| "keyword".into()),
            keywords: config.keywords.iter().map(|k| k.to_lowercase()).collect(),
            props: OpProperties {
                kind: LogicalKind::Filter,
                family: "keyword".into(),
                modality: Modality::Text,
                model: None,
                compression: None,
                tunable: true,
                gold: false,
                cost_hint: 2e-6,
                score_range: (0.0, 10.0),
            },
        }
    }
}

/// The keywords of a predicate: its quoted phrases, else its content words.
pub fn predicate_keywords(predicate: &str) -> Vec<String> {
    let without_refs = strip_references(predicate);
    let quoted: Vec<String> =
        without_refs.split('"').skip(1).step_by(2).map(|q| q.trim().to_lowercase()).filter(|q| !q.is_empty()).collect();
    if !quoted.is_empty() {
        return quoted;
    }
    let mut words: Vec<String> =
        words(&without_refs).filter(|w| w.len() > 2 && !STOP_WORDS.contains(&w.as_str())).collect();
    words.dedup();
    words
}

fn strip_references(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'').filter(|w| !w.is_empty()).map(|w| w.to_lowercase())
}

/// Whether `phrase` (one or more words) occurs in `haystack_words` as consecutive whole words.
fn contains_phrase(haystack_words: &[String], phrase: &str) -> bool {
    let needle: Vec<String> = words(phrase).collect();
    !needle.is_empty() && haystack_words.windows(needle.len()).any(|w| w == needle.as_slice())
}

impl PhysicalOp for KeywordFilter {
    fn name(&self) -> &str {
        &self.name
    }

    fn properties(&self) -> &OpProperties {
        &self.props
    }

    fn memoise(&self) -> bool {
        // Counting words costs microseconds: a memo lookup would cost more.
        false
    }

    fn accept(&self, task: &SemanticTask) -> Result<String> {
        if self.keywords.is_empty() && predicate_keywords(&task.prompt).is_empty() {
            return Err(CoreError::NotApplicable {
                operator: self.name.clone(),
                reason: format!("predicate `{}` has no keyword to look for", task.prompt),
            });
        }
        Ok(self.name.clone())
    }

    fn evaluate_items(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
        let keywords = if self.keywords.is_empty() { predicate_keywords(&task.prompt) } else { self.keywords.clone() };
        time_evenly(items.len(), || {
            let scores = items
                .iter()
                .map(|item| {
                    let text: Vec<String> = words(item).collect();
                    keywords.iter().filter(|k| contains_phrase(&text, k)).count() as f64
                })
                .collect();
            Ok(OpOutput::Scores(scores))
        })
    }
}

fn build(config: &serde_json::Value, _: &OpContext) -> Result<Arc<dyn PhysicalOp>> {
    Ok(Arc::new(KeywordFilter::new(parse_config("keyword", config)?)))
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "keyword",
        plugin: crate::PLUGIN,
        about: "counts the predicate's keywords (quoted phrases, else content words) in the text",
        ladder: |_| vec![serde_json::json!({})],
        build,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use stretto_core::op::RegisteredOp;
    use stretto_core::MemoPolicy;

    #[test]
    fn keywords_come_from_quotes_or_content_words() {
        assert_eq!(predicate_keywords(r#"{r.text} mentions "great acting" or "cast""#), vec!["great acting", "cast"]);
        assert_eq!(predicate_keywords("{r.text} is clearly about horror movies"), vec!["horror", "movies"]);
    }

    #[test]
    fn counts_whole_word_matches() {
        let batch = RecordBatch::try_new(
            std::sync::Arc::new(Schema::new(vec![Field::new("r.text", DataType::Utf8, true)])),
            vec![std::sync::Arc::new(StringArray::from(vec![Some("Great acting, great CAST."), Some("castle"), None]))],
        )
        .unwrap();
        let op = RegisteredOp::new(Arc::new(KeywordFilter::new(KeywordConfig::default())), MemoPolicy::Off);
        let task = SemanticTask::filter("f", r#"{r.text} mentions "great acting" or "cast""#);
        // A null cell is not asked about: the framework scores it below the box (0..10), where every stage rejects.
        assert_eq!(op.evaluate(&task, &batch).unwrap(), OpOutput::Scores(vec![2.0, 0.0, -1.0]));
        // A predicate without a keyword is declined, not failed: planners drop the operator for it.
        let none = SemanticTask::filter("g", "{r.text} is");
        assert!(matches!(op.evaluate(&none, &batch), Err(CoreError::NotApplicable { .. })));
    }

    #[test]
    fn bad_config_is_a_typed_error() {
        let err = build(&serde_json::json!({"keywrods": ["x"]}), &OpContext::new("/nonexistent")).unwrap_err();
        assert!(matches!(err, CoreError::OperatorConfig { .. }), "{err}");
    }
}
