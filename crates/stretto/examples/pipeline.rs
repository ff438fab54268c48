//! A semantic pipeline as a `Session` program: read a CSV file, keep top critics (relational), keep clearly
//! positive reviews and extract the movie title (semantic), under targets 0.8/0.8 at 95%, and write Parquet.
//!
//! `cargo run --release -p stretto --example pipeline -- reviews.csv positive.parquet [ROWS]`
//! (prepares SmolLM2-135M and MiniLM on first use; `STRETTO_HOME` says where models live).

use std::path::Path;

use stretto::{col, lit, Session, Targets, ValueType};

/// The pipeline over the first `rows` reviews of `input`, written to `output`.
pub fn pipeline(session: &Session, input: &Path, output: &Path, rows: usize) -> stretto::Result<stretto::QueryResult> {
    let result = session
        .read_csv(input, &Default::default())?
        .limit(rows)?
        .filter(col("reviews.istopcritic").eq(lit(true)))?
        .sem_filter("{reviews.reviewtext} is clearly positive")?
        .sem_map("title", "Extract the movie title mentioned in {reviews.reviewtext}", ValueType::String)?
        .collect(Targets::new(0.8, 0.8, 0.95)?)?;
    result.write_parquet(output)?;
    Ok(result)
}

#[allow(dead_code)] // a test includes this file for `pipeline` alone
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, output) = match (args.first(), args.get(1)) {
        (Some(i), Some(o)) => (Path::new(i), Path::new(o)),
        _ => return Err("usage: pipeline INPUT.csv OUTPUT.parquet [ROWS]".into()),
    };
    let rows = args.get(2).map(|r| r.parse()).transpose()?.unwrap_or(300);
    let session = Session::builder(stretto::core::context::default_home()).progress(true).build()?;
    let result = pipeline(&session, input, output, rows)?;
    let (p, r) = result.bounds();
    println!(
        "{} rows written to {}; certified precision ≥ {p:.3}, recall ≥ {r:.3}{}",
        result.batch().num_rows(),
        output.display(),
        if result.fell_back_to_gold() { " (the gold plan: no cheaper plan could be certified)" } else { "" }
    );
    for w in &result.plan().warnings {
        println!("warning: {w}");
    }
    Ok(())
}
