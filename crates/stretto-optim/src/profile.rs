//! `stretto.profile/v1`: what every physical operator said about every profiled tuple (see
//! `docs/profile-format.md`), with validation that names the offending field.

use std::collections::HashMap;
use std::path::Path;

use stretto_core::op::LogicalKind;

use crate::error::{OptimError, Result};

/// The format tag of profile files.
pub const PROFILE_FORMAT: &str = "stretto.profile/v1";

/// A logical operator of the profiled query.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LogicalEntry {
    /// Name, unique in the profile.
    pub name: String,
    /// Filter or map.
    pub kind: LogicalKind,
    /// The predicate or instruction the operator was profiled on, where the writer recorded it: a pipeline reusing
    /// the profile must ask the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

/// What one physical operator said about the profiled tuples.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PhysicalEntry {
    /// `logical/implementation`.
    pub name: String,
    /// The logical operator it implements.
    pub logical: String,
    /// Seconds per tuple.
    pub cost: f64,
    /// Filter scores, or map confidences. A `None` entry (JSON `null`) of a map operator says that it was not asked
    /// about that tuple, which must then be outside the gold result (some gold filter rejects it: no map value
    /// there can count, see [`Profile::validate`]); every other `None` (also `NaN`, `Infinity`, read as `null`) is
    /// rejected by validation, and parsed so that the error can name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scores: Option<Vec<Option<f64>>>,
    /// Map values (`null` = no value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Option<String>>>,
    /// Whether this is the logical operator's gold implementation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gold: bool,
}

/// A `stretto.profile/v1` document.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Profile {
    /// Always [`PROFILE_FORMAT`].
    pub format: String,
    /// The query, for people.
    #[serde(default)]
    pub query: String,
    /// How many tuples the plan will run on.
    pub population: u64,
    /// Ids of the profiled tuples.
    pub tuples: Vec<String>,
    /// Logical operators.
    pub logical: Vec<LogicalEntry>,
    /// Physical operators.
    pub physical: Vec<PhysicalEntry>,
    /// A digest of what the logical operators read on the profiled tuples, where the writer recorded it: a
    /// pipeline reusing the profile must read the same there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_digest: Option<String>,
}

