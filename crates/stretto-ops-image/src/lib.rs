//! # stretto-ops-image
//!
//! Physical operators over image columns (label-bridge embedding filter, caption-bridge LLM operators, a VLM
//! operator for the Hugging Face ONNX layout), contributed to the registry via `inventory`.
//!
//! Bundled today, each an honest composition named as what it is (no CLIP-like model is available offline):
//! - [`bridge`]: the label-bridge filter, an EfficientNet class posterior bridged to text embeddings;
//! - [`caption`]: caption-bridge LLM filter and map, the image's classes written as the LLM's cached item.
//!
//! - [`vlm`]: a real vision-language model operator for models in the Hugging Face ONNX layout that users bring.
//!
//!
//! ```
//! stretto_ops_image::link();
//! let registry = stretto_core::op::Registry::discover(&stretto_core::OpContext::new("/tmp/stretto-home"))?;
//! registry.require_plugins(&[stretto_ops_image::PLUGIN])?;
//! # Ok::<(), stretto_core::CoreError>(())
//! ```

#![warn(missing_docs)]

pub mod bridge;
pub mod caption;
pub mod vlm;

/// This crate's name as registered in the plugin registry.
pub const PLUGIN: &str = "stretto-ops-image";

stretto_core::inventory::submit! {
    stretto_core::op::PluginCrate { name: PLUGIN }
}

/// Forces the linker to keep this crate and its `inventory` registrations (see `stretto::link`).
#[inline(never)]
pub fn link() -> &'static str {
    std::hint::black_box(PLUGIN)
}
