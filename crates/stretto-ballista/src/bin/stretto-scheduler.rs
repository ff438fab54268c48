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
    stretto_ballista::process::init_logging();
    match stretto_ballista::process::run_scheduler(Cli::parse().args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stretto-scheduler: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
