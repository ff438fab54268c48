//! Typed errors of the KV crate.

use std::path::PathBuf;

/// Errors of the KV runtime: running models, KV records, and (wrapped) the toolchain's errors.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// A file or folder could not be accessed.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A model was asked for something it cannot do (an encoder asked to generate...).
    #[error("{0}")]
    Usage(String),
    /// A stored record fails its checks (torn write, flipped bits, wrong shape); `stretto kv repair` rebuilds it.
    #[error("corrupt KV record {path}: {message}")]
    Corrupt {
        /// The record file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// ONNX Runtime failed (loading its library, building a session, running a graph).
    #[error("ONNX Runtime: {0}")]
    Runtime(String),
    /// Fetching, reading or converting a model failed (the toolchain's error, kept as the source).
    #[error(transparent)]
    Model(#[from] stretto_models::ModelError),
    /// A model file is malformed (GGUF, safetensors...).
    #[error("malformed {file}: {message}")]
    Format {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
}

/// Result alias for the KV crate.
pub type Result<T, E = KvError> = std::result::Result<T, E>;

impl From<ort::Error> for KvError {
    fn from(e: ort::Error) -> Self {
        KvError::Runtime(e.to_string())
    }
}

impl KvError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        KvError::Io { path: path.into(), source }
    }
}
