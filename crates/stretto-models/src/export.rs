//! Hugging Face ONNX export folders as Stretto models: what `optimum-cli export onnx` writes for a decoder
//! (`--task text-generation-with-past`) or a sentence encoder (`--task feature-extraction`), used in place.
//!
//! Nothing is converted: the folder's `model.onnx` (with its external data, however large) is what ONNX Runtime
//! loads, and the folder's `tokenizer.json` tokenizes. [`inspect`] reads the folder's `config.json` and the graph's
//! declared inputs and outputs ([`crate::onnx::signature`]) and says what it is, or names the file that is not what
//! the folder claims:
//!
//! - a **decoder** takes `input_ids`, `attention_mask`, `position_ids` and `past_key_values.{l}.key|value` and
//!   returns `logits` and `present.{l}.key|value` (Optimum's names, which Stretto's own converter also writes); its
//!   architecture is `llama` or `qwen2`, its tokenizer has the ChatML markers Stretto's prompts use and its chat
//!   template, where it has one, is ChatML ([`template_not_chatml`]); its system prompt is the template's default. Unlike a
//!   converted graph, an export returns logits for every position and no query statistics, so the runtime takes the
//!   last position and the expected-attention press is not available (key-norm compresses instead);
//! - a **sentence encoder** takes `input_ids` and `attention_mask` (and `token_type_ids`) and returns
//!   `last_hidden_state` (mean-pooled and normalised by the runtime, as sentence-transformers does) or a
//!   `sentence_embedding`.
//!
//! ```no_run
//! use stretto_models::export::{inspect, ExportKind};
//! let export = inspect(std::path::Path::new("qwen2.5-7b-instruct-onnx"))?;
//! assert_eq!(export.kind, ExportKind::Decoder);
//! println!("{} ({}): {}", export.model_type, export.model.display(), export.tokenizer.display());
//! # Ok::<(), stretto_models::ModelError>(())
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::bert::{EncoderConfig, ENCODER_VERSION};
use crate::convert::{DecoderConfig, CONVERTER_VERSION};
use crate::error::{ModelError, Result};
use crate::onnx::{dtype, signature, Signature};

/// Decoder architectures whose exports Stretto drives.
pub const DECODER_TYPES: [&str; 2] = ["llama", "qwen2"];

/// The model files Optimum writes for a decoder with KV-past I/O, in the order they are looked for.
const MODEL_FILES: [&str; 2] = ["model.onnx", "decoder_model_merged.onnx"];

/// What an export folder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExportKind {
    /// A decoder LLM with KV-past inputs and outputs.
    Decoder,
    /// A sentence encoder.
    Encoder,
}

/// An inspected export folder.
#[derive(Debug, Clone)]
pub struct Export {
    /// The folder (canonical).
    pub dir: PathBuf,
    /// Its ONNX model file.
    pub model: PathBuf,
    /// Its `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// Decoder or encoder.
    pub kind: ExportKind,
    /// `model_type` of its `config.json` (`qwen2`, `bert`...).
    pub model_type: String,
    /// Its `config.json`.
    pub config: Value,
}

/// Where a registered export lives, stored beside the Stretto config of the model (`export.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportLink {
    /// The export folder.
    pub dir: PathBuf,
    /// The ONNX file in it.
    pub model: String,
    /// Decoder or encoder.
    pub kind: ExportKind,
    /// Longest input an encoder takes, in tokens (its position table); 0 for decoders.
    #[serde(default)]
    pub max_tokens: usize,
}

/// The file that links a model folder to an export.
pub const LINK_FILE: &str = "export.json";

impl ExportLink {
    /// The link in a model's `onnx/` folder, if the model is an export.
    pub fn read(onnx_dir: &Path) -> Result<Option<Self>> {
        let path = onnx_dir.join(LINK_FILE);
        match fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| bad(&path, e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ModelError::io(&path, e)),
        }
    }

    /// The ONNX model file.
    pub fn model_path(&self) -> PathBuf {
        self.dir.join(&self.model)
    }

    /// The tokenizer.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }
}

fn bad(file: &Path, message: impl Into<String>) -> ModelError {
    ModelError::Format { file: file.display().to_string(), message: message.into() }
}

