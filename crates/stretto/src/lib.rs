//! # stretto
//!
//! The facade over Stretto's crates: it re-exports them and links every operator plugin, so a binary that
//! depends on `stretto` and calls [`registry()`] sees every operator, with a clear error if one is missing.
//!
//! ```
//! let registry = stretto::registry()?;
//! for (op, factory) in registry.operators() {
//!     println!("{} ({factory}): {}", op.name(), op.properties().family);
//! }
//! # Ok::<(), stretto::core::CoreError>(())
//! ```

#![warn(missing_docs)]

pub use stretto_core as core;
pub use stretto_kv as kv;
pub use stretto_ops_image as ops_image;
pub use stretto_ops_text as ops_text;
pub use stretto_optim as optim;

use stretto_core::op::Registry;

/// The plugin crates this facade links.
pub const PLUGINS: &[&str] = &[stretto_ops_text::PLUGIN, stretto_ops_image::PLUGIN];

/// Names a symbol of every plugin crate so rustc links them and their `inventory` registrations survive.
pub fn link() {
    let _ = (stretto_ops_text::link(), stretto_ops_image::link());
}

/// Links the plugins, discovers every registered operator and checks that each plugin crate made it in.
pub fn registry() -> stretto_core::Result<Registry> {
    link();
    let registry = Registry::discover()?;
    registry.require_plugins(PLUGINS)?;
    Ok(registry)
}
