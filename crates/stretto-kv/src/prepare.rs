//! Preparation of runnable models: fetch (see [`crate::models`]), then convert once into the model's folder.
//!
//! A conversion is written into a temporary folder and renamed into place, so a crash never leaves a half-written
//! model that a later run would trust; a conversion by an older converter is redone.

use std::fs;
use std::path::{Path, PathBuf};

use crate::convert::{convert_gguf, DecoderFiles};
use crate::error::{KvError, Result};
use crate::models::{default_source, ensure, spec};

/// The folder of a model's converted decoder.
pub fn decoder_dir(home: &Path, name: &str) -> PathBuf {
    crate::models::model_dir(home, name).join("onnx")
}

/// The converted decoder of catalog model `name`, fetching and converting it first if needed.
pub fn ensure_decoder(home: &Path, name: &str) -> Result<DecoderFiles> {
    let s = spec(name)?;
    if !s.artifacts.iter().any(|a| a.file == "model.gguf") {
        return Err(KvError::Usage(format!(
            "`{name}` is not a decoder LLM (it has no GGUF weights); try smollm2-135m"
        )));
    }
    let dir = decoder_dir(home, name);
    if let Ok(files) = DecoderFiles::open(&dir) {
        return Ok(files);
    }
    convert_atomically(home, name, |model_dir, tmp| convert_gguf(&model_dir.join("model.gguf"), tmp).map(|_| ()))?;
    DecoderFiles::open(&dir)
}

/// The converted sentence encoder of catalog model `name` (a BERT safetensors model such as `minilm`).
pub fn ensure_encoder(home: &Path, name: &str) -> Result<PathBuf> {
    let s = spec(name)?;
    if !s.artifacts.iter().any(|a| a.file == "model.safetensors") {
        return Err(KvError::Usage(format!("`{name}` is not a sentence encoder (it has no BERT weights); try minilm")));
    }
    let dir = decoder_dir(home, name);
    if crate::embed::open_encoder(&dir).is_ok() {
        return Ok(dir);
    }
    convert_atomically(home, name, crate::embed::convert_bert)?;
    crate::embed::open_encoder(&dir)?;
    Ok(dir)
}

/// The converted image classifier of catalog model `name` (`efficientnet-lite0`).
pub fn ensure_classifier(home: &Path, name: &str) -> Result<PathBuf> {
    let s = spec(name)?;
    if !s.artifacts.iter().any(|a| a.file == "model.pth") {
        return Err(KvError::Usage(format!("`{name}` is not an image classifier; try efficientnet-lite0")));
    }
    let dir = decoder_dir(home, name);
    if crate::vision::is_converted(&dir) {
        return Ok(dir);
    }
    convert_atomically(home, name, crate::vision::convert_efficientnet)?;
    Ok(dir)
}

/// Fetches `name`, runs `convert(model_dir, tmp)` into a temporary folder and renames it to the model's `onnx/`.
fn convert_atomically(home: &Path, name: &str, convert: impl FnOnce(&Path, &Path) -> Result<()>) -> Result<()> {
    let model_dir = ensure(spec(name)?, home, default_source().as_ref())?;
    let dir = decoder_dir(home, name);
    let tmp = model_dir.join(format!(".onnx.tmp{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    if let Err(e) = convert(&model_dir, &tmp) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let _ = fs::remove_dir_all(&dir);
    if let Err(e) = fs::rename(&tmp, &dir) {
        let _ = fs::remove_dir_all(&tmp);
        // A concurrent conversion may have won the race; its result is identical.
        if !dir.join("config.json").is_file() {
            return Err(KvError::io(&dir, e));
        }
    }
    if let Ok(d) = fs::File::open(&model_dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Prepares catalog model `name` for use: fetched, verified and, for models that run on ONNX Runtime, converted.
/// Returns the folder to load from.
pub fn ensure_ready(home: &Path, name: &str) -> Result<PathBuf> {
    let s = spec(name)?;
    let has = |f: &str| s.artifacts.iter().any(|a| a.file == f);
    if has("model.gguf") {
        Ok(ensure_decoder(home, name)?.dir)
    } else if has("model.safetensors") {
        ensure_encoder(home, name)
    } else if has("model.pth") {
        ensure_classifier(home, name)
    } else {
        ensure(s, home, default_source().as_ref())
    }
}
