//! # stretto-kv
//!
//! Home of KV-past decoding on ONNX Runtime, the on-disk KV cache store and its compression presses.
//!
//! Nothing is implemented here yet: the model runtime and the cache store are tracked as their own issues. The
//! crate exists so the workspace has the shape the design fixes and dependants can be wired up.
