//! # stretto-ops-image
//!
//! Physical operators over image columns (label-bridge embedding filter, caption-bridge LLM operators, a VLM
//! operator for the Hugging Face ONNX layout), contributed to the registry via `inventory`.
//!
//! Bundled today: the [`bridge`] label-bridge filter (an EfficientNet class posterior bridged to text embeddings,
//! named as the composition it is). The caption-bridge LLM operators and the VLM operator are not built yet.
//!
//!
//! ```
//! stretto_ops_image::link();
//! let registry = stretto_core::op::Registry::discover()?;
//! registry.require_plugins(&[stretto_ops_image::PLUGIN])?;
//! # Ok::<(), stretto_core::CoreError>(())
//! ```

#![warn(missing_docs)]

pub mod bridge;

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
