//! Shared models: every operator of one model (all its compression ratios, filters and maps) uses one loaded
//! session, loaded on first use.
//!
//! Models are shared per (model home, runtime options, name): two sessions over the same home share one loaded
//! copy, two sessions over different homes, thread settings or execution providers each load their own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::convert::Weights;
use crate::decoder::Decoder;
use crate::embed::Embedder;
use crate::error::{KvError, Result};
use crate::runtime::RuntimeOptions;
use crate::vision::Classifier;

type Key = (PathBuf, RuntimeOptions, String);

fn shared<T, K: Ord>(pool: &Mutex<BTreeMap<K, Arc<T>>>, key: K, load: impl FnOnce() -> Result<T>) -> Result<Arc<T>> {
    // Loading under the lock: two operators asking at once must not load a model twice.
    let mut map = pool.lock().map_err(|_| KvError::Runtime("model pool poisoned".into()))?;
    if let Some(m) = map.get(&key) {
        return Ok(m.clone());
    }
    let m = Arc::new(load()?);
    map.insert(key, m.clone());
    Ok(m)
}

/// The shared decoder `name` prepared under `home`, run with `options` (a thread count alone: on the CPU).
pub fn decoder(home: &Path, options: impl Into<RuntimeOptions>, name: &str) -> Result<Arc<Decoder>> {
    decoder_with(home, options, name, Weights::F32)
}

/// The shared decoder `name` whose linear layers store `weights` (its own session beside the f32 one).
pub fn decoder_with(
    home: &Path,
    options: impl Into<RuntimeOptions>,
    name: &str,
    weights: Weights,
) -> Result<Arc<Decoder>> {
    static POOL: Mutex<BTreeMap<(Key, Weights), Arc<Decoder>>> = Mutex::new(BTreeMap::new());
    let options = options.into();
    shared(&POOL, ((home.to_path_buf(), options, name.to_string()), weights), || {
        Decoder::load_with(home, name, weights, options)
    })
}

/// The shared sentence encoder `name` prepared under `home`.
pub fn embedder(home: &Path, options: impl Into<RuntimeOptions>, name: &str) -> Result<Arc<Embedder>> {
    static POOL: Mutex<BTreeMap<Key, Arc<Embedder>>> = Mutex::new(BTreeMap::new());
    let options = options.into();
    shared(&POOL, (home.to_path_buf(), options, name.to_string()), || Embedder::load(home, name, options))
}

/// The shared image classifier prepared under `home`.
pub fn classifier(home: &Path, options: impl Into<RuntimeOptions>) -> Result<Arc<Classifier>> {
    static POOL: Mutex<BTreeMap<Key, Arc<Classifier>>> = Mutex::new(BTreeMap::new());
    let options = options.into();
    shared(&POOL, (home.to_path_buf(), options, "efficientnet-lite0".into()), || Classifier::load(home, options))
}
