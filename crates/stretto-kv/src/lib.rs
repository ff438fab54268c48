//! # stretto-kv
//!
//! Models for Stretto's KV-cache operators: preparing them from registry packages ([`models`], [`prepare`]),
//! reading GGUF weights ([`gguf`]) and tokenizers ([`tokenizer`]), converting decoders to ONNX graphs with KV-past
//! I/O ([`convert`], written by [`onnx`]), and running them on ONNX Runtime loaded from the registry wheel
//! ([`runtime`], [`decoder`]). The on-disk KV cache store and its compression presses are their own issue.
//!
//! ```no_run
//! use stretto_kv::decoder::{Decoder, Step, Want};
//! use stretto_core::context::default_home;
//! // Fetches the pinned wheel and converts GGUF -> ONNX on first use (once per model home).
//! let dec = Decoder::load(&default_home(), "smollm2-135m", 0)?;
//! // Prefill an item once, then ask a question over its cached past.
//! let item = dec.encode(&dec.chat_prompt("Review: a warm, funny film."))?;
//! let (past, _) = dec.prefill(&item, false)?;
//! let question = dec.encode("Is it positive? Answer 1 or 0. Answer:")?;
//! let (yes, no) = (dec.token_id("1")?, dec.token_id("0")?);
//! let log_odds = dec.log_odds(&[&past], &question, yes, no, 8)?;
//! println!("log-odds of '1' over '0': {}", log_odds[0]);
//! # Ok::<(), stretto_kv::KvError>(())
//! ```

#![warn(missing_docs)]

pub mod cache;
pub mod contrast;
pub mod convert;
pub mod decoder;
pub mod embed;
pub mod error;
pub mod gguf;
pub mod models;
pub mod onnx;
pub mod pool;
pub mod prepare;
pub mod press;
pub mod progress;
pub mod runtime;
pub mod store;
pub mod tasks;
pub mod tokenizer;
pub mod torch;
pub mod vision;

pub use decoder::{Decoder, KvPast};
pub use error::{KvError, Result};
