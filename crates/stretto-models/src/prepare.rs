//! Preparation of runnable models: fetch (see [`crate::models`]), then convert once into the model's folder.
//!
//! A conversion is written into a temporary folder and renamed into place, so a crash never leaves a half-written
//! model that a later run would trust; a conversion by an older converter is redone.

use std::fs;
use std::path::{Path, PathBuf};

use crate::bert::EncoderFiles;
use crate::convert::{convert_gguf, convert_gguf_with, DecoderFiles, Weights};
use crate::error::{ModelError, Result};
use crate::export::{Export, ExportKind};
use crate::models::{decoder_spec, default_source, ensure, spec};

/// The folder of a model's converted decoder.
pub fn decoder_dir(home: &Path, name: &str) -> PathBuf {
    crate::models::model_dir(home, name).join("onnx")
}

/// The converted decoder of catalog model `name` (fetching and converting it first if needed), or of a decoder a
/// user registered under `name` ([`register_gguf`]), with the system prompt the catalog sets for it.
pub fn ensure_decoder(home: &Path, name: &str) -> Result<DecoderFiles> {
    converted_decoder(home, name).map(|files| with_catalog_system_prompt(name, files))
}

/// [`ensure_decoder`] as converted, before the catalog's system prompt.
fn converted_decoder(home: &Path, name: &str) -> Result<DecoderFiles> {
    if spec(name).is_err() {
        match user_kind(home, name) {
            Some(UserKind::Decoder) => {
                check_registration(home, name)?;
                let mut files = DecoderFiles::open(&decoder_dir(home, name))?;
                files.config.registration = registration_id(home, name);
                return Ok(files);
            }
            Some(UserKind::Encoder) => {
                return Err(ModelError::Usage(format!("`{name}` is a sentence encoder, not a decoder LLM")))
            }
            None => {}
        }
    }
    let s = decoder_spec(name)?;
    if !s.artifacts.iter().any(|a| a.file == "model.gguf") {
        return Err(ModelError::Usage(format!(
            "`{name}` is not a decoder LLM (it has no GGUF weights); try smollm2-135m"
        )));
    }
    let dir = decoder_dir(home, name);
    if let Ok(files) = DecoderFiles::open(&dir) {
        return Ok(with_context_length(home, name, files));
    }
    convert_atomically(
        home,
        name,
        Weights::F32.folder(),
        |d| DecoderFiles::open(d).is_ok(),
        |model_dir, tmp| convert_gguf(&model_dir.join("model.gguf"), tmp).map(|_| ()),
    )?;
    DecoderFiles::open(&dir)
}

/// A catalog decoder with the system prompt the catalog sets for it ([`crate::models::system_prompt`]) in place of
/// the one its conversion read from the GGUF chat template; unchanged where the catalog sets none. Only the returned
/// config changes (`config.json` keeps the converted default), so setting or changing the catalog's prompt needs no
/// conversion: the items' caches, keyed by their prefix text, follow it.
fn with_catalog_system_prompt(name: &str, mut files: DecoderFiles) -> DecoderFiles {
    if let Some(text) = crate::models::system_prompt(name) {
        files.config.system_prompt = text.to_string();
    }
    files
}

/// A catalog decoder converted before `config.json` recorded the context length: the length is read from the
/// model's GGUF header and written into the config (atomically: a temporary file renamed over it), so that items
/// are cut to the model's context without converting again. Where the GGUF cannot be read or the folder cannot be
/// written, the files are returned as they are (items are then not cut).
fn with_context_length(home: &Path, name: &str, mut files: DecoderFiles) -> DecoderFiles {
    if files.config.context_length.is_some() {
        return files;
    }
    let gguf = crate::models::model_dir(home, name).join("model.gguf");
    let Ok(g) = crate::gguf::Gguf::open(&gguf) else { return files };
    let key = format!("{}.context_length", files.config.arch);
    let Some(n) = g.metadata.get(&key).and_then(|v| v.as_u64()).filter(|&n| n > 0) else { return files };
    files.config.context_length = Some(n as usize);
    let cpath = files.dir.join("config.json");
    let tmp = crate::fsutil::unique_tmp(&files.dir, "config.json");
    let written = serde_json::to_vec_pretty(&files.config)
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            fs::File::create(&tmp)
                .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes).and_then(|()| f.sync_all()))
                .map_err(|e| e.to_string())
        })
        .and_then(|()| fs::rename(&tmp, &cpath).map_err(|e| e.to_string()));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        tracing::debug!(config = %cpath.display(), error = %e, "could not record the context length");
    }
    files
}

