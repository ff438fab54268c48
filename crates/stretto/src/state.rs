//! What a session shares with the frames it made: configuration, the operator registry, registered tables.

use std::collections::BTreeMap;
use std::sync::{RwLock, RwLockReadGuard};

use arrow::array::RecordBatch;
use stretto_core::op::Registry;

use crate::config::SessionConfig;

/// A session's shared state (a [`Session`](crate::Session) and its frames hold it behind an `Arc`).
pub(crate) struct SessionState {
    pub(crate) config: SessionConfig,
    pub(crate) registry: RwLock<Registry>,
    pub(crate) tables: RwLock<BTreeMap<String, RecordBatch>>,
}

impl SessionState {
    /// The operator registry (read access).
    pub(crate) fn registry(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|p| p.into_inner())
    }
}
