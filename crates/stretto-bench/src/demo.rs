//! What `stretto demo` checks against the data itself. The guarantee it prints is relative to the gold plan, so it
//! also scores the map's answers against the truth: every bundled review carries its critic's `scoresentiment`
//! (POSITIVE or NEGATIVE, the human label; the prompt shows the model only the review's text). Beside the share
//! right it prints the balanced accuracy (the mean of the shares right among positive and among negative reviews),
//! which is 0.5 for a model that says "positive" to everything however skewed the rows are.

/// A result row, as [`crate::query::QueryReport::rows`] holds it.
pub type Row = serde_json::Map<String, serde_json::Value>;

/// The sentiment an answer states: its first word, lower-case, when that word is `positive` or `negative`
/// ("Positive.", "negative – the critic…"); `None` for anything else ("Neutral", "The sentiment is…").
pub fn stated_sentiment(answer: &str) -> Option<&'static str> {
    let first = answer.split(|c: char| !c.is_alphabetic()).find(|w| !w.is_empty())?.to_lowercase();
    match first.as_str() {
        "positive" => Some("positive"),
        "negative" => Some("negative"),
        _ => None,
    }
}

/// How the demo's `sentiment` answers compare with the reviews' own `scoresentiment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SentimentAccuracy {
    /// Answers that state the review's true sentiment.
    pub right: usize,
    /// Result rows with both an answer and a true sentiment.
    pub rows: usize,
    /// Rows whose true sentiment is the commoner one among them: what always giving that answer would get right.
    pub majority: usize,
    /// The positive reviews among them.
    pub positive: Verdict,
    /// The negative reviews among them.
    pub negative: Verdict,
}

/// The rows of one true verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Verdict {
    /// Rows whose review has this verdict.
    pub reviews: usize,
    /// Those answered with it.
    pub right: usize,
}

impl SentimentAccuracy {
    /// The mean of the share right among positive and among negative reviews (a verdict absent from the rows is
    /// left out): 0.5 for any constant answer, however skewed the rows, 1 for every answer right.
    pub fn balanced(&self) -> Option<f64> {
        let shares: Vec<f64> = [self.positive, self.negative]
            .into_iter()
            .filter(|v| v.reviews > 0)
            .map(|v| v.right as f64 / v.reviews as f64)
            .collect();
        (!shares.is_empty()).then(|| shares.iter().sum::<f64>() / shares.len() as f64)
    }
}

/// Scores the result rows that have a `sentiment` answer and a `reviews.scoresentiment` label.
pub fn sentiment_accuracy(rows: &[Row]) -> SentimentAccuracy {
    let pairs: Vec<(&str, String)> = rows
        .iter()
        .filter_map(|row| {
            Some((row.get("sentiment")?.as_str()?, row.get("reviews.scoresentiment")?.as_str()?.to_lowercase()))
        })
        .collect();
    let verdict = |v: &str| {
        let of = pairs.iter().filter(|(_, truth)| truth == v);
        Verdict {
            reviews: of.clone().count(),
            right: of.filter(|(answer, _)| stated_sentiment(answer) == Some(v)).count(),
        }
    };
    let (positive, negative) = (verdict("positive"), verdict("negative"));
    SentimentAccuracy {
        right: positive.right + negative.right,
        rows: pairs.len(),
        majority: positive.reviews.max(negative.reviews),
        positive,
        negative,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_word_states_the_sentiment() {
        assert_eq!(stated_sentiment("Positive"), Some("positive"));
        assert_eq!(stated_sentiment(" negative. The critic dislikes it"), Some("negative"));
        assert_eq!(stated_sentiment("**Negative**"), Some("negative"));
        assert_eq!(stated_sentiment("Neutral"), None);
        assert_eq!(stated_sentiment("The sentiment is positive"), None, "only a direct answer counts");
        assert_eq!(stated_sentiment(""), None);
    }

    #[test]
    fn accuracy_counts_right_answers_and_the_majority_baseline() {
        let row = |answer: &str, truth: &str| -> Row {
            serde_json::json!({"sentiment": answer, "reviews.scoresentiment": truth}).as_object().unwrap().clone()
        };
        let rows = [
            row("Positive", "POSITIVE"),
            row("Positive", "NEGATIVE"),
            row("negative", "NEGATIVE"),
            row("Neutral", "POSITIVE"),
            row("positive!", "POSITIVE"),
        ];
        let acc = sentiment_accuracy(&rows);
        assert_eq!(
            acc,
            SentimentAccuracy {
                right: 3,
                rows: 5,
                majority: 3,
                positive: Verdict { reviews: 3, right: 2 },
                negative: Verdict { reviews: 2, right: 1 }
            }
        );
        assert_eq!(acc.balanced(), Some((2.0 / 3.0 + 0.5) / 2.0));
        let constant = [row("Positive", "POSITIVE"), row("Positive", "POSITIVE"), row("Positive", "NEGATIVE")];
        assert_eq!(sentiment_accuracy(&constant).balanced(), Some(0.5), "a constant answer is worth 0.5");
        assert_eq!(sentiment_accuracy(&[]).balanced(), None);
    }
}
