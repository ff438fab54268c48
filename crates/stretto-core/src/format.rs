//! The `stretto.plan/v1` file (see `docs/profile-format.md`): the stages of a cascade plan in execution order.
//!
//! Beyond the published fields, a plan may carry the query's logical operators (`logical`), so that a plan file
//! is runnable on its own (`stretto run-plan`); optimizers that only read `stages` ignore it.

use std::path::Path;

use crate::error::{CoreError, Result};
use crate::op::SemanticTask;

/// The format tag of plan files.
pub const PLAN_FORMAT: &str = "stretto.plan/v1";

/// One stage: a physical operator (`logical/implementation`) and, for tunable stages, its thresholds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlanStage {
    /// `logical/implementation`, e.g. `positive/smollm2-135m@0.5`.
    pub physical: String,
    /// Scores below it reject (filters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower: Option<f64>,
    /// Scores above it accept (filters) or decide the value (maps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper: Option<f64>,
}

impl PlanStage {
    /// The stage's decision rule as a reader wants it: `reject < 0.120, accept > 0.750` for a filter stage,
    /// `take if confidence > 0.600` for a map stage, `gold rule` for a stage without thresholds. A threshold that can
    /// never hold (infinite or extreme: a stage that never rejects) prints as `never`.
    pub fn rule(&self) -> String {
        match (self.lower, self.upper) {
            (Some(l), Some(u)) => format!("reject {}, accept {}", bound("<", l), bound(">", u)),
            (None, Some(u)) => format!("take if confidence {}", bound(">", u)),
            _ => "gold rule".into(),
        }
    }

    /// The logical operator and implementation names of `physical`.
    pub fn split(&self) -> Result<(&str, &str)> {
        self.physical.split_once('/').filter(|(l, i)| !l.is_empty() && !i.is_empty()).ok_or_else(|| {
            CoreError::InvalidPlan {
                context: format!("stage `{}`", self.physical),
                message: "`physical` must read `logical/implementation`".into(),
            }
        })
    }
}

/// What the optimizer predicted for a plan on its profile.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Predicted {
    /// Expected seconds per input tuple.
    pub cost_per_tuple: f64,
    /// Credible lower bound on precision.
    pub precision_lower_bound: f64,
    /// Credible lower bound on recall.
    pub recall_lower_bound: f64,
}

/// A `stretto.plan/v1` document.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlanFile {
    /// Always [`PLAN_FORMAT`].
    pub format: String,
    /// The query text, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// The query's logical operators, when the plan is meant to be run on its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logical: Vec<SemanticTask>,
    /// Stages in execution order.
    pub stages: Vec<PlanStage>,
    /// The optimizer's prediction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<Predicted>,
    /// Human-readable remarks (e.g. why the plan fell back to gold).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl PlanFile {
    /// A plan with these stages and nothing else.
    pub fn new(stages: Vec<PlanStage>) -> Self {
        Self { format: PLAN_FORMAT.into(), query: None, logical: vec![], stages, predicted: None, warnings: vec![] }
    }

    /// The stages in execution order with their rules, for a plan display:
    /// `f1/embed:minilm [reject never, accept > 0.259] → f1/llm:… [reject < 0.000, accept > 0.000]`.
    pub fn describe_stages(&self) -> String {
        self.stages.iter().map(|s| format!("{} [{}]", s.physical, s.rule())).collect::<Vec<_>>().join(" → ")
    }

    /// Reads and validates a plan file.
    pub fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).map_err(|source| CoreError::Io { path: path.to_path_buf(), source })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates a plan document; `context` names it in errors.
    pub fn parse(text: &str, context: &str) -> Result<Self> {
        let plan: PlanFile =
            serde_json::from_str(text).map_err(|source| CoreError::Json { context: context.to_string(), source })?;
        plan.validate(context)?;
        Ok(plan)
    }

    /// Checks the format tag and every stage's name and thresholds.
    pub fn validate(&self, context: &str) -> Result<()> {
        let bad = |m: String| CoreError::InvalidPlan { context: context.to_string(), message: m };
        if self.format != PLAN_FORMAT {
            return Err(bad(format!("format is `{}`, expected `{PLAN_FORMAT}`", self.format)));
        }
        if self.stages.is_empty() {
            return Err(bad("plan has no stages".into()));
        }
        for s in &self.stages {
            s.split().map_err(|e| bad(e.to_string()))?;
            for (what, v) in [("lower", s.lower), ("upper", s.upper)] {
                if v.is_some_and(|v| !v.is_finite()) {
                    return Err(bad(format!("stage `{}`: {what} threshold is not finite", s.physical)));
                }
            }
            if let (Some(lo), Some(hi)) = (s.lower, s.upper) {
                if lo > hi {
                    return Err(bad(format!("stage `{}`: lower {lo} > upper {hi}", s.physical)));
                }
            }
        }
        Ok(())
    }

    /// Writes the plan as pretty JSON, atomically (temp file + rename), so a crash never leaves half a plan.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|source| CoreError::Json { context: path.display().to_string(), source })?;
        write_atomic(path, text.as_bytes())
    }
}

