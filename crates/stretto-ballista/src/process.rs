//! The scheduler and executor processes: Ballista's, with Stretto's codecs, planner and operators. The
//! `stretto-scheduler` and `stretto-executor` binaries parse these arguments and call [`run_scheduler`] /
//! [`run_executor`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::execution::session_state::SessionStateBuilder;

use crate::exec::{ExecutorResources, TaskLog};
use crate::{ClusterError, Result, SchedulerQueryPlanner, StrettoLogicalCodec, StrettoPhysicalCodec};

/// Logs to stderr, filtered by `RUST_LOG` (default `info`): the binaries' logging.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
}

/// A scheduler's settings (`stretto-scheduler --help`).
#[derive(Debug, Clone, clap::Args)]
pub struct SchedulerArgs {
    /// Address to listen on (`0.0.0.0` for every interface: executors on other hosts must reach it).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_host: String,
    /// The host name or address others reach this scheduler at (default: `--bind-host`; needed where that is
    /// `0.0.0.0` or `::`).
    #[arg(long)]
    pub external_host: Option<String>,
    /// Port of the scheduler's gRPC service (clients and executors connect here).
    #[arg(long, default_value_t = 50050)]
    pub port: u16,
    /// Seconds without a heartbeat after which an executor counts as lost and its tasks run elsewhere.
    #[arg(long, default_value_t = 180)]
    pub executor_timeout_seconds: u64,
    /// Seconds between checks for lost executors.
    #[arg(long, default_value_t = 15)]
    pub expire_dead_executor_interval_seconds: u64,
    /// Failures of one task before its query fails.
    #[arg(long, default_value_t = 4)]
    pub task_max_failures: usize,
}

/// Runs a scheduler until the process ends.
pub async fn run_scheduler(args: SchedulerArgs) -> Result<()> {
    let addr: SocketAddr = format!("{}:{}", args.bind_host, args.port)
        .parse()
        .map_err(|e| ClusterError::Config(format!("bind address {}:{}: {e}", args.bind_host, args.port)))?;
    let config = SchedulerConfig {
        bind_host: args.bind_host.clone(),
        bind_port: args.port,
        external_host: external_host(&args.bind_host, args.external_host.as_deref(), "stretto scheduler")?,
        executor_timeout_seconds: args.executor_timeout_seconds,
        expire_dead_executor_interval_seconds: args.expire_dead_executor_interval_seconds,
        no_executors_grace_period_seconds: args.executor_timeout_seconds,
        task_max_failures: args.task_max_failures,
        override_config_producer: Some(Arc::new(crate::session_config)),
        override_session_builder: Some(Arc::new(|config| {
            let state = ballista_core::utils::default_session_builder(config)?;
            Ok(SessionStateBuilder::new_from_existing(state)
                .with_query_planner(Arc::new(SchedulerQueryPlanner))
                .build())
        })),
        override_logical_codec: Some(Arc::new(StrettoLogicalCodec::default())),
        override_physical_codec: Some(Arc::new(StrettoPhysicalCodec::default())),
        ..Default::default()
    };
    let cluster = BallistaCluster::new_from_config(&config).await?;
    tracing::info!(%addr, "stretto scheduler listening");
    start_server(cluster, addr, Arc::new(config)).await?;
    Ok(())
}

