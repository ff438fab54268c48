//! A semantic pipeline composed in Rust and run with precision/recall targets:
//! scan → relational filter → semantic filter → semantic map.
//!
//! `cargo run --release -p stretto-bench --example pipeline` (prepares SmolLM2-135M and MiniLM on first use).

use stretto_bench::query::{render, run_pipeline, QueryOptions};
use stretto_core::datasets::Dataset;
use stretto_core::expr::{col, lit};
use stretto_core::op::ValueType;
use stretto_core::plan::PlanBuilder;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let movie = Dataset::load("movie")?;
    let reviews = movie.table("reviews")?.slice(0, 300);

    // Top critics only (relational, runs first), then two semantic operators.
    let plan = PlanBuilder::scan("reviews", &reviews)?
        .filter(col("reviews.istopcritic").eq(lit(true)))?
        .sem_filter("{reviews.reviewtext} is clearly positive")?
        .sem_map("title", "Extract the movie title mentioned in {reviews.reviewtext}", ValueType::String)?
        .build();
    println!("logical plan:\n{plan}");

    let pulled = plan.pull_up()?;
    let input = pulled.relational.execute_relational()?;
    let mut options = QueryOptions::new("movie", "top critics' clearly positive reviews, with the movie title");
    (options.precision, options.recall, options.check) = (0.8, 0.8, true);
    options.run_dir = "stretto-run".into();
    let report = run_pipeline(&pulled, &input, &options)?;
    print!("{}", render(&report, 5));
    Ok(())
}