/// Writes a file atomically: a sibling temp file, flushed, then renamed over the target.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let io = |source| CoreError::Write { path: path.to_path_buf(), source };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
    // Unique per process and per call: two threads writing the same file never share a temporary.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.tmp{}-{n}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    // Whatever fails after the temporary exists (a full disk mid-write, the rename), it goes.
    let written = f.write_all(bytes).and_then(|()| f.sync_all()).and_then(|()| {
        drop(f);
        std::fs::rename(&tmp, path)
    });
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}

/// A threshold `t` under comparison `op` (`<` or `>`): `< 0.250`, or `never` / `always` where it is infinite or
/// extreme.
fn bound(op: &str, t: f64) -> String {
    const NEVER: f64 = 1e300;
    match op {
        "<" if t <= -NEVER => "never".into(),
        ">" if t >= NEVER => "never".into(),
        "<" if t >= NEVER => "always".into(),
        ">" if t <= -NEVER => "always".into(),
        _ if t.is_nan() => "never".into(),
        _ => format!("{op} {t:.3}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_that_can_never_hold_print_as_never() {
        assert_eq!(bound("<", -f64::MAX), "never");
        assert_eq!(bound("<", f64::NEG_INFINITY), "never");
        assert_eq!(bound(">", f64::INFINITY), "never");
        assert_eq!(bound(">", f64::MAX), "never");
        assert_eq!(bound("<", f64::INFINITY), "always");
        assert_eq!(bound("<", -0.25), "< -0.250");
        assert_eq!(bound(">", 1.5), "> 1.500");
        let stage = |lower, upper| PlanStage { physical: "f/x".into(), lower, upper };
        assert_eq!(stage(Some(f64::NEG_INFINITY), Some(0.259)).rule(), "reject never, accept > 0.259");
        assert_eq!(stage(None, Some(0.6)).rule(), "take if confidence > 0.600");
        assert_eq!(stage(None, None).rule(), "gold rule");
    }

    #[test]
    fn parses_the_documented_example() {
        let text = r#"{
          "format": "stretto.plan/v1",
          "stages": [
            {"physical": "positive/minilm",      "lower": 0.05, "upper": 0.62},
            {"physical": "positive/gold",        "lower": 0.0,  "upper": 0.0},
            {"physical": "title/gold"}
          ],
          "predicted": {"cost_per_tuple": 0.0412, "precision_lower_bound": 0.903, "recall_lower_bound": 0.911}
        }"#;
        let plan = PlanFile::parse(text, "example").unwrap();
        assert_eq!(plan.stages.len(), 3);
        assert_eq!(plan.stages[2].upper, None);
        assert_eq!(plan.stages[0].split().unwrap(), ("positive", "minilm"));
        let round = PlanFile::parse(&serde_json::to_string(&plan).unwrap(), "round").unwrap();
        assert_eq!(round, plan);
    }

    #[test]
    fn rejects_bad_plans_naming_the_culprit() {
        let cases = [
            (r#"{"format":"x","stages":[{"physical":"a/b"}]}"#, "format"),
            (r#"{"format":"stretto.plan/v1","stages":[{"physical":"nolslash"}]}"#, "nolslash"),
            (r#"{"format":"stretto.plan/v1","stages":[{"physical":"a/b","lower":2,"upper":1}]}"#, "a/b"),
            (r#"{"format":"stretto.plan/v1","stages":[]}"#, "no stages"),
            (r#"{"format":"stretto.plan/v1","stages":[{"physical":"a/b","lower":"x"}]}"#, "line"),
        ];
        for (text, needle) in cases {
            let err = PlanFile::parse(text, "p.json").unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains("p.json"), "{err}");
        }
    }

    #[test]
    fn a_write_that_fails_says_write_and_names_the_target_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("no-such-folder").join("plan.json");
        let err = write_atomic(&target, b"{}").unwrap_err();
        assert!(matches!(err, CoreError::Write { .. }), "{err}");
        let text = err.to_string();
        assert!(text.starts_with(&format!("cannot write {}", target.display())), "{text}");
        // Into an existing folder it writes, and leaves no temporary beside the file.
        let target = dir.path().join("plan.json");
        write_atomic(&target, b"{}").unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("plan.json")]);
    }
}