/// [`ensure_decoder`] with the linear layers' weights stored as `weights` says: [`Weights::Int8`] is a second
/// conversion of a catalog model's GGUF, in the model's `onnx-int8/` folder, made on first use.
pub fn ensure_decoder_with(home: &Path, name: &str, weights: Weights) -> Result<DecoderFiles> {
    if weights == Weights::F32 {
        return ensure_decoder(home, name);
    }
    converted_decoder_with(home, name, weights).map(|files| with_catalog_system_prompt(name, files))
}

/// [`ensure_decoder_with`] for weights other than f32, as converted, before the catalog's system prompt.
fn converted_decoder_with(home: &Path, name: &str, weights: Weights) -> Result<DecoderFiles> {
    let s = spec(name).map_err(|_| {
        ModelError::Usage(format!("`{name}`: {} weights are made from a catalog model's GGUF file", weights.as_str()))
    })?;
    if !s.artifacts.iter().any(|a| a.file == "model.gguf") {
        return Err(ModelError::Usage(format!("`{name}` is not a decoder LLM (it has no GGUF weights)")));
    }
    let dir = crate::models::model_dir(home, name).join(weights.folder());
    let open = |d: &Path| DecoderFiles::open(d).ok().filter(|f| f.config.weights == weights);
    if let Some(files) = open(&dir) {
        return Ok(with_context_length(home, name, files));
    }
    convert_atomically(
        home,
        name,
        weights.folder(),
        |d| open(d).is_some(),
        |model_dir, tmp| convert_gguf_with(&model_dir.join("model.gguf"), tmp, weights).map(|_| ()),
    )?;
    open(&dir).ok_or_else(|| ModelError::Graph(format!("{}: the conversion left no decoder", dir.display())))
}

/// The converted sentence encoder of catalog model `name` (a BERT safetensors model such as `minilm`), or an
/// encoder export a user registered under `name` ([`register_model`]).
pub fn ensure_encoder(home: &Path, name: &str) -> Result<EncoderFiles> {
    if spec(name).is_err() {
        match user_kind(home, name) {
            Some(UserKind::Encoder) => return EncoderFiles::open(&decoder_dir(home, name)),
            Some(UserKind::Decoder) => {
                return Err(ModelError::Usage(format!("`{name}` is a decoder LLM, not a sentence encoder")))
            }
            None => {}
        }
    }
    let s = spec(name)?;
    if !s.is_encoder() {
        return Err(ModelError::Usage(format!("`{name}` is not a sentence encoder; try minilm or mpnet")));
    }
    let dir = decoder_dir(home, name);
    if let Ok(files) = EncoderFiles::open(&dir) {
        return Ok(files);
    }
    convert_atomically(home, name, "onnx", |d| EncoderFiles::open(d).is_ok(), crate::bert::convert_bert)?;
    EncoderFiles::open(&dir)
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
    convert_atomically(
        home,
        name,
        "onnx",
        crate::efficientnet::is_converted,
        crate::efficientnet::convert_efficientnet,
    )?;
    Ok(dir)
}

