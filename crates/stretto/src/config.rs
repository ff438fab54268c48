//! What a [`Session`](crate::Session) is configured with.

use std::path::PathBuf;

use stretto_core::OpContext;

/// Where models run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutionProvider {
    /// ONNX Runtime's CPU kernels.
    #[default]
    Cpu,
    /// ONNX Runtime's CUDA execution provider (needs the `cuda` feature and onnxruntime-gpu's libraries).
    ///
    /// ONNX Runtime's environment is one per process: in a build with the `cuda` feature every session tries CUDA
    /// first and falls back to the CPU, whatever this setting says; without the feature, asking for CUDA is an
    /// error when the session is built.
    Cuda,
}

/// Everything a session is configured with.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionConfig {
    /// Model home, KV cache directory, memo policy, threads and the LLM ladder: what operators run under.
    pub operators: OpContext,
    /// Models physical operators may use in a query (operators without a model are always allowed).
    pub models: Vec<String>,
    /// Where models run.
    pub provider: ExecutionProvider,
    /// Progress bars on long work.
    pub progress: bool,
    /// Where each query writes its profile and plan (nowhere when `None`).
    pub run_dir: Option<PathBuf>,
    /// Seed of the profiling sample and the optimizer.
    pub seed: u64,
    /// Fraction of the input profiled.
    pub sample_fraction: f64,
    /// Fewest tuples profiled (all of them when the input is smaller).
    pub min_sample: usize,
    /// The user's own models (name, GGUF file or ONNX export folder), registered when the session is built.
    pub user_models: Vec<(String, PathBuf)>,
}
