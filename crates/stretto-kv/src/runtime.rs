//! ONNX Runtime for Stretto: one environment per process, with the library loaded from the pinned `onnxruntime`
//! wheel of the model catalog (prepared on first use), never from a CDN.
//!
//! ONNX Runtime allows one environment per process and `ort` keeps only a weak reference to it, so it lives in a
//! `static` here, built once behind a lock. Execution providers are chosen per model session ([`RuntimeOptions`]),
//! so one process can run one registry on the GPU and another on the CPU. The CUDA execution provider (built with
//! the `cuda` feature) is registered with `error_on_failure`: without it ONNX Runtime silently falls back to the
//! CPU when CUDA cannot start.

use std::path::Path;
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;
use ort::ep::ExecutionProviderDispatch;
use ort::session::builder::SessionBuilder;

use crate::error::{KvError, Result};
use crate::models::{default_source, ensure, spec};

/// The shared library inside the prepared `onnxruntime` model folder.
pub const LIBRARY: &str = "libonnxruntime.so.1.31.1";

static ENVIRONMENT: OnceLock<Environment> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// How a model session runs: intra-op threads and execution provider. A thread count alone means the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RuntimeOptions {
    /// Intra-op threads (0: ONNX Runtime's choice).
    pub threads: usize,
    /// Run on ONNX Runtime's CUDA execution provider (needs the `cuda` feature).
    pub cuda: bool,
}

impl RuntimeOptions {
    /// `threads` intra-op threads, on CUDA when `cuda`.
    pub fn new(threads: usize, cuda: bool) -> Self {
        Self { threads, cuda }
    }
}

impl From<usize> for RuntimeOptions {
    fn from(threads: usize) -> Self {
        Self { threads, cuda: false }
    }
}

/// The execution providers a session tries, in order (CPU last).
pub fn execution_providers(options: RuntimeOptions) -> Result<Vec<ExecutionProviderDispatch>> {
    let mut providers = Vec::new();
    if options.cuda {
        #[cfg(feature = "cuda")]
        providers.push(ort::ep::CUDA::default().build().error_on_failure());
        #[cfg(not(feature = "cuda"))]
        return Err(KvError::Usage("the CUDA execution provider needs Stretto built with `--features cuda`".into()));
    }
    providers.push(
        // Without its arena, the CPU provider returns buffers after each run. Decoder shapes change with every
        // batch (past length, padding), and an arena keeps its peak: a single 10,000-token prefill would pin
        // gigabytes of attention scratch for the rest of the process.
        ort::ep::CPU::default().with_arena_allocator(false).build(),
    );
    Ok(providers)
}

/// The process's ONNX Runtime environment, loading the library from `home` (preparing it if missing).
///
/// Call it before any other `ort` API (tensors, graphs, sessions): `ort` resolves the library on first use and,
/// without this, would look for a system-wide `libonnxruntime.so` and panic when there is none.
pub fn environment(home: &Path) -> Result<&'static Environment> {
    if let Some(env) = ENVIRONMENT.get() {
        return Ok(env);
    }
    let _guard = INIT.lock().map_err(|_| KvError::Runtime("a previous initialisation panicked".into()))?;
    if let Some(env) = ENVIRONMENT.get() {
        return Ok(env);
    }
    let _span = tracing::info_span!("onnxruntime_init").entered();
    let dir = ensure(spec("onnxruntime")?, home, default_source().as_ref())?;
    let lib = dir.join(LIBRARY);
    let env = ort::init_from(&lib)
        .map_err(|e| KvError::Runtime(format!("cannot load {}: {e}", lib.display())))?
        .with_name("stretto")
        .build()?;
    Ok(ENVIRONMENT.get_or_init(|| env))
}

/// A session of the ONNX model at `path` under `options`; an error names the file.
pub fn load_session(home: &Path, options: impl Into<RuntimeOptions>, path: &Path) -> Result<ort::session::Session> {
    session_builder(home, options)?
        .commit_from_file(path)
        .map_err(|e| KvError::Runtime(format!("cannot load {}: {e}", path.display())))
}

/// A session builder on the process's environment, with the options' threads (0 lets ONNX Runtime choose) and
/// execution providers.
pub fn session_builder(home: &Path, options: impl Into<RuntimeOptions>) -> Result<SessionBuilder> {
    let options = options.into();
    let threads = options.threads;
    // Memory patterns only pay off when shapes repeat; decoder shapes do not.
    let builder = SessionBuilder::new(environment(home)?)?
        .with_memory_pattern(false)
        .map_err(|e| KvError::Runtime(e.to_string()))?
        .with_execution_providers(execution_providers(options)?)
        .map_err(|e| KvError::Runtime(e.to_string()))?;
    let builder = if threads > 0 {
        builder.with_intra_threads(threads).map_err(|e| KvError::Runtime(e.to_string()))?
    } else {
        builder
    };
    Ok(builder)
}