/// Fetches `name`, runs `convert(model_dir, tmp)` into a temporary folder and renames it to the model's `folder`
/// (`onnx`, or a variant's). `done(dir)` says whether the conversion is already there; it is asked again once this
/// caller holds the folder's conversion lock, so a second thread or process converting the same model waits and
/// then reuses it.
fn convert_atomically(
    home: &Path,
    name: &str,
    folder: &str,
    done: impl Fn(&Path) -> bool,
    convert: impl FnOnce(&Path, &Path) -> Result<()>,
) -> Result<()> {
    let model_dir = ensure(spec(name)?, home, default_source().as_ref())?;
    let dir = model_dir.join(folder);
    let lock = if folder == "onnx" { "convert".to_string() } else { format!("convert-{folder}") };
    let _lock = crate::fsutil::lock_exclusive(&crate::fsutil::model_lock(home, name, &lock))?;
    crate::fsutil::remove_stale_tmps(&model_dir, folder);
    if done(&dir) {
        return Ok(());
    }
    let tmp = crate::fsutil::unique_tmp(&model_dir, folder);
    if let Err(e) = convert(&model_dir, &tmp).and_then(|()| crate::fsutil::sync_tree(&tmp)) {
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
        Ok(ensure_encoder(home, name)?.dir)
    } else if has("model.pth") {
        ensure_classifier(home, name)
    } else {
        ensure(s, home, default_source().as_ref())
    }
}

/// The file that marks a model folder as a user's own model: where its file came from, its size and time.
const USER_SOURCE: &str = "user-source.json";

/// What a user registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum UserKind {
    /// A decoder LLM (a GGUF file, or an ONNX export with KV-past I/O): a possible ladder rung.
    #[default]
    Decoder,
    /// A sentence encoder (an ONNX export): embedding filters can use it.
    Encoder,
}

/// What a registration checks and records, in versions: 1 checks that a decoder speaks ChatML and reads its system
/// prompt from its chat template. A decoder registered at an earlier version is registered again by its next
/// `--model` (its source no longer matches), and refused by name alone until then ([`check_registration`]).
const REGISTRATION: u32 = 1;

/// Where a registered model came from; the registration is redone when any of it changes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct UserSource {
    /// The GGUF file, or the export folder.
    #[serde(alias = "gguf")]
    path: PathBuf,
    /// Size and modification time of the GGUF file or of the export's ONNX model.
    bytes: u64,
    modified_ns: u128,
    #[serde(default)]
    kind: UserKind,
    /// The [`REGISTRATION`] version that wrote it (0: before versions were recorded).
    #[serde(default)]
    registration: u32,
}

impl UserSource {
    fn of(path: &Path, file: &Path, kind: UserKind) -> Result<Self> {
        let meta = fs::metadata(file).map_err(|e| ModelError::io(file, e))?;
        Ok(Self {
            path: fs::canonicalize(path).map_err(|e| ModelError::io(path, e))?,
            bytes: meta.len(),
            modified_ns: meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos()),
            kind,
            registration: REGISTRATION,
        })
    }
}

/// Refuses a decoder a user registered under `name` with an older Stretto, whose checks it may not pass (a chat
/// format other than ChatML) and whose converted system prompt may not be its own.
fn check_registration(home: &Path, name: &str) -> Result<()> {
    match read_source(home, name) {
        Some(s) if s.kind == UserKind::Decoder && s.registration < REGISTRATION => Err(ModelError::Usage(format!(
            "decoder `{name}` was registered by an older Stretto, which neither checked that it speaks ChatML \
             (Stretto's prompt format) nor read its system prompt from its chat template; register it again from \
             {}: `--model {name}=PATH` on the command line, `.model(\"{name}\", PATH)` in a session",
            s.path.display()
        ))),
        _ => Ok(()),
    }
}

fn read_source(home: &Path, name: &str) -> Option<UserSource> {
    let marker = crate::models::model_dir(home, name).join(USER_SOURCE);
    fs::read_to_string(marker).ok().and_then(|t| serde_json::from_str::<UserSource>(&t).ok())
}

/// For a model a user registered as `name` under `home`, a short digest of its registration (the file or folder,
/// its size and time, what it is): it changes whenever the registration is redone for another file or a changed
/// one. Caches and memoised answers of a user's model are kept under it besides the name
/// ([`crate::convert::DecoderConfig::registration`]). `None` for a catalog model.
pub fn registration_id(home: &Path, name: &str) -> Option<String> {
    use sha2::{Digest, Sha256};
    // (A catalog model is never a registration, whatever its folder holds: its keys never change.)
    if spec(name).is_ok() {
        return None;
    }
    let source = read_source(home, name)?;
    let digest = Sha256::digest(serde_json::to_vec(&source).ok()?);
    Some(digest.iter().take(6).map(|b| format!("{b:02x}")).collect())
}

