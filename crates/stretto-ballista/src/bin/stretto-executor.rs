//! `stretto-executor`: Ballista's executor with Stretto's operators linked in.

use clap::Parser;

/// Ballista's executor for Stretto's semantic SQL: runs the certified cascades the scheduler hands out with this
/// node's models, KV store and memo.
#[derive(Debug, Parser)]
#[command(name = "stretto-executor", version)]
struct Cli {
    #[command(flatten)]
    args: stretto_ballista::process::ExecutorArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    stretto_ballista::process::init_logging();
    let mut args = Cli::parse().args;
    // The environment is read here, at the binary's edge.
    if args.model_home.is_none() {
        args.model_home = Some(stretto::core::context::default_home());
    }
    match stretto_ballista::process::run_executor(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stretto-executor: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