/// An executor's settings (`stretto-executor --help`).
#[derive(Debug, Clone, clap::Args)]
pub struct ExecutorArgs {
    /// The scheduler, `HOST:PORT`.
    #[arg(long, default_value = "localhost:50050")]
    pub scheduler: String,
    /// Address to listen on (`0.0.0.0` for every interface: on a cluster of several hosts, other executors and
    /// the client fetch results from it).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_host: String,
    /// The host name or address the scheduler, other executors and clients reach this executor at (default:
    /// `--bind-host`; needed where that is `0.0.0.0` or `::`). The scheduler hands it out with this executor's
    /// results, so on a cluster of several hosts it must not be a loopback address.
    #[arg(long)]
    pub external_host: Option<String>,
    /// Port of the executor's Arrow Flight service (other executors and clients fetch results here).
    #[arg(long, default_value_t = 50051)]
    pub port: u16,
    /// Port of the executor's gRPC service.
    #[arg(long, default_value_t = 50052)]
    pub grpc_port: u16,
    /// Tasks run at once (each runs its operators on the model pool's threads).
    #[arg(long, default_value_t = 1)]
    pub concurrent_tasks: usize,
    /// Seconds between heartbeats to the scheduler.
    #[arg(long, default_value_t = 60)]
    pub heartbeat_seconds: u64,
    /// Executor id (default: a fresh one, `stretto-HOST-PORT-PID` of its external host).
    #[arg(long)]
    pub id: Option<String>,
    /// Scratch folder for intermediate results; the task log (`stretto-tasks.jsonl`) is written here.
    #[arg(long)]
    pub work_dir: PathBuf,
    /// Model home of this node (models are prepared there on first use; the binaries default to STRETTO_HOME, else
    /// the user's cache folder).
    #[arg(long)]
    pub model_home: Option<PathBuf>,
    /// KV store of this node: a path shared by all nodes lets each item's cache be built once for the cluster.
    #[arg(long)]
    pub kv_dir: Option<PathBuf>,
    /// Memo of answers of this node (default: inside the model home).
    #[arg(long)]
    pub memo_dir: Option<PathBuf>,
    /// Decoder models of the LLM ladder, smallest first (the plans this executor runs name them).
    #[arg(long, value_delimiter = ',', default_value = "smollm2-135m,qwen2.5-coder-0.5b")]
    pub ladder: Vec<String>,
    /// Models operators may use (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "smollm2-135m,minilm,efficientnet-lite0")]
    pub models: Vec<String>,
    /// A user's own model as model NAME (repeatable): the one the client's `--model NAME=PATH` names, at its path
    /// on this node (a GGUF decoder file, converted once into this node's model home, or a Hugging Face ONNX export
    /// folder). Name a decoder in --ladder as the client does.
    #[arg(long = "model", value_name = "NAME=PATH")]
    pub user_models: Vec<stretto::UserModel>,
    /// Also offer both weight-quantized rungs of every ladder model: needed where the client's plans may name them
    /// (`stretto sql --cluster --int8-rungs`).
    #[arg(long)]
    pub int8_rungs: bool,
    /// Sentence encoders of the embedding filters, one rung each (default: minilm): those the client's
    /// `--encoders` names, which its plans may name. They are allowed here whatever --models says.
    #[arg(long, value_delimiter = ',')]
    pub encoders: Option<Vec<String>>,
    /// Bytes of working memory one model run may take beyond the model's weights (default 1 GiB).
    #[arg(long)]
    pub memory_budget: Option<u64>,
    /// Threads per model session.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Run the models with ONNX Runtime's CUDA execution provider (a build with the `cuda` feature and
    /// onnxruntime-gpu's libraries): one executor per GPU.
    #[arg(long)]
    pub cuda: bool,
}

/// The Stretto session of an executor.
pub fn executor_session(args: &ExecutorArgs) -> Result<stretto::Session> {
    let home = args.model_home.clone().ok_or_else(|| ClusterError::Config("an executor needs --model-home".into()))?;
    let mut models = args.models.clone();
    for e in args.encoders.iter().flatten() {
        if !models.contains(e) {
            models.push(e.clone());
        }
    }
    let mut b = stretto::Session::builder(home);
    for m in &args.user_models {
        b = b.model(m.name.clone(), m.path.clone());
    }
    let mut b = b
        .ladder(args.ladder.clone())
        .models(models)
        .int8_rungs(args.int8_rungs)
        .threads(args.threads.max(1))
        .progress(false);
    if let Some(encoders) = &args.encoders {
        b = b.encoders(encoders.clone());
    }
    if let Some(bytes) = args.memory_budget {
        b = b.memory_budget(bytes);
    }
    if args.cuda {
        b = b.execution_provider(stretto::core::context::ExecutionProvider::Cuda);
    }
    if let Some(d) = &args.kv_dir {
        b = b.kv_dir(d.clone());
    }
    if let Some(d) = &args.memo_dir {
        b = b.memo_dir(d.clone());
    }
    Ok(b.build()?)
}

/// The host a node is reached at: `external` where given, else the address it binds, which must then be one others
/// can reach it at (not a wildcard such as `0.0.0.0`).
fn external_host(bind: &str, external: Option<&str>, node: &str) -> Result<String> {
    if let Some(e) = external.map(str::trim) {
        if e.is_empty() {
            return Err(ClusterError::Config(format!("{node}: --external-host is empty")));
        }
        return Ok(e.to_string());
    }
    match bind.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_unspecified() => Err(ClusterError::Config(format!(
            "{node}: --bind-host {bind} listens on every interface but is no address others can reach it at: \
             add --external-host with this machine's host name or address"
        ))),
        _ => Ok(bind.to_string()),
    }
}

