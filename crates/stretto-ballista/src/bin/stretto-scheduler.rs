//! `stretto-scheduler`: Ballista's scheduler with Stretto's planner and codecs.

use clap::Parser;

/// Ballista's scheduler for Stretto's semantic SQL: clients submit certified queries here
/// (`stretto sql --cluster HOST:PORT`), executors (`stretto-executor`) run them.
#[derive(Debug, Parser)]
#[command(name = "stretto-scheduler", version)]
struct Cli {
    #[command(flatten)]
    args: stretto_ballista::process::SchedulerArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,ballista=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match stretto_ballista::process::run_scheduler(Cli::parse().args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stretto-scheduler: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