/// `identity` (a model's name, or what is kept under it) marked with a user's model's `registration`
/// ([`registration_id`]); unchanged for a catalog model (`None`). The one spelling every cache key uses.
pub fn with_registration(identity: String, registration: Option<&str>) -> String {
    match registration {
        Some(r) => format!("{identity}#registration:{r}"),
        None => identity,
    }
}

/// Whether `name` is a model a user registered under `home`.
pub fn is_user_model(home: &Path, name: &str) -> bool {
    crate::models::model_dir(home, name).join(USER_SOURCE).is_file()
}

/// What a user registered as `name` under `home`, if anything.
pub fn user_kind(home: &Path, name: &str) -> Option<UserKind> {
    read_source(home, name).map(|s| s.kind)
}

/// Whether `name` is a decoder this home can load: a catalog model, or one a user registered. The error names the
/// catalog.
pub fn check_decoder_name(home: &Path, name: &str) -> Result<()> {
    match user_kind(home, name) {
        Some(UserKind::Decoder) => check_registration(home, name),
        Some(UserKind::Encoder) => Err(ModelError::Usage(format!("`{name}` is a sentence encoder, not a decoder LLM"))),
        None => match decoder_spec(name)? {
            s if s.is_decoder() => Ok(()),
            s => Err(ModelError::Usage(format!("`{name}` is not a decoder LLM ({})", s.about))),
        },
    }
}

/// Whether `name` is a sentence encoder this home can load: a catalog model, or an export a user registered.
pub fn check_encoder_name(home: &Path, name: &str) -> Result<()> {
    match user_kind(home, name) {
        Some(UserKind::Encoder) => Ok(()),
        Some(UserKind::Decoder) => Err(ModelError::Usage(format!("`{name}` is a decoder LLM, not a sentence encoder"))),
        None => match spec(name)? {
            s if s.is_encoder() => Ok(()),
            s => Err(ModelError::Usage(format!("`{name}` is not a sentence encoder ({})", s.about))),
        },
    }
}

/// Whether decoder `name` returns the query statistics the expected-attention press needs: Stretto's converted
/// graphs do, a Hugging Face export does not. Only a folder with no export link is a converted graph: one whose
/// link cannot be read is an export too (the decoder's opening then names the link), not a graph with statistics.
pub fn has_query_stats(home: &Path, name: &str) -> bool {
    // (A catalog name is never an export, whatever its folder holds.)
    spec(name).is_ok() || matches!(crate::export::ExportLink::read(&decoder_dir(home, name)), Ok(None))
}

fn check_user_name(home: &Path, name: &str) -> Result<()> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) || name.starts_with('.')
    {
        return Err(ModelError::Usage(format!(
            "model name `{name}` must be letters, digits, '.', '_' or '-' (and not start with '.')"
        )));
    }
    if spec(name).is_ok() {
        return Err(ModelError::Usage(format!("`{name}` is a catalog model; register your file under another name")));
    }
    let _ = home;
    Ok(())
}

/// Registers a user's own model by path as model `name` under `home`: a GGUF file ([`register_gguf`]) or a Hugging
/// Face ONNX export folder ([`register_export`]). Returns what it is: a decoder can be any rung of the ladder, gold
/// included; an encoder serves embedding filters.
pub fn register_model(home: &Path, name: &str, path: &Path) -> Result<UserKind> {
    if path.is_dir() {
        register_export(home, name, path)
    } else {
        register_gguf(home, name, path).map(|_| UserKind::Decoder)
    }
}

