//! Registering Hugging Face ONNX export folders: what each fixture is, that a registration is reused while the
//! folder is unchanged, and that a folder which is not what it claims gives an error naming the culprit file, with
//! nothing registered.

use std::fs;
use std::path::{Path, PathBuf};

use stretto_models::export::{inspect, ExportKind};
use stretto_models::prepare::{self, register_model, UserKind};

fn fixture(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf-export").join(kind)
}

/// A copy of a fixture folder, to spoil.
fn copy(kind: &str, to: &Path) -> PathBuf {
    let dir = to.join(kind);
    fs::create_dir_all(&dir).unwrap();
    for e in fs::read_dir(fixture(kind)).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    dir
}

#[test]
fn the_fixtures_are_a_decoder_with_kv_past_and_a_sentence_encoder() {
    let d = inspect(&fixture("decoder")).unwrap();
    assert_eq!((d.kind, d.model_type.as_str()), (ExportKind::Decoder, "qwen2"));
    let c = d.decoder_config().unwrap();
    assert_eq!((c.layers, c.heads, c.kv_heads, c.head_dim, c.vocab), (2, 4, 2, 16, 373));
    assert!(c.stop_tokens.contains(&2), "eos from config.json: {:?}", c.stop_tokens);
    let e = inspect(&fixture("encoder")).unwrap();
    assert_eq!((e.kind, e.model_type.as_str()), (ExportKind::Encoder, "bert"));
    let (config, max_tokens) = e.encoder_config().unwrap();
    assert_eq!((config.hidden_size, max_tokens), (32, 128));
}

#[test]
fn a_registration_links_the_folder_and_is_reused_while_it_is_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let src = copy("decoder", tmp.path());
    assert_eq!(register_model(&home, "mine", &src).unwrap(), UserKind::Decoder);
    let files = prepare::ensure_decoder(&home, "mine").unwrap();
    assert_eq!(files.model, fs::canonicalize(&src).unwrap().join("model.onnx"), "used in place, not copied");
    assert!(!prepare::has_query_stats(&home, "mine"));
    assert!(prepare::check_encoder_name(&home, "mine").is_err(), "a decoder is not an encoder");
    let config = files.dir.join("config.json");
    let written = fs::metadata(&config).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    register_model(&home, "mine", &src).unwrap();
    assert_eq!(fs::metadata(&config).unwrap().modified().unwrap(), written, "an unchanged export was re-registered");
    // What the folder says is read again: a chat template added later gives the prompts its system turn.
    assert_eq!(files.config.system_prompt, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    let template = "{{ '<|im_start|>system\nYou judge reviews.<|im_end|>\n' }}{% for m in messages %}{% endfor %}";
    fs::write(src.join("chat_template.jinja"), template).unwrap();
    register_model(&home, "mine", &src).unwrap();
    assert_eq!(prepare::ensure_decoder(&home, "mine").unwrap().config.system_prompt, "You judge reviews.");
    // The same name now pointing at an encoder folder is re-registered as one.
    assert_eq!(register_model(&home, "mine", &fixture("encoder")).unwrap(), UserKind::Encoder);
    assert!(prepare::ensure_decoder(&home, "mine").unwrap_err().to_string().contains("sentence encoder"));
    assert_eq!(prepare::ensure_encoder(&home, "mine").unwrap().truncate, Some(128));
}

#[test]
fn folders_that_are_not_what_they_claim_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let register = |name: &str, dir: &Path| register_model(&home, name, dir).unwrap_err().to_string();

    // No model file.
    let empty = copy("decoder", &tmp.path().join("empty"));
    fs::remove_file(empty.join("model.onnx")).unwrap();
    let e = register("empty", &empty);
    assert!(e.contains("empty/decoder") && e.contains("holds no ONNX model"), "{e}");

    // A model file that is not ONNX.
    let junk = copy("decoder", &tmp.path().join("junk"));
    fs::write(junk.join("model.onnx"), b"GGUF this is not protobuf \xff\xff\xff\xff").unwrap();
    let e = register("junk", &junk);
    assert!(e.contains("junk/decoder/model.onnx") && e.contains("not an ONNX model"), "{e}");

    // A decoder exported without KV-past I/O (here: a graph of the wrong kind under a qwen2 config).
    let nopast = copy("decoder", &tmp.path().join("nopast"));
    fs::copy(fixture("encoder").join("model.onnx"), nopast.join("model.onnx")).unwrap();
    let e = register("nopast", &nopast);
    assert!(e.contains("nopast/decoder/model.onnx") && e.contains("text-generation-with-past"), "{e}");

    // An architecture Stretto does not drive.
    let gpt2 = copy("decoder", &tmp.path().join("gpt2"));
    let c = fs::read_to_string(gpt2.join("config.json")).unwrap().replace("\"qwen2\"", "\"gpt2\"");
    fs::write(gpt2.join("config.json"), c).unwrap();
    let e = register("gpt2", &gpt2);
    assert!(e.contains("gpt2/decoder/config.json") && e.contains("architecture `gpt2`"), "{e}");

    // A tokenizer without the ChatML markers Stretto's prompts use.
    let chat = copy("decoder", &tmp.path().join("chat"));
    fs::copy(fixture("encoder").join("tokenizer.json"), chat.join("tokenizer.json")).unwrap();
    let e = register("chat", &chat);
    assert!(e.contains("chat/decoder/tokenizer.json") && e.contains("<|im_start|>"), "{e}");

    // The markers in the vocabulary, but a chat template of another format (Llama 3's): named by its file.
    let llama3 = copy("decoder", &tmp.path().join("llama3"));
    let template = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] }}";
    fs::write(llama3.join("chat_template.jinja"), template).unwrap();
    let e = register("llama3", &llama3);
    assert!(e.contains("llama3/decoder/chat_template.jinja") && e.contains("not ChatML"), "{e}");

    // No tokenizer at all.
    let notok = copy("encoder", &tmp.path().join("notok"));
    fs::remove_file(notok.join("tokenizer.json")).unwrap();
    let e = register("notok", &notok);
    assert!(e.contains("notok/encoder/tokenizer.json") && e.contains("missing"), "{e}");

    // A catalog name is refused.
    let e = register("minilm", &fixture("encoder"));
    assert!(e.contains("catalog model"), "{e}");

    // Nothing was registered by any of these.
    for name in ["empty", "junk", "nopast", "gpt2", "chat", "llama3", "notok", "minilm"] {
        assert!(!prepare::is_user_model(&home, name), "{name} was left registered");
    }
}
