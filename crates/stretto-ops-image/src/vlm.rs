//! A vision-language model operator for models in the Hugging Face ONNX layout, for users who bring one (none is
//! available from the package registries).
//!
//! The layout, as exported by optimum / transformers.js for VLMs such as SmolVLM: a vision encoder
//! (`pixel_values` as `[1, 3, H, W]` or `[1, images, 3, H, W]`, with `pixel_attention_mask` when the graph asks for
//! it → `image_features`), a token embedder (`input_ids` → `inputs_embeds`) and a decoder over
//! `inputs_embeds` with KV past (`attention_mask`, `position_ids`, `past_key_values.{i}.key|value` → `logits`,
//! `present.{i}.key|value`). A `stretto-vlm.json` in the model folder names the files and the facts that differ
//! between models ([`VlmSpec`]).
//!
//! The item is the image: the prompt prefix, the image's features and the image's closing text are prefilled once
//! into a KV past; the question then runs over that past, exactly like the text LLM operators. A filter scores the
//! log-odds of the spec's yes-token over its no-token.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use ort::session::{Session, SessionInputValue};
use ort::value::Tensor;
use stretto_core::op::{
    parse_config, LogicalKind, Modality, OpOutput, OpProperties, OperatorFactory, PhysicalOp, SemanticTask,
};
use stretto_core::{CoreError, OpContext, Result};
use tokenizers::Tokenizer;

/// What `stretto-vlm.json` says about a model folder.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct VlmSpec {
    /// Vision encoder file (relative to the folder).
    pub vision: PathBuf,
    /// Token embedder file.
    pub embed: PathBuf,
    /// Decoder file (with KV past).
    pub decoder: PathBuf,
    /// `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// Square input side in pixels.
    pub image_size: usize,
    /// Per-channel mean after scaling to [0, 1].
    pub mean: [f32; 3],
    /// Per-channel standard deviation.
    pub std: [f32; 3],
    /// Decoder layers.
    pub layers: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Per-head size.
    pub head_dim: usize,
    /// Text before the image (e.g. `<|im_start|>User:`).
    pub prompt_prefix: String,
    /// Text between the image and the question.
    #[serde(default)]
    pub after_image: String,
    /// Text after the question, opening the answer (e.g. `<end_of_utterance>\nAssistant:`).
    pub prompt_suffix: String,
    /// The answer token of "yes" (e.g. ` Yes`).
    pub yes: String,
    /// The answer token of "no".
    pub no: String,
}

/// How the vision encoder takes its image, read from the graph: `pixel_values` as `[batch, 3, H, W]` or, as
/// SmolVLM/Idefics3 exports do, `[batch, images, 3, H, W]`, possibly with a `pixel_attention_mask`
/// `[batch, images, H, W]` (all true for one unpadded image).
#[derive(Debug, Clone, Copy, PartialEq)]
struct VisionInputs {
    five_d: bool,
    mask: bool,
}

impl VisionInputs {
    fn of(session: &Session) -> Result<Self> {
        let mut out = Self { five_d: false, mask: false };
        let mut pixels = false;
        for input in session.inputs() {
            match input.name() {
                "pixel_values" => {
                    pixels = true;
                    let rank = input.dtype().tensor_shape().map_or(4, |s| s.len());
                    out.five_d = match rank {
                        4 => false,
                        5 => true,
                        r => return Err(err(format!("pixel_values has rank {r}; expected 4 or 5"))),
                    };
                }
                "pixel_attention_mask" => out.mask = true,
                other => {
                    return Err(err(format!(
                        "the vision encoder has an input `{other}`; only pixel_values and pixel_attention_mask are \
                         supported"
                    )))
                }
            }
        }
        if !pixels {
            return Err(err("the vision encoder has no `pixel_values` input"));
        }
        Ok(out)
    }
}

struct Loaded {
    spec: VlmSpec,
    vision_inputs: VisionInputs,
    vision: Mutex<Session>,
    embed: Mutex<Session>,
    decoder: Mutex<Session>,
    tokenizer: Tokenizer,
    yes: u32,
    no: u32,
}

fn err(m: impl std::fmt::Display) -> CoreError {
    CoreError::operator("vlm", m.to_string())
}

/// Per-layer keys and values `[kv_heads][len][head_dim]` of one prefilled image.
#[derive(Debug, Clone)]
struct Past {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
}

