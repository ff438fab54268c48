//! # stretto
//!
//! Stretto as a library: a [`Session`] owns the configuration (model home, KV caches, memo, the LLM ladder,
//! threads), the operator registry and registered tables; a lazy [`DataFrame`] composes relational and semantic
//! operations; [`DataFrame::collect`] profiles the semantic pipeline on a sample, optimizes it under
//! precision/recall targets with a stated credibility, executes the certified cascade and returns a
//! [`QueryResult`] holding the result batch, the plan, its certified bounds, per-stage statistics and timings.
//!
//! ```no_run
//! use stretto::{col, lit, Session, Targets, ValueType};
//!
//! let session = Session::builder("/var/cache/stretto").memo_dir("/tmp/stretto-memo").build()?;
//! let result = session
//!     .read_csv("reviews.csv", &Default::default())?
//!     .filter(col("reviews.istopcritic").eq(lit(true)))?
//!     .sem_filter("{reviews.reviewtext} is clearly positive")?
//!     .sem_map("title", "Extract the movie title mentioned in {reviews.reviewtext}", ValueType::String)?
//!     .collect(Targets::new(0.8, 0.8, 0.95)?)?;
//! println!("{} rows, certified bounds {:?}", result.batch().num_rows(), result.bounds());
//! result.write_parquet("positive.parquet")?;
//! # Ok::<(), stretto::Error>(())
//! ```
//!
//! The crate also re-exports Stretto's crates ([`core`], [`models`], [`kv`], [`ops_text`], [`ops_image`], [`optim`]) and links
//! every operator plugin, so [`registry_for`] sees every operator, with a clear error if a plugin is missing.
//! The [`engine`] module holds the phases the frame runs (also used by the `stretto` CLI and the benchmarks).

#![warn(missing_docs)]

pub mod config;
pub mod dataframe;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod io;
pub mod session;
mod state;

pub use stretto_core as core;
pub use stretto_kv as kv;
pub use stretto_models as models;
pub use stretto_ops_image as ops_image;
pub use stretto_ops_text as ops_text;
pub use stretto_optim as optim;

pub use config::{ExecutionProvider, SessionConfig, UserModel};
pub use dataframe::{DataFrame, OptimizedPlan, ProfiledFrame, QueryResult};
pub use error::{Error, Result};
pub use io::{CsvOptions, FileFormat, ReadOptions};
pub use session::{BundledDataset, Session, SessionBuilder};
pub use stretto_core::expr::{col, lit, Expr};
pub use stretto_core::op::ValueType;
pub use stretto_core::{MemoPolicy, OpContext};
pub use stretto_optim::strategy::{Abacus, Global, Gold, Independent, Local, Lotus, Strategy, Targets};

use stretto_core::op::Registry;

/// The plugin crates this facade links.
pub const PLUGINS: &[&str] = &[stretto_ops_text::PLUGIN, stretto_ops_image::PLUGIN];

/// Names a symbol of every plugin crate so rustc links them and their `inventory` registrations survive.
pub fn link() {
    let _ = (stretto_ops_text::link(), stretto_ops_image::link());
}

/// Links the plugins, discovers every registered operator under `context` and checks that each plugin crate made
/// it in.
///
/// ```
/// let registry = stretto::registry_for(&stretto::OpContext::new("/tmp/stretto-home"))?;
/// for (op, factory) in registry.operators() {
///     println!("{} ({factory}): {}", op.name(), op.properties().family);
/// }
/// # Ok::<(), stretto::core::CoreError>(())
/// ```
pub fn registry_for(context: &OpContext) -> stretto_core::Result<Registry> {
    link();
    let registry = Registry::discover(context)?;
    registry.require_plugins(PLUGINS)?;
    Ok(registry)
}
