//! An independent forward pass of llama-architecture decoders (SmolLM2-135M) in f64 over the dequantized GGUF
//! weights: the oracle the ONNX decoder is compared against. It is written from the architecture's definition
//! (Hugging Face semantics: rotate-half RoPE, grouped-query attention, RMSNorm, SwiGLU, tied embeddings), so it
//! also checks what the GGUF file leaves implicit: llama.cpp stores Q and K *permuted* for its interleaved RoPE.

#![allow(dead_code)]

use stretto_kv::gguf::Gguf;

/// Per layer: the keys and the values of every position so far.
pub type KvCache = Vec<(Vec<Vec<f64>>, Vec<Vec<f64>>)>;

struct Layer {
    attn_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

pub struct Llama {
    pub d: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub hd: usize,
    ffn: usize,
    eps: f64,
    base: f64,
    embed: Vec<f32>,
    out_norm: Vec<f32>,
    head: Vec<f32>,
    vocab: usize,
    layers: Vec<Layer>,
}

/// Undoes llama.cpp's Q/K permutation: GGUF row `h·hd + 2j + t` is Hugging Face row `h·hd + t·hd/2 + j`.
pub fn unpermute(w: &[f32], n_heads: usize, hd: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    for h in 0..n_heads {
        for j in 0..hd / 2 {
            for t in 0..2 {
                let src = (h * hd + 2 * j + t) * cols;
                let dst = (h * hd + t * hd / 2 + j) * cols;
                out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
            }
        }
    }
    out
}

impl Llama {
    pub fn load(g: &Gguf) -> Self {
        let u = |k: &str| g.meta(k).unwrap().as_u64().unwrap() as usize;
        let (d, heads, kv_heads) =
            (u("llama.embedding_length"), u("llama.attention.head_count"), u("llama.attention.head_count_kv"));
        let hd = d / heads;
        let t = |n: &str| g.tensor_f32(n).unwrap();
        let embed = t("token_embd.weight");
        let vocab = embed.len() / d;
        let head = if g.tensors.contains_key("output.weight") { t("output.weight") } else { embed.clone() };
        let layers = (0..u("llama.block_count"))
            .map(|i| {
                let p = |n: &str| t(&format!("blk.{i}.{n}.weight"));
                Layer {
                    attn_norm: p("attn_norm"),
                    wq: unpermute(&p("attn_q"), heads, hd, d),
                    wk: unpermute(&p("attn_k"), kv_heads, hd, d),
                    wv: p("attn_v"),
                    wo: p("attn_output"),
                    ffn_norm: p("ffn_norm"),
                    gate: p("ffn_gate"),
                    up: p("ffn_up"),
                    down: p("ffn_down"),
                }
            })
            .collect();
        Self {
            d,
            heads,
            kv_heads,
            hd,
            ffn: u("llama.feed_forward_length"),
            eps: g.meta("llama.attention.layer_norm_rms_epsilon").unwrap().as_f64().unwrap(),
            base: g.meta("llama.rope.freq_base").unwrap().as_f64().unwrap(),
            embed,
            out_norm: t("output_norm.weight"),
            head,
            vocab,
            layers,
        }
    }

    /// `y = W x` for W stored row-major as [rows][cols] (GGUF dims [cols, rows]).
    fn matvec(w: &[f32], x: &[f64], rows: usize) -> Vec<f64> {
        let cols = x.len();
        (0..rows).map(|r| w[r * cols..(r + 1) * cols].iter().zip(x).map(|(a, b)| *a as f64 * b).sum()).collect()
    }

    fn rmsnorm(&self, x: &[f64], w: &[f32]) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let s = 1.0 / (ms + self.eps).sqrt();
        x.iter().zip(w).map(|(v, g)| v * s * *g as f64).collect()
    }

    fn rope(&self, v: &mut [f64], pos: usize) {
        let half = self.hd / 2;
        for i in 0..half {
            let inv = self.base.powf(-2.0 * i as f64 / self.hd as f64);
            let (s, c) = (pos as f64 * inv).sin_cos();
            let (a, b) = (v[i], v[i + half]);
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }

    /// Runs the tokens through the model, extending the per-layer (keys, values) caches; returns the last logits.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Vec<f64> {
        self.forward_capture(tokens, cache, &mut Vec::new())
    }

    /// [`Self::forward`], also collecting per layer the pre-RoPE query vector of every token.
    pub fn forward_capture(&self, tokens: &[u32], cache: &mut KvCache, queries: &mut Vec<Vec<Vec<f64>>>) -> Vec<f64> {
        queries.resize_with(self.layers.len(), Vec::new);
        if cache.is_empty() {
            cache.resize_with(self.layers.len(), || (vec![], vec![]));
        }
        let kvd = self.kv_heads * self.hd;
        let mut x = vec![];
        for &tok in tokens {
            let pos = cache[0].0.len();
            x = self.embed[tok as usize * self.d..(tok as usize + 1) * self.d]
                .iter()
                .map(|v| *v as f64)
                .collect::<Vec<f64>>();
            for (l, layer) in self.layers.iter().enumerate() {
                let h = self.rmsnorm(&x, &layer.attn_norm);
                let mut q = Self::matvec(&layer.wq, &h, self.d);
                let mut k = Self::matvec(&layer.wk, &h, kvd);
                let v = Self::matvec(&layer.wv, &h, kvd);
                queries[l].push(q.clone());
                for hq in 0..self.heads {
                    self.rope(&mut q[hq * self.hd..(hq + 1) * self.hd], pos);
                }
                for hk in 0..self.kv_heads {
                    self.rope(&mut k[hk * self.hd..(hk + 1) * self.hd], pos);
                }
                cache[l].0.push(k);
                cache[l].1.push(v);
                let (keys, values) = &cache[l];
                let mut attn = vec![0.0; self.d];
                let group = self.heads / self.kv_heads;
                for hq in 0..self.heads {
                    let kh = hq / group;
                    let qh = &q[hq * self.hd..(hq + 1) * self.hd];
                    let scores: Vec<f64> = keys
                        .iter()
                        .map(|k| {
                            qh.iter().zip(&k[kh * self.hd..(kh + 1) * self.hd]).map(|(a, b)| a * b).sum::<f64>()
                                / (self.hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (w, v) in e.iter().zip(values) {
                        for i in 0..self.hd {
                            attn[hq * self.hd + i] += w / z * v[kh * self.hd + i];
                        }
                    }
                }
                let o = Self::matvec(&layer.wo, &attn, self.d);
                x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
                let h = self.rmsnorm(&x, &layer.ffn_norm);
                let g = Self::matvec(&layer.gate, &h, self.ffn);
                let u = Self::matvec(&layer.up, &h, self.ffn);
                let act: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
                let dn = Self::matvec(&layer.down, &act, self.d);
                x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
            }
        }
        let h = self.rmsnorm(&x, &self.out_norm);
        Self::matvec(&self.head, &h, self.vocab)
    }
}

pub fn argmax(v: &[f64]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap_or(0)
}
