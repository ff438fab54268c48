//! # stretto-optim
//!
//! The global cascade optimizer (work in progress).
