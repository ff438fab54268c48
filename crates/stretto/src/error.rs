//! The one error type of the facade: every crate's error wrapped with its source chain kept, plus the errors of
//! reading and writing user files, each naming the file and, where it can, the line, row group or column.

use std::path::PathBuf;

/// Errors of a [`Session`](crate::Session) and its frames.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Data model, plans, operators, execution.
    #[error(transparent)]
    Core(#[from] stretto_core::CoreError),
    /// Fetching, reading or converting models (the catalog, a user's GGUF file).
    #[error(transparent)]
    Model(#[from] stretto_models::ModelError),
    /// Running models, KV caches, ONNX Runtime.
    #[error(transparent)]
    Kv(#[from] stretto_kv::KvError),
    /// Profiles, targets, the optimizer.
    #[error(transparent)]
    Optim(#[from] stretto_optim::OptimError),
    /// An Arrow kernel failed on in-memory data.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// A user file could not be read: missing, malformed, or not what it claims to be.
    #[error("cannot read {}{}: {message}", path.display(), location.as_deref().map(|l| format!(" ({l})")).unwrap_or_default())]
    Read {
        /// The file.
        path: PathBuf,
        /// Where in it, when known (`line 7`, `row group 2`, `column reviews.text`).
        location: Option<String>,
        /// What is wrong.
        message: String,
        /// The reader's own error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A result could not be written; nothing is left at `path`.
    #[error("cannot write {}: {message}", path.display())]
    Write {
        /// The destination.
        path: PathBuf,
        /// What went wrong.
        message: String,
        /// The writer's own error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A query or frame that cannot run as written (no semantic operator, an unknown table, an empty input...).
    #[error("{0}")]
    Query(String),
}

impl Error {
    /// A read error without an underlying reader error.
    pub(crate) fn read(path: impl Into<PathBuf>, location: Option<String>, message: impl Into<String>) -> Self {
        Error::Read { path: path.into(), location, message: message.into(), source: None }
    }

    /// A write error with its cause.
    pub(crate) fn write(
        path: impl Into<PathBuf>,
        message: impl Into<String>,
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Write { path: path.into(), message: message.into(), source }
    }
}

/// Results of the facade.
pub type Result<T, E = Error> = std::result::Result<T, E>;
