//! Tokenizers rebuilt from the real GGUF files round-trip text and agree with known ids.

use stretto_core::context::default_home;
use stretto_kv::gguf::Gguf;
use stretto_kv::models::{default_source, ensure, spec};

fn tokenizer(model: &str) -> tokenizers::Tokenizer {
    let dir = ensure(spec(model).unwrap(), &default_home(), default_source().as_ref()).unwrap();
    stretto_kv::tokenizer::from_gguf(&Gguf::open(&dir.join("model.gguf")).unwrap()).unwrap()
}

const SAMPLES: &[&str] = &[
    "What is the capital of France?",
    "Prices rose 12.5% to $1,234,567 in 2023.",
    "Crème brûlée, naïve café, Ærøskøbing, Dvořák",
    "東京は日本の首都です。北京是中国的首都。",
    "Emoji: 🎬🍿👍🏽 and a family 👨‍👩‍👧",
    "  leading spaces,\ttabs\nand\r\nnewlines  ",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
];

#[test]
fn smollm2_round_trips_and_knows_its_ids() {
    let tok = tokenizer("smollm2-135m");
    for s in SAMPLES {
        let enc = tok.encode(*s, false).unwrap();
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), *s, "round trip");
    }
    // '0' and '1' are ids 32 and 33; digits are split individually.
    assert_eq!(tok.encode("0", false).unwrap().get_ids(), &[32]);
    assert_eq!(tok.encode("1", false).unwrap().get_ids(), &[33]);
    assert_eq!(tok.encode("2023", false).unwrap().get_ids().len(), 4);
    // ChatML markers are single special tokens.
    let ids = tok.encode("<|im_start|>user", false).unwrap().get_ids().to_vec();
    assert_eq!(ids[0], tok.token_to_id("<|im_start|>").unwrap());
    assert_eq!(tok.decode(&ids, true).unwrap(), "user");
}

/// Qwen2.5-Coder-0.5B's tokenizer (a 491 MB download, ~20 s with its conversion).
#[test]
fn qwen2_round_trips() {
    let tok = tokenizer("qwen2.5-coder-0.5b");
    for s in SAMPLES {
        let enc = tok.encode(*s, false).unwrap();
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), *s, "round trip");
    }
    let ids = tok.encode("<|im_start|>", false).unwrap().get_ids().to_vec();
    assert_eq!(ids.len(), 1);
}
