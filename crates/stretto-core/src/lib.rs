//! # stretto-core
//!
//! The data model and execution core of Stretto, an engine for *semantic queries*: relational operators plus
//! LLM-powered filters, maps and joins over tables whose columns hold text and images.
//!
//! - [`table`] and [`datasets`]: tables are Arrow [`RecordBatch`](arrow::array::RecordBatch)es; CSV loading with
//!   declared column kinds (text, integer, number, boolean, image) and the bundled benchmark datasets by name.
//! - [`plan`] and [`expr`]: logical plans, the [`PlanBuilder`](plan::PlanBuilder) API and semantic pull-up.
//! - [`op`]: the object-safe [`PhysicalOp`](op::PhysicalOp) trait (what an operator implements: one evaluation
//!   over its items), the [`RegisteredOp`](op::RegisteredOp) that does the shared work around it (task kind,
//!   applicability, items, memo, costs), and the link-time [`Registry`](op::Registry) that plugin crates feed
//!   through `inventory::submit!`, built under an [`OpContext`].
//! - [`exec`]: the [`CascadeExecutor`](exec::CascadeExecutor), which applies a `stretto.plan/v1`
//!   ([`format::PlanFile`]) stage by stage: accept, reject, or pass the tuple on as *unsure*.
//! - [`memo`]: the persistent [`Memo`](memo::Memo) of operator answers, and the
//!   [`CostRecord`](memo::CostRecord) of what they cost per operator, item and task, which pay checks read before
//!   asking an operator.
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{RecordBatch, StringArray};
//! use arrow::datatypes::{DataType, Field, Schema};
//! use stretto_core::exec::{CascadeExecutor, CascadePlan};
//! use stretto_core::format::{PlanFile, PlanStage};
//! use stretto_core::op::{time_evenly, LogicalKind, Modality, OpOutput, OpProperties, PhysicalOp, RegisteredOp, SemanticTask};
//!
//! /// Scores a tuple by the length of its text (a stand-in for an LLM's log-odds).
//! #[derive(Debug)]
//! struct Length(OpProperties);
//! impl PhysicalOp for Length {
//!     fn name(&self) -> &str { "length" }
//!     fn properties(&self) -> &OpProperties { &self.0 }
//!     fn evaluate_items(&self, _: &SemanticTask, items: &[String]) -> stretto_core::Result<(OpOutput, Vec<f64>)> {
//!         time_evenly(items.len(), || Ok(OpOutput::Scores(items.iter().map(|t| t.len() as f64 - 3.0).collect())))
//!     }
//! }
//! let op = Arc::new(RegisteredOp::new(Arc::new(Length(OpProperties {
//!     kind: LogicalKind::Filter, family: "length".into(), modality: Modality::Text, model: None,
//!     compression: None, tunable: true, gold: true, cost_hint: 1e-7, score_range: (-10.0, 10.0),
//! })), stretto_core::MemoPolicy::Off));
//! let table = RecordBatch::try_new(
//!     Arc::new(Schema::new(vec![Field::new("t.text", DataType::Utf8, true)])),
//!     vec![Arc::new(StringArray::from(vec!["hi", "hello"]))],
//! )?;
//! let plan = PlanFile::new(vec![PlanStage { physical: "long/length".into(), lower: None, upper: None }]);
//! let cascade = CascadePlan::bind(&plan, vec![SemanticTask::filter("long", "{t.text} is long")], |_| Ok(op.clone()))?;
//! let out = CascadeExecutor::new(16).with_progress(false).execute(&cascade, &table)?;
//! assert_eq!(out.rows, vec![1]); // "hello" scores 2 > 0 and is accepted; "hi" scores -1 and is rejected
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod conformance;
pub mod context;
pub mod datasets;
pub mod error;
pub mod exec;
pub mod expr;
pub mod format;
pub mod memo;
pub mod metrics;
pub mod op;
pub mod plan;
pub mod table;

pub use context::{MemoPolicy, OpContext};
pub use error::{CoreError, Result};

/// Re-exported so plugin crates use the same `inventory` as the registry.
pub use inventory;