impl Loaded {
    fn open(dir: &Path, ctx: &OpContext) -> Result<Self> {
        let spec_path = dir.join("stretto-vlm.json");
        let text = std::fs::read_to_string(&spec_path).map_err(|e| CoreError::io(&spec_path, e))?;
        let spec: VlmSpec = serde_json::from_str(&text).map_err(|e| CoreError::OperatorConfig {
            factory: "vlm".into(),
            message: format!("{}: {e}", spec_path.display()),
        })?;
        let session = |f: &Path| -> Result<Mutex<Session>> {
            let path = dir.join(f);
            let mut b =
                stretto_kv::runtime::session_builder(&ctx.model_home, stretto_ops_text::runtime(ctx)).map_err(err)?;
            Ok(Mutex::new(b.commit_from_file(&path).map_err(|e| err(format!("{}: {e}", path.display())))?))
        };
        let tpath = dir.join(&spec.tokenizer);
        let tokenizer = Tokenizer::from_file(&tpath).map_err(|e| err(format!("{}: {e}", tpath.display())))?;
        let single = |t: &str| -> Result<u32> {
            let ids = tokenizer.encode(t, false).map_err(err)?.get_ids().to_vec();
            match ids.as_slice() {
                [id] => Ok(*id),
                _ => Err(err(format!("answer `{t}` is {} tokens, not one", ids.len()))),
            }
        };
        let vision = session(&spec.vision)?;
        let vision_inputs = VisionInputs::of(&*vision.lock().map_err(|_| err("vision encoder poisoned"))?)?;
        Ok(Self {
            yes: single(&spec.yes)?,
            no: single(&spec.no)?,
            vision_inputs,
            vision,
            embed: session(&spec.embed)?,
            decoder: session(&spec.decoder)?,
            tokenizer,
            spec,
        })
    }

    fn pixels(&self, path: &Path) -> Result<Vec<f32>> {
        let s = self.spec.image_size as u32;
        let img =
            image::open(path).map_err(|e| err(format!("{}: cannot decode image: {e}", path.display())))?.to_rgb8();
        let img = image::imageops::resize(&img, s, s, image::imageops::FilterType::Triangle);
        let n = (s * s) as usize;
        let mut out = vec![0f32; 3 * n];
        for (i, p) in img.pixels().enumerate() {
            for c in 0..3 {
                out[c * n + i] = (p[c] as f32 / 255.0 - self.spec.mean[c]) / self.spec.std[c];
            }
        }
        Ok(out)
    }

    fn embed(&self, text: &str) -> Result<(Vec<f32>, usize)> {
        let ids: Vec<i64> =
            self.tokenizer.encode(text, false).map_err(err)?.get_ids().iter().map(|&i| i as i64).collect();
        if ids.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let n = ids.len();
        let mut s = self.embed.lock().map_err(|_| err("embedder poisoned"))?;
        let out =
            s.run(ort::inputs!["input_ids" => Tensor::from_array((vec![1, n], ids)).map_err(err)?]).map_err(err)?;
        let (_, e) = out["inputs_embeds"].try_extract_tensor::<f32>().map_err(err)?;
        Ok((e.to_vec(), n))
    }

    /// Runs the decoder on `embeds` ([len][hidden]) after `past`; returns the last logits and the extended past.
    fn decode(&self, embeds: &[f32], len: usize, past: Option<&Past>) -> Result<(Vec<f32>, Past)> {
        let (l, kv, hd) = (self.spec.layers, self.spec.kv_heads, self.spec.head_dim);
        let p = past.map_or(0, |p| p.len);
        let hidden = embeds.len() / len.max(1);
        let mut inputs: Vec<(String, ort::session::SessionInputValue<'_>)> = vec![
            ("inputs_embeds".into(), Tensor::from_array((vec![1, len, hidden], embeds.to_vec())).map_err(err)?.into()),
            ("attention_mask".into(), Tensor::from_array((vec![1, p + len], vec![1i64; p + len])).map_err(err)?.into()),
            (
                "position_ids".into(),
                Tensor::from_array((vec![1, len], (p as i64..(p + len) as i64).collect::<Vec<_>>()))
                    .map_err(err)?
                    .into(),
            ),
        ];
        for i in 0..l {
            for (which, data) in [("key", past.map(|p| &p.keys[i])), ("value", past.map(|p| &p.values[i]))] {
                let v = data.cloned().unwrap_or_default();
                inputs.push((
                    format!("past_key_values.{i}.{which}"),
                    Tensor::from_array((vec![1, kv, p, hd], v)).map_err(err)?.into(),
                ));
            }
        }
        let mut s = self.decoder.lock().map_err(|_| err("decoder poisoned"))?;
        let out = s.run(inputs).map_err(err)?;
        let (shape, logits) = out["logits"].try_extract_tensor::<f32>().map_err(err)?;
        let vocab = *shape.last().unwrap_or(&0) as usize;
        let last = logits[logits.len() - vocab..].to_vec();
        let mut next = Past { keys: Vec::with_capacity(l), values: Vec::with_capacity(l), len: p + len };
        for i in 0..l {
            next.keys
                .push(out[format!("present.{i}.key").as_str()].try_extract_tensor::<f32>().map_err(err)?.1.to_vec());
            next.values
                .push(out[format!("present.{i}.value").as_str()].try_extract_tensor::<f32>().map_err(err)?.1.to_vec());
        }
        Ok((last, next))
    }

