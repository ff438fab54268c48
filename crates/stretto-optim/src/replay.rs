//! Replaying a plan on a profile: what the plan would achieve on the profiled tuples, without running a model.

use stretto_core::format::PlanFile;

use crate::error::Result;
use crate::problem::Problem;
use crate::profile::Profile;

/// What a plan achieves on a profile, against the profile's gold plan.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ReplayResult {
    /// Precision (1 when the result is empty).
    pub precision: f64,
    /// Recall (1 when the gold result is empty).
    pub recall: f64,
    /// Seconds per tuple.
    pub cost_per_tuple: f64,
}

/// Applies `plan` to every tuple of `profile` with the executor's semantics.
pub fn replay(profile: &Profile, plan: &PlanFile) -> Result<ReplayResult> {
    plan.validate("plan")?;
    let problem = Problem::from_profile(profile)?;
    let hard = problem.from_plan_file(plan)?;
    let c = problem.evaluate(&hard, &problem.all_rows());
    Ok(ReplayResult { precision: c.precision(), recall: c.recall(), cost_per_tuple: c.cost_per_tuple() })
}