/// Registers a Hugging Face ONNX export folder (see [`crate::export`]) as model `name` under `home`. The export is
/// used in place (nothing is copied or converted); the model folder holds Stretto's config of it and a link, so it
/// is loaded, pooled and cached like a catalog model. Registering the same unchanged folder again is free.
///
/// Errors name the file: a folder without `model.onnx`, `config.json` or `tokenizer.json`, a decoder exported
/// without KV-past I/O or in float16, an architecture other than llama/qwen2, a tokenizer without ChatML markers.
pub fn register_export(home: &Path, name: &str, dir: &Path) -> Result<UserKind> {
    check_user_name(home, name)?;
    let export: Export = crate::export::inspect(dir)?;
    let kind = match export.kind {
        ExportKind::Decoder => UserKind::Decoder,
        ExportKind::Encoder => UserKind::Encoder,
    };
    let source = UserSource::of(&export.dir, &export.model, kind)?;
    let model_dir = crate::models::model_dir(home, name);
    let onnx = decoder_dir(home, name);
    // What Stretto reads of the export is derived again each time (it is cheap: the model file's weights are not
    // read) so that a newer Stretto never runs on an older reading of the same folder.
    let (config, link) = match kind {
        UserKind::Decoder => (serde_json::to_vec_pretty(&export.decoder_config()?), export.link(0)),
        UserKind::Encoder => {
            let (config, max_tokens) = export.encoder_config()?;
            (serde_json::to_vec_pretty(&config), export.link(max_tokens))
        }
    };
    let config = config.map_err(|e| ModelError::Graph(e.to_string()))?;
    let link = serde_json::to_vec_pretty(&link).map_err(|e| ModelError::Graph(e.to_string()))?;
    let same = |file: &str, bytes: &[u8]| fs::read(onnx.join(file)).is_ok_and(|b| b == bytes);
    if read_source(home, name).as_ref() == Some(&source)
        && same("config.json", &config)
        && same(crate::export::LINK_FILE, &link)
    {
        return Ok(kind);
    }
    let _span = tracing::info_span!("register_export", model = name, dir = %dir.display()).entered();
    fs::create_dir_all(&model_dir).map_err(|e| ModelError::io(&model_dir, e))?;
    let _lock = crate::fsutil::lock_exclusive(&crate::fsutil::model_lock(home, name, "convert"))?;
    crate::fsutil::remove_stale_tmps(&model_dir, "onnx");
    let marker = model_dir.join(USER_SOURCE);
    let _ = fs::remove_file(&marker);
    let tmp = crate::fsutil::unique_tmp(&model_dir, "onnx");
    let write = |file: &str, bytes: &[u8]| {
        let path = tmp.join(file);
        fs::write(&path, bytes).map_err(|e| ModelError::io(&path, e))
    };
    let written = fs::create_dir_all(&tmp)
        .map_err(|e| ModelError::io(&tmp, e))
        .and_then(|_| write(crate::export::LINK_FILE, &link))
        .and_then(|_| write("config.json", &config))
        .and_then(|_| crate::fsutil::sync_tree(&tmp));
    if let Err(e) = written {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let _ = fs::remove_dir_all(&onnx);
    fs::rename(&tmp, &onnx).map_err(|e| ModelError::io(&onnx, e))?;
    write_marker(&model_dir, &source)?;
    Ok(kind)
}

fn write_marker(model_dir: &Path, source: &UserSource) -> Result<()> {
    let marker = model_dir.join(USER_SOURCE);
    let text = serde_json::to_string_pretty(source).unwrap_or_default();
    let tmp_marker = crate::fsutil::unique_tmp(model_dir, USER_SOURCE);
    fs::File::create(&tmp_marker)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()).and_then(|()| f.sync_all()))
        .map_err(|e| ModelError::io(&tmp_marker, e))?;
    fs::rename(&tmp_marker, &marker).map_err(|e| ModelError::io(&marker, e))
}