impl Profile {
    /// Reads and validates a profile file.
    pub fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).map_err(|source| OptimError::Io { path: path.to_path_buf(), source })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates a profile document.
    ///
    /// Tools in other languages write non-finite floats as bare `NaN` / `Infinity`, which is not JSON; they are read
    /// as `null` so that validation can say which score is broken instead of failing on a syntax error.
    pub fn parse(text: &str, context: &str) -> Result<Self> {
        let cleaned = null_out_non_finite(text);
        let profile: Profile = serde_json::from_str(&cleaned)
            .map_err(|source| OptimError::Json { context: context.to_string(), source })?;
        profile.validate()?;
        Ok(profile)
    }

    /// Writes the profile as JSON.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string(self)
            .map_err(|source| OptimError::Json { context: path.display().to_string(), source })?;
        stretto_core::format::write_atomic(path, text.as_bytes()).map_err(OptimError::from)
    }

    /// Number of profiled tuples.
    pub fn len(&self) -> usize {
        self.tuples.len()
    }

    /// Whether no tuple was profiled.
    pub fn is_empty(&self) -> bool {
        self.tuples.is_empty()
    }

    /// Checks the contract of `docs/profile-format.md`; errors name the field.
    pub fn validate(&self) -> Result<()> {
        if self.format != PROFILE_FORMAT {
            return Err(OptimError::profile("format", format!("is `{}`, expected `{PROFILE_FORMAT}`", self.format)));
        }
        let n = self.tuples.len();
        if n == 0 {
            return Err(OptimError::profile("tuples", "is empty: nothing was profiled"));
        }
        if self.population == 0 {
            return Err(OptimError::profile("population", "must be at least 1"));
        }
        if self.logical.is_empty() {
            return Err(OptimError::profile("logical", "is empty"));
        }
        let mut logical: HashMap<&str, LogicalKind> = HashMap::new();
        for (i, l) in self.logical.iter().enumerate() {
            if logical.insert(&l.name, l.kind).is_some() {
                return Err(OptimError::profile(format!("logical[{i}].name"), format!("`{}` appears twice", l.name)));
            }
        }
        let mut names = HashMap::new();
        let mut golds: HashMap<&str, usize> = HashMap::new();
        for (i, p) in self.physical.iter().enumerate() {
            let at = |f: &str| format!("physical[{i}].{f}");
            if names.insert(p.name.as_str(), i).is_some() {
                return Err(OptimError::profile(at("name"), format!("`{}` appears twice", p.name)));
            }
            let Some(kind) = logical.get(p.logical.as_str()) else {
                return Err(OptimError::profile(
                    at("logical"),
                    format!("`{}` (of `{}`) is not a logical operator of the profile", p.logical, p.name),
                ));
            };
            if !p.cost.is_finite() || p.cost < 0.0 {
                return Err(OptimError::profile(
                    at("cost"),
                    format!("`{}` must be a finite, non-negative number", p.cost),
                ));
            }
            if p.gold {
                *golds.entry(p.logical.as_str()).or_default() += 1;
            }
            if let Some(scores) = &p.scores {
                if scores.len() != n {
                    return Err(OptimError::profile(
                        at("scores"),
                        format!("has {} entries but `tuples` has {n}", scores.len()),
                    ));
                }
                // A map's `null` (not asked) is checked against the gold result below.
                let unasked_ok = *kind == LogicalKind::Map;
                if let Some(j) = scores.iter().position(|s| match s {
                    None => !unasked_ok,
                    Some(s) => !s.is_finite(),
                }) {
                    return Err(OptimError::profile(
                        format!("physical[{i}].scores[{j}]"),
                        format!("of `{}` is not a finite number (NaN, infinity or null)", p.name),
                    ));
                }
            }
            if let Some(values) = &p.values {
                if values.len() != n {
                    return Err(OptimError::profile(
                        at("values"),
                        format!("has {} entries but `tuples` has {n}", values.len()),
                    ));
                }
            }
            match kind {
                LogicalKind::Filter if p.scores.is_none() => {
                    return Err(OptimError::profile(
                        at("scores"),
                        format!("missing: `{}` implements a filter", p.name),
                    ));
                }
                LogicalKind::Filter if p.values.is_some() => {
                    return Err(OptimError::profile(
                        at("values"),
                        format!("`{}` implements a filter, which has no values", p.name),
                    ));
                }
                LogicalKind::Map if p.values.is_none() => {
                    return Err(OptimError::profile(at("values"), format!("missing: `{}` implements a map", p.name)));
                }
                _ => {}
            }
        }
        for l in &self.logical {
            match golds.get(l.name.as_str()).copied().unwrap_or(0) {
                1 => {}
                0 => {
                    return Err(OptimError::profile(
                        "physical",
                        format!("logical operator `{}` has no gold implementation (`\"gold\": true`)", l.name),
                    ))
                }
                k => {
                    return Err(OptimError::profile(
                        "physical",
                        format!("logical operator `{}` has {k} gold implementations; exactly one is allowed", l.name),
                    ))
                }
            }
        }
        self.validate_unasked()
    }

    /// A map operator may leave unasked (`null` score) only tuples outside the gold result, where no map value can
    /// count: such a tuple is a false positive of any plan that lets it through, whatever its values. Its value
    /// there must be `null` too.
    fn validate_unasked(&self) -> Result<()> {
        let n = self.tuples.len();
        let filters: Vec<&str> =
            self.logical.iter().filter(|l| l.kind == LogicalKind::Filter).map(|l| l.name.as_str()).collect();
        let mut outside = vec![false; n];
        for p in self.physical.iter().filter(|p| p.gold && filters.contains(&p.logical.as_str())) {
            for (o, s) in outside.iter_mut().zip(p.scores.iter().flatten()) {
                *o |= s.is_none_or(|s| s <= 0.0);
            }
        }
        for (i, p) in self.physical.iter().enumerate() {
            let Some(scores) = &p.scores else { continue };
            for (j, _) in scores.iter().enumerate().filter(|(_, s)| s.is_none()) {
                if !outside[j] {
                    return Err(OptimError::profile(
                        format!("physical[{i}].scores[{j}]"),
                        format!(
                            "of `{}` is null (not asked) on tuple `{}`, which every gold filter accepts: a map may \
                             leave unasked only tuples outside the gold result",
                            p.name, self.tuples[j]
                        ),
                    ));
                }
                if p.values.as_ref().and_then(|v| v[j].as_ref()).is_some() {
                    return Err(OptimError::profile(
                        format!("physical[{i}].values[{j}]"),
                        format!("of `{}` is a value where its score says it was not asked (null)", p.name),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A profile restricted to some tuples (by index), e.g. a sample of a population profile.
    pub fn subset(&self, rows: &[usize], population: u64) -> Self {
        let pick_f = |v: &Vec<Option<f64>>| rows.iter().map(|&r| v[r]).collect();
        let pick_s = |v: &Vec<Option<String>>| rows.iter().map(|&r| v[r].clone()).collect();
        Self {
            format: self.format.clone(),
            query: self.query.clone(),
            population,
            tuples: rows.iter().map(|&r| self.tuples[r].clone()).collect(),
            logical: self.logical.clone(),
            physical: self
                .physical
                .iter()
                .map(|p| PhysicalEntry {
                    scores: p.scores.as_ref().map(pick_f),
                    values: p.values.as_ref().map(pick_s),
                    ..p.clone()
                })
                .collect(),
            // Of other tuples: the digest of these is not known here.
            sample_digest: None,
        }
    }
}

/// Replaces bare `NaN`, `Infinity` and `-Infinity` tokens outside strings by `null`.
fn null_out_non_finite(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("NaN") && !text.contains("Infinity") {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let (mut rest, mut in_str, mut escaped) = (text, false, false);
    while let Some(ch) = rest.chars().next() {
        if !in_str {
            if let Some(tok) = ["-Infinity", "Infinity", "NaN"].iter().find(|t| rest.starts_with(**t)) {
                out.push_str("null");
                rest = &rest[tok.len()..];
                continue;
            }
            in_str = ch == '"';
        } else if escaped {
            escaped = false;
        } else if ch == '\\' {
            escaped = true;
        } else if ch == '"' {
            in_str = false;
        }
        out.push(ch);
        rest = &rest[ch.len_utf8()..];
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(physical: &str) -> String {
        format!(
            r#"{{"format":"stretto.profile/v1","query":"q","population":100,"tuples":["a","b"],
               "logical":[{{"name":"pos","kind":"filter"}},{{"name":"title","kind":"map"}}],
               "physical":[{physical}]}}"#
        )
    }

    const OK: &str = r#"{"name":"pos/cheap","logical":"pos","cost":0.01,"scores":[0.1,-0.2]},
                        {"name":"pos/gold","logical":"pos","cost":0.1,"scores":[1,-1],"gold":true},
                        {"name":"title/gold","logical":"title","cost":0.2,"values":["Heat",null],"gold":true}"#;

    #[test]
    fn parses_a_valid_profile() {
        let p = Profile::parse(&doc(OK), "t").unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p.physical[2].values.as_ref().unwrap()[1], None);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (OK.replace(r#","gold":true}"#, "}"), "no gold"),
            (OK.replace("[0.1,-0.2]", "[0.1]"), "physical[0].scores"),
            (OK.replace("[0.1,-0.2]", "[0.1,NaN]"), "physical[0].scores[1]"),
            (OK.replace(r#""logical":"pos","cost":0.01"#, r#""logical":"neg","cost":0.01"#), "physical[0].logical"),
            (OK.replace(r#""cost":0.01"#, r#""cost":-1"#), "physical[0].cost"),
            (OK.replace(r#","values":["Heat",null]"#, ""), "physical[2].values"),
        ];
        for (physical, needle) in cases {
            let err = Profile::parse(&doc(&physical), "t").unwrap_err().to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn a_map_may_leave_unasked_only_tuples_outside_the_gold_result() {
        // Tuple `b` is rejected by gold's filter: a map may leave it unasked (null score and value).
        let unasked = OK.replace(r#""values":["Heat",null]"#, r#""values":["Heat",null],"scores":[0.9,null]"#);
        let p = Profile::parse(&doc(&unasked), "t").unwrap();
        assert_eq!(p.physical[2].scores.as_ref().unwrap()[1], None);
        // Not tuple `a`, which gold accepts.
        let inside = OK.replace(r#""values":["Heat",null]"#, r#""values":[null,null],"scores":[null,0.9]"#);
        let err = Profile::parse(&doc(&inside), "t").unwrap_err().to_string();
        assert!(err.contains("physical[2].scores[0]") && err.contains("gold result"), "{err}");
        // An unasked tuple has no value.
        let valued = OK.replace(r#""values":["Heat",null]"#, r#""values":["Heat","Alien"],"scores":[0.9,null]"#);
        let err = Profile::parse(&doc(&valued), "t").unwrap_err().to_string();
        assert!(err.contains("physical[2].values[1]"), "{err}");
        // A filter never leaves a tuple unasked.
        let err = Profile::parse(&doc(&OK.replace("[0.1,-0.2]", "[0.1,null]")), "t").unwrap_err().to_string();
        assert!(err.contains("physical[0].scores[1]"), "{err}");
    }

    #[test]
    fn nan_inside_strings_is_left_alone() {
        let text = doc(&OK.replace("Heat", "NaN Infinity"));
        let p = Profile::parse(&text, "t").unwrap();
        assert_eq!(p.physical[2].values.as_ref().unwrap()[0].as_deref(), Some("NaN Infinity"));
    }
}
