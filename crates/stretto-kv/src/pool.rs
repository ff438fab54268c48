//! Shared models: every operator of one model (all its compression ratios, filters and maps) uses one loaded
//! session, loaded on first use (and again after it was freed).
//!
//! Models are shared per (model home, runtime options, name): two sessions over the same home share one loaded
//! copy, two sessions over different homes, thread settings or execution providers each load their own. A user's
//! own model is shared per registration too ([`crate::prepare::registration_id`]): once its name is registered again
//! for another file, every session that asks for it gets the new model, never the copy loaded before. The pool
//! keeps no model alive itself: a model lives while someone holds what it handed out. Operators look models up
//! through `stretto_ops_text::{decoder, embedder, classifier}`, which hold them in the operator context's
//! `ModelHold`, so dropping a session frees the models only it held; a direct caller keeps its `Arc` itself.
//!
//! ```no_run
//! let home = std::path::Path::new("/var/cache/stretto");
//! let dec = stretto_kv::pool::decoder(home, 1usize, "smollm2-135m")?;
//! assert!(stretto_kv::pool::is_loaded(home, 1usize, "smollm2-135m"));
//! drop(dec);
//! assert!(!stretto_kv::pool::is_loaded(home, 1usize, "smollm2-135m"));
//! # Ok::<(), stretto_kv::KvError>(())
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use crate::convert::Weights;
use crate::decoder::Decoder;
use crate::embed::Embedder;
use crate::error::{KvError, Result};
use crate::runtime::RuntimeOptions;
use crate::vision::Classifier;

type Key = (PathBuf, RuntimeOptions, String);
type Pool<K, T> = Mutex<BTreeMap<K, Weak<T>>>;

/// The live copy of `key` in `pool`, or one `load`ed now.
fn shared<T, K: Ord>(pool: &Pool<K, T>, key: K, load: impl FnOnce() -> Result<T>) -> Result<Arc<T>> {
    // Loading under the lock: two operators asking at once must not load a model twice.
    let mut map = pool.lock().map_err(|_| KvError::Runtime("model pool poisoned".into()))?;
    let m = match map.get(&key).and_then(Weak::upgrade) {
        Some(m) => m,
        None => {
            let m = Arc::new(load()?);
            map.retain(|_, w| w.strong_count() > 0);
            map.insert(key, Arc::downgrade(&m));
            m
        }
    };
    Ok(m)
}

/// The pool key of model `name` under `home` run with `options`: a user's model's name carries its registration.
fn key(home: &Path, options: RuntimeOptions, name: &str) -> Key {
    let registration = crate::prepare::registration_id(home, name);
    (home.to_path_buf(), options, crate::prepare::with_registration(name.to_string(), registration.as_deref()))
}

/// Whether `pool` has a live copy of `key`.
fn live<T, K: Ord>(pool: &Pool<K, T>, key: &K) -> bool {
    pool.lock().is_ok_and(|map| map.get(key).is_some_and(|w| w.strong_count() > 0))
}

static DECODERS: Pool<(Key, Weights), Decoder> = Mutex::new(BTreeMap::new());
static EMBEDDERS: Pool<Key, Embedder> = Mutex::new(BTreeMap::new());
static CLASSIFIERS: Pool<Key, Classifier> = Mutex::new(BTreeMap::new());

/// Whether the f32 decoder `name` prepared under `home`, run with `options`, is loaded (someone holds it).
pub fn is_loaded(home: &Path, options: impl Into<RuntimeOptions>, name: &str) -> bool {
    live(&DECODERS, &(key(home, options.into(), name), Weights::F32))
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
    let options = options.into();
    shared(&DECODERS, (key(home, options, name), weights), || Decoder::load_with(home, name, weights, options))
}

/// The shared sentence encoder `name` prepared under `home`.
pub fn embedder(home: &Path, options: impl Into<RuntimeOptions>, name: &str) -> Result<Arc<Embedder>> {
    let options = options.into();
    shared(&EMBEDDERS, key(home, options, name), || Embedder::load(home, name, options))
}

/// The shared image classifier prepared under `home`.
pub fn classifier(home: &Path, options: impl Into<RuntimeOptions>) -> Result<Arc<Classifier>> {
    let options = options.into();
    shared(&CLASSIFIERS, (home.to_path_buf(), options, "efficientnet-lite0".into()), || Classifier::load(home, options))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_model_lives_while_someone_holds_it_and_is_loaded_again_after() {
        let pool: Pool<u8, String> = Mutex::new(BTreeMap::new());
        let loads = AtomicUsize::new(0);
        let load = || {
            loads.fetch_add(1, Ordering::SeqCst);
            Ok(String::from("model"))
        };
        let first = shared(&pool, 1, load).unwrap();
        // Held: the same copy, no second load.
        let again = shared(&pool, 1, load).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        drop(first);
        assert!(live(&pool, &1), "`again` still holds it");
        drop(again);
        assert!(!live(&pool, &1), "nobody holds it: freed");
        shared(&pool, 1, load).unwrap();
        assert_eq!(loads.load(Ordering::SeqCst), 2, "loaded again");
        // A failed load leaves nothing behind.
        assert!(shared(&pool, 2, || Err(KvError::Runtime("no such model".into()))).is_err());
        assert!(!live(&pool, &2));
    }
}
