//! What a [`Session`](crate::Session) is configured with.

use std::path::PathBuf;
use std::str::FromStr;

pub use stretto_core::context::ExecutionProvider;
use stretto_core::OpContext;

/// Everything a session is configured with.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionConfig {
    /// Model home, KV cache directory, memo policy, threads, execution provider, the LLM ladder and the encoders:
    /// what operators run under.
    pub operators: OpContext,
    /// Models physical operators may use in a query (operators without a model are always allowed).
    pub models: Vec<String>,
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
    /// Most tuples profiled, whatever the fraction: see [`crate::engine::QueryOptions::max_sample`].
    pub max_sample: usize,
    /// Tuples of the first, screening stage of profiling (outside the sample; 0 profiles every candidate on the
    /// whole sample): see [`crate::engine::QueryOptions::screen`].
    pub screen: usize,
    /// Whether the pay checks price profiling answers already in the memo as a cold run would pay them
    /// ([`crate::engine::QueryOptions::price_memo_hits`]; off: they cost nothing).
    pub price_memo_hits: bool,
    /// The user's own models (name, GGUF file or ONNX export folder), registered when the session is built.
    pub user_models: Vec<(String, PathBuf)>,
}

/// A user's own model as a command line names it, `NAME=PATH` (`stretto query`, `stretto sql` and
/// `stretto executor`'s `--model`): a GGUF decoder file or a Hugging Face ONNX export folder, registered as model
/// `name` when a session is built ([`crate::SessionBuilder::model`]).
///
/// ```
/// let m: stretto::UserModel = "mine=/models/qwen2.5-7b-instruct-q4.gguf".parse()?;
/// assert_eq!((m.name.as_str(), m.path.to_str()), ("mine", Some("/models/qwen2.5-7b-instruct-q4.gguf")));
/// assert!("/models/a.gguf".parse::<stretto::UserModel>().is_err());
/// # Ok::<(), stretto::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserModel {
    /// The name queries and ladders use.
    pub name: String,
    /// The GGUF file or export folder.
    pub path: PathBuf,
}

impl FromStr for UserModel {
    type Err = crate::Error;

    fn from_str(spec: &str) -> crate::Result<Self> {
        match spec.split_once('=') {
            Some((name, path)) if !name.is_empty() && !path.is_empty() => {
                Ok(Self { name: name.to_string(), path: PathBuf::from(path) })
            }
            _ => Err(crate::Error::Query(format!(
                "model `{spec}`: write it as NAME=PATH (a GGUF file or an ONNX export folder)"
            ))),
        }
    }
}