/// Reads an export folder and says what it is; errors name the file that is missing or not what it claims.
pub fn inspect(dir: &Path) -> Result<Export> {
    let meta = fs::metadata(dir).map_err(|e| ModelError::io(dir, e))?;
    if !meta.is_dir() {
        return Err(bad(dir, "not a folder (an ONNX export is a folder with model.onnx, config.json, tokenizer.json)"));
    }
    let dir = fs::canonicalize(dir).map_err(|e| ModelError::io(dir, e))?;
    let cpath = dir.join("config.json");
    let text = fs::read_to_string(&cpath).map_err(|e| ModelError::io(&cpath, e))?;
    let config: Value = serde_json::from_str(&text).map_err(|e| bad(&cpath, e.to_string()))?;
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(&cpath, "no `model_type`: not a Hugging Face model config"))?
        .to_string();
    let tokenizer = dir.join("tokenizer.json");
    if !tokenizer.is_file() {
        return Err(bad(&tokenizer, "missing: export the model with its tokenizer (Optimum writes tokenizer.json)"));
    }
    let model = MODEL_FILES.iter().map(|f| dir.join(f)).find(|p| p.is_file()).ok_or_else(|| {
        bad(&dir, format!("holds no ONNX model ({}); export it with `optimum-cli export onnx`", MODEL_FILES.join(", ")))
    })?;
    let sig = signature(&model)?;
    let has_past = sig.inputs.iter().any(|p| p.name.starts_with("past_key_values."));
    let kind = if has_past {
        ExportKind::Decoder
    } else if DECODER_TYPES.contains(&model_type.as_str()) || sig.output("logits").is_some() {
        return Err(bad(&model, "a decoder without KV-past inputs: export it with `--task text-generation-with-past`"));
    } else if sig.input("input_ids").is_some()
        && (sig.output("last_hidden_state").is_some() || sig.output("sentence_embedding").is_some())
    {
        ExportKind::Encoder
    } else {
        return Err(bad(
            &model,
            "neither a decoder with KV-past I/O nor a sentence encoder (input_ids → last_hidden_state)",
        ));
    };
    Ok(Export { dir, model, tokenizer, kind, model_type, config })
}

fn field(config: &Value, cpath: &Path, key: &str) -> Result<usize> {
    config
        .get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| bad(cpath, format!("`{key}` is missing or not an integer")))
}

/// The token ids a value of `eos_token_id` names (one id or a list).
fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|i| vec![i as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|i| i as u32).collect(),
        _ => Vec::new(),
    }
}

fn check_port(sig: &Signature, model: &Path, name: &str, input: bool) -> Result<()> {
    let port = if input { sig.input(name) } else { sig.output(name) };
    let what = if input { "input" } else { "output" };
    let port =
        port.ok_or_else(|| bad(model, format!("no `{name}` {what}: not an Optimum decoder export with past")))?;
    if name.starts_with("past_key_values.") || name.starts_with("present.") || name == "logits" {
        match port.elem_type {
            dtype::FLOAT => {}
            dtype::FLOAT16 => {
                return Err(bad(
                    model,
                    format!("`{name}` is float16; Stretto's KV caches are float32: export in float32"),
                ))
            }
            t => return Err(bad(model, format!("`{name}` has element type {t}, not float32"))),
        }
    }
    Ok(())
}

