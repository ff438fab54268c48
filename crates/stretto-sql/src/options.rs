//! Per-query settings of the semantic pipeline, as DataFusion configuration: `SET stretto.recall = 0.8`.

use datafusion::common::config::ConfigExtension;
use datafusion::common::{extensions_options, plan_err, Result};
use stretto::Targets;

extensions_options! {
    /// The `stretto.*` settings a query's semantic pipeline runs under.
    pub struct StrettoOptions {
        /// Precision target in (0, 1], against the gold plan.
        pub precision: f64, default = 0.9
        /// Recall target in (0, 1], against the gold plan.
        pub recall: f64, default = 0.9
        /// Credible level of the guarantee, in (0, 1).
        pub credible: f64, default = 0.95
        /// Strategy: global, local, independent, lotus, abacus or gold.
        pub method: String, default = "global".to_string()
        /// Tuples the certified cascade executes at a time; a LIMIT above the pipeline stops it between batches.
        pub batch_rows: usize, default = 64
    }
}

impl ConfigExtension for StrettoOptions {
    const PREFIX: &'static str = "stretto";
}

impl StrettoOptions {
    /// The targets, checked.
    pub fn targets(&self) -> Result<Targets> {
        Targets::new(self.precision, self.recall, self.credible)
            .or_else(|e| plan_err!("stretto.precision / stretto.recall / stretto.credible: {e}"))
    }

    /// Checks every setting, naming the one that is wrong.
    pub fn validate(&self) -> Result<()> {
        self.targets()?;
        if let Err(e) = stretto::optim::strategy::strategy(&self.method) {
            return plan_err!("stretto.method: {e}");
        }
        if self.batch_rows == 0 {
            return plan_err!("stretto.batch_rows must be at least 1");
        }
        Ok(())
    }
}
