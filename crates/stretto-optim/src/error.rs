//! Typed errors of the optimizer.

/// Errors from reading profiles and plans, and from optimizing.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// A file could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The document is not JSON.
    #[error("invalid JSON in {context}: {source}")]
    Json {
        /// The document.
        context: String,
        /// The parser's error, with line and column.
        source: serde_json::Error,
    },
    /// A profile is structurally valid JSON but breaks the `stretto.profile/v1` contract.
    #[error("invalid profile: field `{field}`: {message}")]
    InvalidProfile {
        /// Path of the offending field, e.g. `physical[3].scores[17]`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A plan does not fit the profile it is applied to.
    #[error("plan does not fit the profile: {0}")]
    PlanMismatch(String),
    /// Targets or settings out of range.
    #[error("invalid setting `{setting}`: {message}")]
    InvalidSetting {
        /// The setting (`precision`, `recall`, `credible`...).
        setting: String,
        /// What is wrong.
        message: String,
    },
    /// The numerical solver failed.
    #[error("solver failed: {0}")]
    Solver(String),
    /// A core error (plan files).
    #[error(transparent)]
    Core(#[from] stretto_core::CoreError),
}

/// Result alias for the optimizer.
pub type Result<T, E = OptimError> = std::result::Result<T, E>;

impl OptimError {
    pub(crate) fn profile(field: impl Into<String>, message: impl Into<String>) -> Self {
        OptimError::InvalidProfile { field: field.into(), message: message.into() }
    }
}
