//! # stretto-bench
//!
//! The `stretto` command-line tool and the library behind it: commands that list data and operators and run
//! plans, semantic queries end to end ([`query`], the facade's engine), and the paper's experiments ([`experiments`], with SVG figures
//! from [`plots`]), SemBench's movie scenario in Stretto SQL scored against the labels ([`sembench`]), and Stretto beside llama.cpp on
//! the same GGUF files ([`peer`]), the memory and disk of a cold query under budgets ([`memory`]), and the image
//! operators against the photos' derived labels ([`photos`]).
//!
//! ```
//! use stretto_bench::commands;
//! let rows = commands::dataset_rows()?;
//! assert!(rows.iter().any(|d| d.name == "movie" && d.rows == 1000));
//! # Ok::<(), stretto_core::CoreError>(())
//! ```

#![warn(missing_docs)]

pub mod cluster;
pub mod commands;
pub mod demo;
pub mod encoders;
pub mod experiments;
pub mod kv;
pub mod memory;
pub mod peer;
pub mod photos;
pub mod plots;
pub mod protocols;
pub mod quant;
pub mod sembench;
pub use stretto::engine as query;
