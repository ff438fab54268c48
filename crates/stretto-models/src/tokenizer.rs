//! Tokenizers rebuilt from GGUF metadata, for the `tokenizers` crate.
//!
//! GGUF files carry the vocabulary, the BPE merges and the token types, and name a pre-tokenizer (`tokenizer.ggml.pre`).
//! We write the equivalent `tokenizer.json` document: byte-level BPE, control tokens as special added tokens, and
//! the pre-tokenizer of the model family. SmolLM2 (`smollm`) splits digits individually before the byte-level
//! regex; Qwen2 (`qwen2`) normalises to NFC and splits with its own regex before byte-level mapping.

use serde_json::{json, Value as Json};
use tokenizers::Tokenizer;

use crate::error::{ModelError, Result};
use crate::gguf::{Gguf, Value};

/// GGUF token type of control tokens (`<|im_start|>`...).
const CONTROL: u64 = 3;
/// GGUF token type of user-defined tokens.
const USER_DEFINED: u64 = 4;

/// Qwen2's pre-tokenization regex.
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.json` document equivalent to a GGUF file's tokenizer.
pub fn tokenizer_json(g: &Gguf) -> Result<Json> {
    let bad = |m: String| ModelError::Format { file: "GGUF tokenizer".into(), message: m };
    let model = g.meta("tokenizer.ggml.model")?.as_str().unwrap_or_default().to_string();
    if model != "gpt2" {
        return Err(bad(format!("tokenizer model `{model}` is not supported (only byte-level BPE, `gpt2`)")));
    }
    let pre = g.metadata.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default").to_string();
    let tokens: Vec<&str> = g
        .meta("tokenizer.ggml.tokens")?
        .as_array()
        .ok_or_else(|| bad("tokenizer.ggml.tokens is not an array".into()))?
        .iter()
        .map(|v| v.as_str().ok_or_else(|| bad("a token is not a string".into())))
        .collect::<Result<_>>()?;
    let types: Vec<u64> = match g.metadata.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
        Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
        None => vec![1; tokens.len()],
    };
    let merges: Vec<&str> = g
        .meta("tokenizer.ggml.merges")?
        .as_array()
        .ok_or_else(|| bad("tokenizer.ggml.merges is not an array".into()))?
        .iter()
        .map(|v| v.as_str().ok_or_else(|| bad("a merge is not a string".into())))
        .collect::<Result<_>>()?;
    let vocab: serde_json::Map<String, Json> =
        tokens.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    let added: Vec<Json> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| matches!(types.get(*i), Some(&CONTROL) | Some(&USER_DEFINED)))
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false,
                   "special": types[i] == CONTROL})
        })
        .collect();
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let (normalizer, pre_tokenizer) = match pre.as_str() {
        "smollm" => (
            Json::Null,
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        ),
        "qwen2" => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": false},
                byte_level(false)
            ]}),
        ),
        "default" | "gpt2" => (Json::Null, byte_level(true)),
        other => return Err(bad(format!("pre-tokenizer `{other}` is not supported (smollm, qwen2, gpt2)"))),
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    }))
}

/// A ready tokenizer for a GGUF model.
pub fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
    let doc = tokenizer_json(g)?;
    let text = serde_json::to_string(&doc)
        .map_err(|e| ModelError::Format { file: "tokenizer.json".into(), message: e.to_string() })?;
    text.parse::<Tokenizer>().map_err(|e| ModelError::Format { file: "tokenizer.json".into(), message: e.to_string() })
}
