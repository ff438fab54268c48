//! Preparation of runnable models: fetch (see [`crate::models`]), then convert once into the model's folder.
//!
//! A conversion is written into a temporary folder and renamed into place, so a crash never leaves a half-written
//! model that a later run would trust; a conversion by an older converter is redone.

use std::fs;
use std::path::{Path, PathBuf};

use crate::convert::{convert_gguf, DecoderFiles};
use crate::error::{ModelError, Result};
use crate::models::{default_source, ensure, spec};

/// The folder of a model's converted decoder.
pub fn decoder_dir(home: &Path, name: &str) -> PathBuf {
    crate::models::model_dir(home, name).join("onnx")
}

/// The converted decoder of catalog model `name` (fetching and converting it first if needed), or of a decoder a
/// user registered under `name` ([`register_gguf`]).
pub fn ensure_decoder(home: &Path, name: &str) -> Result<DecoderFiles> {
    if spec(name).is_err() && is_user_model(home, name) {
        return DecoderFiles::open(&decoder_dir(home, name));
    }
    let s = spec(name)?;
    if !s.artifacts.iter().any(|a| a.file == "model.gguf") {
        return Err(ModelError::Usage(format!(
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
        return Err(ModelError::Usage(format!(
            "`{name}` is not a sentence encoder (it has no BERT weights); try minilm"
        )));
    }
    let dir = decoder_dir(home, name);
    if crate::bert::open_encoder(&dir).is_ok() {
        return Ok(dir);
    }
    convert_atomically(home, name, crate::bert::convert_bert)?;
    crate::bert::open_encoder(&dir)?;
    Ok(dir)
}

/// The converted image classifier of catalog model `name` (`efficientnet-lite0`).
pub fn ensure_classifier(home: &Path, name: &str) -> Result<PathBuf> {
    let s = spec(name)?;
    if !s.artifacts.iter().any(|a| a.file == "model.pth") {
        return Err(ModelError::Usage(format!("`{name}` is not an image classifier; try efficientnet-lite0")));
    }
    let dir = decoder_dir(home, name);
    if crate::efficientnet::is_converted(&dir) {
        return Ok(dir);
    }
    convert_atomically(home, name, crate::efficientnet::convert_efficientnet)?;
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
            return Err(ModelError::io(&dir, e));
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

/// The file that marks a model folder as a user's own decoder: where its GGUF came from, its size and time.
const USER_SOURCE: &str = "user-source.json";

/// Where a registered decoder's GGUF came from; the conversion is redone when any of it changes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct UserSource {
    gguf: PathBuf,
    bytes: u64,
    modified_ns: u128,
}

/// Whether `name` is a decoder a user registered under `home`.
pub fn is_user_model(home: &Path, name: &str) -> bool {
    crate::models::model_dir(home, name).join(USER_SOURCE).is_file()
}

/// Whether `name` is a decoder this home can load: a catalog model, or one a user registered. The error names the
/// catalog.
pub fn check_decoder_name(home: &Path, name: &str) -> Result<()> {
    if is_user_model(home, name) {
        return Ok(());
    }
    spec(name).map(|_| ())
}

/// Registers a user's own GGUF decoder (architecture `llama` or `qwen2`) as model `name` under `home`, converting
/// it to an ONNX graph with KV-past I/O once (and again whenever the file changes). It is then loaded, pooled and
/// cached like a catalog model, and can be any rung of the ladder, gold included.
///
/// Errors name the file: one that is not a GGUF file, an unsupported architecture, a name that is a catalog
/// model's or holds characters a folder name cannot.
pub fn register_gguf(home: &Path, name: &str, gguf: &Path) -> Result<DecoderFiles> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) || name.starts_with('.')
    {
        return Err(ModelError::Usage(format!(
            "model name `{name}` must be letters, digits, '.', '_' or '-' (and not start with '.')"
        )));
    }
    if spec(name).is_ok() {
        return Err(ModelError::Usage(format!("`{name}` is a catalog model; register your file under another name")));
    }
    let meta = fs::metadata(gguf).map_err(|e| ModelError::io(gguf, e))?;
    let g = crate::gguf::Gguf::open(gguf)?;
    let arch = g.meta("general.architecture").ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    if arch != "llama" && arch != "qwen2" {
        return Err(ModelError::Format {
            file: gguf.display().to_string(),
            message: format!("architecture `{arch}` is not supported; Stretto converts llama and qwen2 decoders"),
        });
    }
    drop(g);
    let source = UserSource {
        gguf: fs::canonicalize(gguf).map_err(|e| ModelError::io(gguf, e))?,
        bytes: meta.len(),
        modified_ns: meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos()),
    };
    let model_dir = crate::models::model_dir(home, name);
    let marker = model_dir.join(USER_SOURCE);
    let dir = decoder_dir(home, name);
    let known = fs::read_to_string(&marker).ok().and_then(|t| serde_json::from_str::<UserSource>(&t).ok());
    if known.as_ref() == Some(&source) {
        if let Ok(files) = DecoderFiles::open(&dir) {
            return Ok(files);
        }
    }
    let _span = tracing::info_span!("register_gguf", model = name, gguf = %gguf.display()).entered();
    fs::create_dir_all(&model_dir).map_err(|e| ModelError::io(&model_dir, e))?;
    // The marker goes first (so a half-done registration is never mistaken for a catalog download) and is
    // rewritten last; the graph is converted into a temporary folder and renamed into place.
    let _ = fs::remove_file(&marker);
    let tmp = model_dir.join(format!(".onnx.tmp{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    if let Err(e) = convert_gguf(gguf, &tmp) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&tmp, &dir).map_err(|e| ModelError::io(&dir, e))?;
    let text = serde_json::to_string_pretty(&source).unwrap_or_default();
    let tmp_marker = model_dir.join(format!(".{USER_SOURCE}.tmp{}", std::process::id()));
    fs::write(&tmp_marker, text).map_err(|e| ModelError::io(&tmp_marker, e))?;
    fs::rename(&tmp_marker, &marker).map_err(|e| ModelError::io(&marker, e))?;
    DecoderFiles::open(&dir)
}