    /// The item's past: prompt prefix, image features, text after the image.
    fn prefill(&self, image: &Path) -> Result<Past> {
        let s = self.spec.image_size;
        let pixels = self.pixels(image)?;
        let features = {
            let mut v = self.vision.lock().map_err(|_| err("vision encoder poisoned"))?;
            let VisionInputs { five_d, mask } = self.vision_inputs;
            let shape = if five_d { vec![1, 1, 3, s, s] } else { vec![1, 3, s, s] };
            let mut inputs: Vec<(String, SessionInputValue<'_>)> =
                vec![("pixel_values".into(), Tensor::from_array((shape, pixels)).map_err(err)?.into())];
            if mask {
                let m = Tensor::from_array((vec![1, 1, s, s], vec![true; s * s])).map_err(err)?;
                inputs.push(("pixel_attention_mask".into(), m.into()));
            }
            let out = v.run(inputs).map_err(err)?;
            out["image_features"].try_extract_tensor::<f32>().map_err(err)?.1.to_vec()
        };
        let (mut embeds, mut len) = self.embed(&self.spec.prompt_prefix)?;
        let hidden = match embeds.len().checked_div(len) {
            Some(h) => h,
            None => self.embed("a")?.0.len(),
        };
        if hidden == 0 || features.len() % hidden != 0 {
            return Err(err(format!(
                "image features ({} values) do not split into tokens of {hidden}",
                features.len()
            )));
        }
        len += features.len() / hidden;
        embeds.extend(features);
        let (after, n_after) = self.embed(&self.spec.after_image)?;
        embeds.extend(after);
        len += n_after;
        Ok(self.decode(&embeds, len, None)?.1)
    }

    fn log_odds(&self, past: &Past, question: &str) -> Result<f64> {
        let (q, n) = self.embed(&format!("{question}{}", self.spec.prompt_suffix))?;
        if n == 0 {
            return Err(err("empty question"));
        }
        let (logits, _) = self.decode(&q, n, Some(past))?;
        Ok((logits[self.yes as usize] - logits[self.no as usize]) as f64)
    }
}

/// Configuration: the model folder.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VlmConfig {
    /// Folder with `stretto-vlm.json` and the ONNX files.
    pub dir: PathBuf,
    /// Operator name suffix (default: the folder's name).
    #[serde(default)]
    pub name: Option<String>,
}

/// The VLM filter operator.
pub struct VlmFilter {
    name: String,
    props: OpProperties,
    dir: PathBuf,
    ctx: OpContext,
    loaded: OnceLock<std::result::Result<Arc<Loaded>, String>>,
}

impl std::fmt::Debug for VlmFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VlmFilter").field("name", &self.name).field("dir", &self.dir).finish()
    }
}

impl VlmFilter {
    /// Builds it (cheap: the model loads on first evaluation).
    pub fn new(config: VlmConfig, ctx: &OpContext) -> Self {
        let label = config
            .name
            .clone()
            .unwrap_or_else(|| config.dir.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string());
        Self {
            name: format!("vlm:{label}"),
            props: OpProperties {
                kind: LogicalKind::Filter,
                family: "vlm-filter".into(),
                modality: Modality::Image,
                model: Some(format!("vlm:{}", config.dir.display())),
                compression: Some(0.0),
                tunable: true,
                gold: false,
                cost_hint: 0.5,
                score_range: (-10.0, 10.0),
            },
            dir: config.dir,
            ctx: ctx.clone(),
            loaded: OnceLock::new(),
        }
    }

    fn model(&self) -> Result<Arc<Loaded>> {
        self.loaded
            .get_or_init(|| Loaded::open(&self.dir, &self.ctx).map(Arc::new).map_err(|e| e.to_string()))
            .clone()
            .map_err(|e| CoreError::operator(&self.name, e))
    }
}

impl PhysicalOp for VlmFilter {
    fn name(&self) -> &str {
        &self.name
    }

    fn properties(&self) -> &OpProperties {
        &self.props
    }

    fn evaluate_items(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
        let question = stretto_ops_text::llm::about(&task.prompt, "the image");
        let question = format!(" Is it true that {}? Answer yes or no.", question.trim().trim_end_matches(['.', '?']));
        let m = self.model()?;
        let mut scores = Vec::with_capacity(items.len());
        let mut secs = Vec::with_capacity(items.len());
        for item in items {
            if item.is_empty() {
                // No image (an empty cell): nothing in it can be what the predicate asks for, so the lowest score
                // there is, as the bridges give it, rather than a failed query.
                scores.push(self.props.score_range.0);
                secs.push(1e-9);
                continue;
            }
            let start = Instant::now();
            let past = m.prefill(Path::new(item)).map_err(|e| CoreError::operator_failed(&self.name, e))?;
            scores.push(m.log_odds(&past, &question)?);
            secs.push(start.elapsed().as_secs_f64().max(1e-9));
        }
        Ok((OpOutput::Scores(scores), secs))
    }
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "vlm-filter",
        plugin: crate::PLUGIN,
        about: "a user-provided vision-language model in the Hugging Face ONNX layout (no rung by default: none ships)",
        ladder: |_| Vec::new(),
        build: |c, ctx| Ok(Arc::new(VlmFilter::new(parse_config("vlm-filter", c)?, ctx))),
    }
}
