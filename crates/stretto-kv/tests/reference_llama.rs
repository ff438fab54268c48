//! An independent forward pass of SmolLM2-135M (llama architecture) in f64 over the dequantized GGUF weights.
//!
//! It is the oracle the ONNX decoder will be compared against. It is written from the architecture's definition
//! (Hugging Face semantics: rotate-half RoPE, grouped-query attention, RMSNorm, SwiGLU, tied embeddings), so it
//! also checks what the GGUF file leaves implicit: llama.cpp stores Q and K *permuted* for its interleaved RoPE,
//! which must be undone. A wrong permutation still "runs" but answers nonsense; this test asks the model a
//! question whose answer is known.

use stretto_kv::gguf::Gguf;

mod support;
use stretto_core::context::default_home;
use stretto_kv::models::{default_source, ensure, spec};
use support::{argmax, Llama};

#[test]
fn smollm2_answers_the_capital_question() {
    let dir = ensure(spec("smollm2-135m").unwrap(), &default_home(), default_source().as_ref()).unwrap();
    let g = Gguf::open(&dir.join("model.gguf")).unwrap();
    let tok = stretto_kv::tokenizer::from_gguf(&g).unwrap();
    let model = Llama::load(&g);
    let prompt = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
                  <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let ids = tok.encode(prompt, false).unwrap().get_ids().to_vec();
    let mut cache = Vec::new();
    let mut logits = model.forward(&ids, &mut cache);
    let eos = tok.token_to_id("<|im_end|>").unwrap();
    let mut out = Vec::new();
    for _ in 0..12 {
        let next = argmax(&logits);
        if next == eos {
            break;
        }
        out.push(next);
        logits = model.forward(&[next], &mut cache);
    }
    let answer = tok.decode(&out, true).unwrap();
    eprintln!("answer: {answer:?}");
    assert!(answer.contains("Paris"), "answer: {answer:?}");

    // Prefill-then-question equals one full pass: the cache is exact.
    let split = ids.len() - 5;
    let mut c2 = Vec::new();
    model.forward(&ids[..split], &mut c2);
    let l2 = model.forward(&ids[split..], &mut c2);
    let mut c3 = Vec::new();
    let l3 = model.forward(&ids, &mut c3);
    let worst = l2.iter().zip(&l3).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst < 1e-9, "{worst}");
}
