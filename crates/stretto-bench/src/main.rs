//! The `stretto` command-line tool.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use arrow::util::pretty::pretty_format_batches;
use clap::{Parser, Subcommand};
use stretto_bench::commands;

/// Stretto: semantic queries with end-to-end precision and recall guarantees.
#[derive(Parser, Debug)]
#[command(name = "stretto", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the bundled datasets with their row counts.
    Datasets {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List every registered physical operator.
    Ops {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Execute a `stretto.plan/v1` file whose stages name registered operators.
    RunPlan {
        /// Bundled dataset to run on.
        #[arg(long)]
        dataset: String,
        /// The plan file.
        #[arg(long)]
        plan: PathBuf,
        /// Read at most this many rows of each table.
        #[arg(long)]
        limit: Option<usize>,
        /// Result rows to print.
        #[arg(long, default_value_t = 10)]
        show: usize,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Datasets { json } => {
            let rows = commands::dataset_rows()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!("{:<10} {:<10} {:>6}  other tables", "dataset", "table", "rows");
                for d in rows {
                    let others: Vec<String> = d.tables.iter().skip(1).map(|(t, n)| format!("{t} ({n})")).collect();
                    println!("{:<10} {:<10} {:>6}  {}", d.name, d.table, d.rows, others.join(", "));
                }
            }
        }
        Command::Ops { json } => {
            let rows = commands::op_rows()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:<28} {:<8} {:<18} {:<8} {:<22} {:>5}  plugin",
                    "operator", "kind", "family", "modality", "model", "ratio"
                );
                for o in rows {
                    let ratio = o.compression.map(|r| format!("{r}")).unwrap_or_else(|| "-".into());
                    println!(
                        "{:<28} {:<8} {:<18} {:<8} {:<22} {:>5}  {}",
                        o.name,
                        o.kind,
                        o.family,
                        o.modality,
                        o.model.as_deref().unwrap_or("-"),
                        ratio,
                        o.plugin
                    );
                }
            }
        }
        Command::RunPlan { dataset, plan, limit, show } => {
            let out = commands::run_plan(&dataset, &plan, limit, std::io::stderr().is_terminal())?;
            println!("{} input tuples, {} in the result\n", out.input_rows, out.cascade.len());
            println!("{:<36} {:>8} {:>8} {:>8} {:>8} {:>9}", "stage", "in", "accept", "reject", "unsure", "seconds");
            for s in &out.cascade.stats {
                println!(
                    "{:<36} {:>8} {:>8} {:>8} {:>8} {:>9.4}",
                    s.physical, s.tuples_in, s.accepted, s.rejected, s.unsure, s.seconds
                );
            }
            let shown = out.cascade.batch.slice(0, show.min(out.cascade.batch.num_rows()));
            println!("\n{}", pretty_format_batches(&[truncate_text(&shown)])?);
        }
    }
    Ok(())
}

/// Shortens long text cells so the result table stays readable.
fn truncate_text(batch: &arrow::array::RecordBatch) -> arrow::array::RecordBatch {
    use arrow::array::{ArrayRef, AsArray, StringArray};
    let cols: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match c.as_string_opt::<i32>() {
            Some(s) => std::sync::Arc::new(
                s.iter()
                    .map(|v| {
                        v.map(|v| {
                            if v.chars().count() > 60 {
                                format!("{}…", v.chars().take(60).collect::<String>())
                            } else {
                                v.to_string()
                            }
                        })
                    })
                    .collect::<StringArray>(),
            ) as ArrayRef,
            None => c.clone(),
        })
        .collect();
    arrow::array::RecordBatch::try_new(batch.schema(), cols).unwrap_or_else(|_| batch.clone())
}
