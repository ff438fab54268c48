//! # stretto-bench
//!
//! The `stretto` command-line tool and the library behind it: commands that list data and operators and run
//! plans, and (as their issues land) the paper's experiments.
//!
//! ```
//! use stretto_bench::commands;
//! let rows = commands::dataset_rows()?;
//! assert!(rows.iter().any(|d| d.name == "movie" && d.rows == 1000));
//! # Ok::<(), stretto_core::CoreError>(())
//! ```

#![warn(missing_docs)]

pub mod commands;
pub mod experiments;
pub mod kv;
pub mod plots;
pub mod query;