/// Registers a user's own GGUF decoder (architecture `llama` or `qwen2`) as model `name` under `home`, converting
/// it to an ONNX graph with KV-past I/O once (and again whenever the file changes). It is then loaded, pooled and
/// cached like a catalog model, and can be any rung of the ladder, gold included.
///
/// Errors name the file: one that is not a GGUF file, an unsupported architecture, a model whose vocabulary or chat
/// template is not ChatML (Stretto's prompt format: [`crate::export::missing_chatml_marker`],
/// [`crate::export::template_not_chatml`]), a name that is a catalog model's or holds characters a folder name cannot.
pub fn register_gguf(home: &Path, name: &str, gguf: &Path) -> Result<DecoderFiles> {
    check_user_name(home, name)?;
    fs::metadata(gguf).map_err(|e| ModelError::io(gguf, e))?;
    let g = crate::gguf::Gguf::open(gguf)?;
    let arch = g.meta("general.architecture").ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    if arch != "llama" && arch != "qwen2" {
        return Err(ModelError::Format {
            file: gguf.display().to_string(),
            message: format!("architecture `{arch}` is not supported; Stretto converts llama and qwen2 decoders"),
        });
    }
    // A llama or qwen2 decoder that does not speak ChatML (Llama 3, TinyLlama's Zephyr format) is refused here,
    // before its conversion, rather than answering Stretto's prompts off its format.
    let tokens = g.meta("tokenizer.ggml.tokens").ok().and_then(|v| v.as_array()).unwrap_or_default();
    let template = g.meta("tokenizer.chat_template").ok().and_then(|v| v.as_str());
    let problem = crate::export::missing_chatml_marker(|m| tokens.iter().any(|t| t.as_str() == Some(m)))
        .or_else(|| template.and_then(crate::export::template_not_chatml));
    if let Some(problem) = problem {
        return Err(ModelError::Format { file: gguf.display().to_string(), message: problem });
    }
    drop(g);
    let source = UserSource::of(gguf, gguf, UserKind::Decoder)?;
    let model_dir = crate::models::model_dir(home, name);
    let marker = model_dir.join(USER_SOURCE);
    let dir = decoder_dir(home, name);
    if read_source(home, name).as_ref() == Some(&source) {
        if let Ok(files) = DecoderFiles::open(&dir) {
            if crate::export::ExportLink::read(&dir).ok().flatten().is_none() {
                return Ok(files);
            }
        }
    }
    let _span = tracing::info_span!("register_gguf", model = name, gguf = %gguf.display()).entered();
    fs::create_dir_all(&model_dir).map_err(|e| ModelError::io(&model_dir, e))?;
    // One registration at a time; one that waited finds the work done.
    let _lock = crate::fsutil::lock_exclusive(&crate::fsutil::model_lock(home, name, "convert"))?;
    crate::fsutil::remove_stale_tmps(&model_dir, "onnx");
    if read_source(home, name).as_ref() == Some(&source)
        && DecoderFiles::open(&dir).is_ok()
        && crate::export::ExportLink::read(&dir).ok().flatten().is_none()
    {
        return DecoderFiles::open(&dir);
    }
    // The old marker goes first (so a half-done registration is never mistaken for a catalog download) and is
    // rewritten last; the graph is converted into a temporary folder and renamed into place.
    let _ = fs::remove_file(&marker);
    let tmp = crate::fsutil::unique_tmp(&model_dir, "onnx");
    if let Err(e) = convert_gguf(gguf, &tmp).and_then(|_| crate::fsutil::sync_tree(&tmp)) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&tmp, &dir).map_err(|e| ModelError::io(&dir, e))?;
    write_marker(&model_dir, &source)?;
    DecoderFiles::open(&dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoder_registered_before_the_chatml_check_must_be_registered_again() {
        let home = tempfile::tempdir().unwrap();
        let dir = crate::models::model_dir(home.path(), "mine");
        fs::create_dir_all(&dir).unwrap();
        // A marker as the registration of an earlier Stretto wrote it: no version.
        let old = r#"{"path": "/models/mine.gguf", "bytes": 7, "modified_ns": 1, "kind": "decoder"}"#;
        fs::write(dir.join(USER_SOURCE), old).unwrap();
        let e = check_decoder_name(home.path(), "mine").unwrap_err().to_string();
        assert!(e.contains("register it again from /models/mine.gguf") && e.contains("--model mine=PATH"), "{e}");
        let e = ensure_decoder(home.path(), "mine").unwrap_err().to_string();
        assert!(e.contains("register it again"), "{e}");
        // Its source no longer matches what a registration now records, so the next --model redoes it.
        let now = read_source(home.path(), "mine").unwrap();
        assert_eq!(now.registration, 0);
        assert_ne!(now, UserSource { registration: REGISTRATION, ..now.clone() });
        // A current one passes; an old encoder (no chat format to check) is served as before.
        fs::write(dir.join(USER_SOURCE), old.replace("}", r#", "registration": 1}"#)).unwrap();
        check_decoder_name(home.path(), "mine").unwrap();
        fs::write(dir.join(USER_SOURCE), old.replace("decoder", "encoder")).unwrap();
        check_encoder_name(home.path(), "mine").unwrap();
    }

    #[test]
    fn a_registration_has_an_id_and_a_catalog_model_never_has_one() {
        let home = tempfile::tempdir().unwrap();
        let marker =
            r#"{"path": "/models/mine.gguf", "bytes": 7, "modified_ns": 1, "kind": "decoder", "registration": 1}"#;
        for name in ["mine", "smollm2-135m"] {
            let dir = crate::models::model_dir(home.path(), name);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join(USER_SOURCE), marker).unwrap();
        }
        let id = registration_id(home.path(), "mine").unwrap();
        assert!(id.len() == 12 && id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        // A stray marker in a catalog model's folder changes none of its keys.
        assert_eq!(registration_id(home.path(), "smollm2-135m"), None);
        // Another file under the same name is another registration.
        let moved = marker.replace("mine.gguf", "other.gguf");
        fs::write(crate::models::model_dir(home.path(), "mine").join(USER_SOURCE), moved).unwrap();
        assert_ne!(registration_id(home.path(), "mine").unwrap(), id);
    }

    #[test]
    fn only_a_decoder_without_an_export_link_has_query_statistics() {
        let home = tempfile::tempdir().unwrap();
        let dir = decoder_dir(home.path(), "mine");
        fs::create_dir_all(&dir).unwrap();
        assert!(has_query_stats(home.path(), "mine"), "a converted graph");
        fs::write(dir.join(crate::export::LINK_FILE), "{ not json").unwrap();
        assert!(!has_query_stats(home.path(), "mine"), "an export whose link is damaged");
        let link = crate::export::ExportLink::read(&dir).unwrap_err().to_string();
        assert!(link.contains(crate::export::LINK_FILE), "{link}");
    }

    /// A converted decoder folder for `name` in `home` whose `config.json` names `system` as its system prompt (the
    /// context length recorded, so nothing reads the GGUF).
    fn converted(home: &Path, name: &str, system: &str) -> PathBuf {
        let dir = decoder_dir(home, name);
        fs::create_dir_all(&dir).unwrap();
        let config = serde_json::json!({"arch":"qwen2","layers":1,"hidden":8,"heads":2,"kv_heads":1,"head_dim":4,
            "ffn":16,"vocab":10,"rope_base":10000.0,"eps":1e-6,"stop_tokens":[2],"system_prompt":system,
            "context_length":32768,"converter":crate::convert::CONVERTER_VERSION});
        fs::write(dir.join("config.json"), config.to_string()).unwrap();
        for f in ["decoder.onnx", "tokenizer.json"] {
            fs::write(dir.join(f), "").unwrap();
        }
        dir
    }

    #[test]
    fn a_catalog_system_prompt_replaces_the_converted_default_at_load_and_leaves_the_folder_as_converted() {
        let home = tempfile::tempdir().unwrap();
        let qwen = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
        let dir = converted(home.path(), "qwen2.5-coder-1.5b", qwen);
        let set = crate::models::system_prompt("qwen2.5-coder-1.5b").expect("the catalog sets the 1.5B's prompt");
        assert!(!set.contains("Qwen"), "{set}");
        let files = ensure_decoder(home.path(), "qwen2.5-coder-1.5b").unwrap();
        assert_eq!(files.config.system_prompt, set);
        let written: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(written["system_prompt"], qwen, "config.json keeps what the conversion read");
        // A catalog decoder without a setting keeps its converted default.
        converted(home.path(), "smollm2-135m", "You are a helpful AI assistant named SmolLM.");
        assert_eq!(crate::models::system_prompt("smollm2-135m"), None);
        let files = ensure_decoder(home.path(), "smollm2-135m").unwrap();
        assert_eq!(files.config.system_prompt, "You are a helpful AI assistant named SmolLM.");
    }
}