impl Export {
    /// The decoder's architecture in Stretto's terms, after checking that the graph has every KV-past input and
    /// output of its layers and that the tokenizer speaks ChatML.
    pub fn decoder_config(&self) -> Result<DecoderConfig> {
        let cpath = self.dir.join("config.json");
        if !DECODER_TYPES.contains(&self.model_type.as_str()) {
            return Err(bad(
                &cpath,
                format!("architecture `{}` is not supported; Stretto drives llama and qwen2 decoders", self.model_type),
            ));
        }
        let c = &self.config;
        let layers = field(c, &cpath, "num_hidden_layers")?;
        let hidden = field(c, &cpath, "hidden_size")?;
        let heads = field(c, &cpath, "num_attention_heads")?;
        let kv_heads = field(c, &cpath, "num_key_value_heads").unwrap_or(heads);
        let head_dim = c.get("head_dim").and_then(Value::as_u64).map_or(hidden / heads.max(1), |v| v as usize);
        let vocab = field(c, &cpath, "vocab_size")?;
        let sig = signature(&self.model)?;
        for name in ["input_ids", "attention_mask", "position_ids"] {
            check_port(&sig, &self.model, name, true)?;
        }
        check_port(&sig, &self.model, "logits", false)?;
        for l in 0..layers {
            for which in ["key", "value"] {
                check_port(&sig, &self.model, &format!("past_key_values.{l}.{which}"), true)?;
                check_port(&sig, &self.model, &format!("present.{l}.{which}"), false)?;
            }
        }
        let tokenizer =
            tokenizers::Tokenizer::from_file(&self.tokenizer).map_err(|e| bad(&self.tokenizer, e.to_string()))?;
        if let Some(problem) = missing_chatml_marker(|t| tokenizer.token_to_id(t).is_some()) {
            return Err(bad(&self.tokenizer, problem));
        }
        let template = self.chat_template();
        if let Some((file, problem)) = template.as_ref().and_then(|(f, t)| Some((f, template_not_chatml(t)?))) {
            return Err(bad(file, problem));
        }
        let mut stop_tokens = ids(c.get("eos_token_id"));
        if let Ok(text) = fs::read_to_string(self.dir.join("generation_config.json")) {
            if let Ok(g) = serde_json::from_str::<Value>(&text) {
                stop_tokens.extend(ids(g.get("eos_token_id")));
            }
        }
        for t in ["<|im_end|>", "<|endoftext|>"] {
            stop_tokens.extend(tokenizer.token_to_id(t));
        }
        let mut seen = Vec::new();
        stop_tokens.retain(|t| {
            (*t as usize) < vocab && !seen.contains(t) && {
                seen.push(*t);
                true
            }
        });
        let system_prompt = template.and_then(|(_, t)| default_system_prompt(&t)).unwrap_or_else(|| {
            match self.model_type.as_str() {
                "qwen2" => "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
                _ => "You are a helpful assistant.",
            }
            .to_string()
        });
        Ok(DecoderConfig {
            arch: self.model_type.clone(),
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            ffn: field(c, &cpath, "intermediate_size").unwrap_or(0),
            vocab,
            rope_base: c.get("rope_theta").and_then(Value::as_f64).unwrap_or(10000.0),
            eps: c.get("rms_norm_eps").and_then(Value::as_f64).unwrap_or(1e-6),
            stop_tokens,
            system_prompt,
            converter: CONVERTER_VERSION,
            weights: crate::convert::Weights::F32,
            context_length: c
                .get("max_position_embeddings")
                .and_then(Value::as_u64)
                .map(|n| n as usize)
                .filter(|&n| n > 0),
            registration: None,
        })
    }

    /// The chat template and the file it is in: `chat_template.jinja`, or `tokenizer_config.json`'s `chat_template`
    /// (the default one when it holds several).
    fn chat_template(&self) -> Option<(PathBuf, String)> {
        let jinja = self.dir.join("chat_template.jinja");
        if let Ok(t) = fs::read_to_string(&jinja) {
            return Some((jinja, t));
        }
        let path = self.dir.join("tokenizer_config.json");
        let config: Value = serde_json::from_str(&fs::read_to_string(&path).ok()?).ok()?;
        let template = match config.get("chat_template")? {
            Value::String(t) => Some(t.clone()),
            Value::Array(named) => named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => None,
        };
        template.map(|t| (path, t))
    }

    /// The encoder's facts, and the longest input it takes in tokens (its position table, at most 512).
    pub fn encoder_config(&self) -> Result<(EncoderConfig, usize)> {
        let cpath = self.dir.join("config.json");
        let c = &self.config;
        let positions = field(c, &cpath, "max_position_embeddings").unwrap_or(512);
        // RoBERTa-style position tables reserve the first two rows for padding.
        let offset =
            if ["roberta", "xlm-roberta", "mpnet", "camembert"].contains(&self.model_type.as_str()) { 2 } else { 0 };
        let max_tokens = positions.saturating_sub(offset).clamp(1, 512);
        let config = EncoderConfig {
            hidden_size: field(c, &cpath, "hidden_size")?,
            num_hidden_layers: field(c, &cpath, "num_hidden_layers").unwrap_or(0),
            num_attention_heads: field(c, &cpath, "num_attention_heads").unwrap_or(0),
            intermediate_size: field(c, &cpath, "intermediate_size").unwrap_or(0),
            max_position_embeddings: positions,
            layer_norm_eps: c.get("layer_norm_eps").and_then(Value::as_f64).unwrap_or(1e-12),
            model_type: self.model_type.clone(),
            relative_attention_num_buckets: field(c, &cpath, "relative_attention_num_buckets").unwrap_or(0),
            max_tokens,
            converter: ENCODER_VERSION,
        };
        Ok((config, max_tokens))
    }

