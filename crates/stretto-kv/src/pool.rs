//! Process-wide shared models: every operator of one model (all its compression ratios, filters and maps) uses one
//! loaded session, loaded on first use.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::decoder::Decoder;
use crate::embed::Embedder;
use crate::error::{KvError, Result};
use crate::models::default_home;
use crate::vision::Classifier;

/// Environment variable: intra-op threads of every session (default: ONNX Runtime's choice).
pub const THREADS_ENV: &str = "STRETTO_THREADS";

fn threads() -> usize {
    std::env::var(THREADS_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn shared<T>(pool: &Mutex<BTreeMap<String, Arc<T>>>, name: &str, load: impl FnOnce() -> Result<T>) -> Result<Arc<T>> {
    // Loading under the lock: two operators asking at once must not load a model twice.
    let mut map = pool.lock().map_err(|_| KvError::Runtime("model pool poisoned".into()))?;
    if let Some(m) = map.get(name) {
        return Ok(m.clone());
    }
    let m = Arc::new(load()?);
    map.insert(name.to_string(), m.clone());
    Ok(m)
}

/// The shared decoder `name`.
pub fn decoder(name: &str) -> Result<Arc<Decoder>> {
    static POOL: Mutex<BTreeMap<String, Arc<Decoder>>> = Mutex::new(BTreeMap::new());
    shared(&POOL, name, || Decoder::load(&default_home(), name, threads()))
}

/// The shared sentence encoder `name`.
pub fn embedder(name: &str) -> Result<Arc<Embedder>> {
    static POOL: Mutex<BTreeMap<String, Arc<Embedder>>> = Mutex::new(BTreeMap::new());
    shared(&POOL, name, || Embedder::load(&default_home(), name, threads()))
}

/// The shared image classifier.
pub fn classifier() -> Result<Arc<Classifier>> {
    static POOL: Mutex<BTreeMap<String, Arc<Classifier>>> = Mutex::new(BTreeMap::new());
    shared(&POOL, "efficientnet-lite0", || Classifier::load(&default_home(), threads()))
}