/// Runs an executor until the process ends.
pub async fn run_executor(args: ExecutorArgs) -> Result<()> {
    let (host, port) =
        args.scheduler.rsplit_once(':').and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?))).ok_or_else(
            || ClusterError::Config(format!("the scheduler address `{}` is not HOST:PORT", args.scheduler)),
        )?;
    std::fs::create_dir_all(&args.work_dir)
        .map_err(|e| ClusterError::Config(format!("cannot create the work dir {}: {e}", args.work_dir.display())))?;
    let external = external_host(&args.bind_host, args.external_host.as_deref(), "stretto executor")?;
    let session = executor_session(&args)?;
    // Fresh per process: two hosts both bound to 127.0.0.1:50051 (or a restarted executor) never share an id,
    // which the scheduler would refuse.
    let id = args.id.clone().unwrap_or_else(|| format!("stretto-{external}-{}-{}", args.port, std::process::id()));
    let resources = ExecutorResources {
        session,
        task_log: Some(TaskLog::new(id.clone(), args.work_dir.join("stretto-tasks.jsonl"))),
    };
    let work_dir = args
        .work_dir
        .to_str()
        .ok_or_else(|| ClusterError::Config(format!("{} is not a UTF-8 path", args.work_dir.display())))?
        .to_string();
    let config = ExecutorProcessConfig {
        executor_id: id,
        bind_host: args.bind_host.clone(),
        external_host: Some(external),
        port: args.port,
        grpc_port: args.grpc_port,
        scheduler_host: host,
        scheduler_port: port,
        scheduler_connect_timeout_seconds: 30,
        vcores: args.concurrent_tasks.max(1),
        work_dir: Some(work_dir),
        executor_heartbeat_interval_seconds: args.heartbeat_seconds.max(1),
        override_config_producer: Some(Arc::new(crate::session_config)),
        override_logical_codec: Some(Arc::new(StrettoLogicalCodec::default())),
        override_physical_codec: Some(Arc::new(StrettoPhysicalCodec::for_executor(resources))),
        ..Default::default()
    };
    start_executor_process(Arc::new(config)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_reached_at_its_external_host_and_a_wildcard_bind_needs_one() {
        assert_eq!(external_host("127.0.0.1", None, "n").unwrap(), "127.0.0.1");
        assert_eq!(external_host("0.0.0.0", Some("node-7.lan"), "n").unwrap(), "node-7.lan");
        assert_eq!(external_host("10.0.0.5", Some("node-7.lan"), "n").unwrap(), "node-7.lan");
        for bind in ["0.0.0.0", "::"] {
            let e = external_host(bind, None, "stretto executor").unwrap_err().to_string();
            assert!(e.contains("--external-host") && e.contains(bind), "{e}");
        }
        assert!(external_host("0.0.0.0", Some(" "), "n").is_err());
    }

    #[test]
    fn an_executor_runs_a_users_model_it_is_given_by_name_and_path() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ExecutorArgs,
        }
        let home = tempfile::tempdir().unwrap();
        let export =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../stretto-models/tests/fixtures/hf-export");
        let parse = |extra: &[&str]| {
            let mut argv = vec!["stretto-executor", "--work-dir", "w", "--model-home", home.path().to_str().unwrap()];
            argv.extend_from_slice(extra);
            <Cli as clap::Parser>::try_parse_from(argv).map(|c| c.args)
        };
        let decoder = format!("mine={}", export.join("decoder").display());
        let args = parse(&["--model", &decoder, "--ladder", "mine"]).unwrap();
        let session = executor_session(&args).unwrap();
        // The rungs of the plans a client with the same --model sends.
        for op in ["llm:mine@key-norm-0.00", "llm:mine@key-norm-0.50"] {
            assert!(session.registry().get(op).is_ok(), "{op} is not offered");
        }
        // A ladder name no --model registered in this node's home is unknown; a spec without a path is refused as
        // the flag is read, by `UserModel`'s own message.
        let e = executor_session(&parse(&["--ladder", "yours"]).unwrap()).unwrap_err().to_string();
        assert!(e.contains("yours"), "{e}");
        let e = parse(&["--model", "mine"]).err().unwrap().to_string();
        assert!(e.contains("model `mine`: write it as NAME=PATH"), "{e}");
    }
}