    /// The link a registration stores.
    pub fn link(&self, max_tokens: usize) -> ExportLink {
        let model = self.model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        ExportLink { dir: self.dir.clone(), model, kind: self.kind, max_tokens }
    }
}

/// Why a decoder cannot take Stretto's prompts, which are written in ChatML (`<|im_start|>role⏎…<|im_end|>`), if its
/// vocabulary (`has_token`) lacks a ChatML marker. Its chat template, where it has one, must be ChatML too
/// ([`template_not_chatml`]), not another format (Llama 3's headers, Zephyr's `<|user|>`, Mistral's `[INST]`): the
/// markers would be text it never saw in training and its answers would be off its format.
pub fn missing_chatml_marker(has_token: impl Fn(&str) -> bool) -> Option<String> {
    let marker = ["<|im_start|>", "<|im_end|>"].into_iter().find(|m| !has_token(m))?;
    Some(format!("no `{marker}` token: Stretto's prompts use the ChatML chat template"))
}

/// Why a chat `template` is not ChatML, if it is not (see [`missing_chatml_marker`]).
pub fn template_not_chatml(template: &str) -> Option<String> {
    (!template.contains("<|im_start|>")).then(|| {
        "its chat template is not ChatML (it writes no `<|im_start|>`): Stretto's prompts use the ChatML chat \
         template, which this model was not trained on"
            .into()
    })
}

/// The system prompt a ChatML template writes when the conversation has none: the first literal
/// `<|im_start|>system⏎…<|im_end|>` in it (the newline written out or as Jinja's `\n`). Stretto's prompts open
/// with it, as the model saw in training.
pub fn default_system_prompt(template: &str) -> Option<String> {
    const OPEN: &str = "<|im_start|>system";
    let mut rest = template;
    while let Some(i) = rest.find(OPEN) {
        rest = &rest[i + OPEN.len()..];
        let body = rest.strip_prefix("\\n").or_else(|| rest.strip_prefix('\n'));
        if let Some(end) = body.and_then(|b| b.find("<|im_end|>").map(|e| &b[..e])) {
            let literal = !end.is_empty() && !end.contains(['{', '}', '\'', '"', '\n']) && !end.contains("\\n");
            if literal {
                return Some(end.to_string());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_system_prompt_is_read_from_chatml_templates() {
        // SmolLM2's template (real newlines, as transformers writes chat_template.jinja).
        let smol = "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful \
                    AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}";
        assert_eq!(
            default_system_prompt(smol).as_deref(),
            Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
        );
        // Qwen2.5's: a system turn built from the messages comes first and is skipped; `\n` is a Jinja escape.
        let qwen = r"{{- '<|im_start|>system\n' }}{{- messages[0]['content'] }}{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}";
        assert_eq!(
            default_system_prompt(qwen).as_deref(),
            Some("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
        );
        assert_eq!(default_system_prompt("{{ messages }}"), None);
    }

    #[test]
    fn only_chatml_vocabularies_and_templates_take_stretto_prompts() {
        let chatml = |t: &str| t.starts_with("<|im_");
        let smol = "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}";
        assert_eq!(missing_chatml_marker(chatml), None);
        assert_eq!(template_not_chatml(smol), None);
        // Llama 3's template, over a vocabulary that happens to hold the markers.
        let llama3 = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}";
        assert!(template_not_chatml(llama3).unwrap().contains("not ChatML"));
        let no_end = missing_chatml_marker(|t| t == "<|im_start|>").unwrap();
        assert!(no_end.contains("`<|im_end|>`"), "{no_end}");
    }

    #[test]
    fn eos_ids_come_as_one_or_many() {
        assert_eq!(ids(Some(&serde_json::json!(2))), vec![2]);
        assert_eq!(ids(Some(&serde_json::json!([2, 7]))), vec![2, 7]);
        assert!(ids(None).is_empty());
    }

    #[test]
    fn a_file_is_not_an_export_folder() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("model.onnx");
        fs::write(&f, b"x").unwrap();
        let e = inspect(&f).unwrap_err().to_string();
        assert!(e.contains("model.onnx") && e.contains("not a folder"), "{e}");
    }
}
