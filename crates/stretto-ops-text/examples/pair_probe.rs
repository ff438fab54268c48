//! How the pair operators of a semantic join judge SemBench's sentiment pairs: every ordered pair of the first `N`
//! distinct reviews of one movie, each operator's scores against the truth the critics' labels give (two reviews
//! "express the same sentiment" when their `scoresentiment` agree, "opposite sentiments" when not): AUC, the share
//! accepted and the balanced accuracy at the operator's rule (score > 0), and seconds per pair.
//!
//! `cargo run --release -p stretto-ops-text --example pair_probe -- [N] [same|opposite] [OPERATOR ...]`
//! (defaults 16, opposite, and every pair operator of the ladder smollm2-135m, qwen2.5-coder-0.5b with MiniLM;
//! an operator is a registry name, or `FACTORY:{json config}` to build one, e.g.
//! `llm-pair-filter:{"model":"qwen2.5-coder-0.5b","protocol":"yes-no"}`). Answers are memoised in
//! `$TMPDIR/stretto-pair-probe`.

use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use stretto_core::datasets::Dataset;
use stretto_core::op::{OpOutput, Registry, SemanticTask};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    stretto_ops_text::link();
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(16);
    let relation = args.next().unwrap_or_else(|| "opposite".into());
    let wanted: Vec<String> = args.collect();
    let ds = Dataset::load("movie")?;
    let reviews = ds.table("reviews")?;
    let col = |c: &str| -> Result<StringArray, Box<dyn std::error::Error>> {
        let a = reviews.column_by_name(c).ok_or(format!("no {c}"))?;
        Ok(arrow::compute::cast(a, &DataType::Utf8)?.as_string::<i32>().clone())
    };
    let (id, rid, text, sentiment) = (col("id")?, col("reviewid")?, col("reviewtext")?, col("scoresentiment")?);
    let mut seen = std::collections::HashSet::new();
    let picked: Vec<usize> = (0..reviews.num_rows())
        .filter(|&i| id.value(i) == "ant_man_and_the_wasp_quantumania" && seen.insert(rid.value(i).to_string()))
        .take(n)
        .collect();
    let pairs: Vec<(usize, usize)> =
        picked.iter().flat_map(|&i| picked.iter().filter(move |&&j| j != i).map(move |&j| (i, j))).collect();
    let truth: Vec<bool> =
        pairs.iter().map(|&(i, j)| (sentiment.value(i) == sentiment.value(j)) == (relation == "same")).collect();
    let side = |f: fn(&(usize, usize)) -> usize| {
        Arc::new(StringArray::from(pairs.iter().map(|p| text.value(f(p))).collect::<Vec<_>>()))
            as arrow::array::ArrayRef
    };
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("a.text", DataType::Utf8, true),
            Field::new("b.text", DataType::Utf8, true),
        ])),
        vec![side(|p| p.0), side(|p| p.1)],
    )?;
    let predicate = if relation == "same" {
        "{a.text} and {b.text} express the same sentiment"
    } else {
        "{a.text} and {b.text} express opposite sentiments"
    };
    let task = SemanticTask::filter("pair", predicate);
    let memo = std::env::temp_dir().join("stretto-pair-probe");
    let ctx = stretto_core::OpContext::from_env()?
        .with_memo(stretto_core::MemoPolicy::Dir(memo))
        .with_ladder(["smollm2-135m", "qwen2.5-coder-0.5b"]);
    let registry = Registry::discover(&ctx)?;
    let ops: Vec<Arc<stretto_core::op::RegisteredOp>> = if wanted.is_empty() {
        registry.operators().map(|(op, _)| op.clone()).filter(|op| op.reads_pairs()).collect()
    } else {
        wanted
            .iter()
            .map(|w| -> Result<_, Box<dyn std::error::Error>> {
                Ok(match w.split_once(":{") {
                    Some((factory, config)) => {
                        registry.build(factory, &serde_json::from_str(&format!("{{{config}"))?)?
                    }
                    None => registry.get(w)?,
                })
            })
            .collect::<Result<_, Box<dyn std::error::Error>>>()?
    };
    if let Some(c) = stretto_ops_text::join::comparison(predicate) {
        for m in &ctx.ladder {
            let dec = stretto_ops_text::decoder(&ctx, m, stretto_kv::convert::Weights::F32)?;
            match stretto_kv::contrast::property_question(&dec, "the text above", &c.property)? {
                Some(q) => {
                    println!(
                        "{m} projects each side by: {} Answer: {} [{} | {}]",
                        q.question,
                        q.lead,
                        dec.decode(&[q.yes])?,
                        dec.decode(&[q.no])?
                    );
                    // Each side's projection against its own label.
                    let profile = stretto_kv::store::Profile {
                        model: m.clone(),
                        press: stretto_kv::press::Press::ExpectedAttention,
                        ratio: 0.0,
                        positions: stretto_kv::press::Positions::Keep,
                    };
                    let source = stretto_kv::cache::PastSource::new(profile, ctx.kv_dir.clone());
                    let texts: Vec<String> = picked.iter().map(|&i| text.value(i).to_string()).collect();
                    let (sc, _) =
                        stretto_kv::tasks::filter_scores_after(&dec, &source, &texts, &q.tokens, (q.yes, q.no), 8)?;
                    let lab: Vec<bool> = picked.iter().map(|&i| sentiment.value(i) == "POSITIVE").collect();
                    println!(
                        "  side AUC against POSITIVE: {:.3} over {} reviews ({} positive)",
                        stretto_core::metrics::auc(&sc, &lab),
                        lab.len(),
                        lab.iter().filter(|&&l| l).count()
                    );
                }
                None => println!("{m} names no two values of {}", c.property),
            }
        }
    }
    let positives = truth.iter().filter(|&&t| t).count();
    println!("{} pairs of {n} reviews, \"{predicate}\": {positives} true by the labels", pairs.len());
    println!("| operator | AUC | accepted | balanced accuracy at 0 | s per pair |\n|---|---|---|---|---|");
    for op in ops {
        op.observe_input(&task, &batch)?;
        let (out, secs) = match op.evaluate_timed(&task, &batch) {
            Ok(r) => r,
            Err(e) => {
                println!("| {} | declined: {e} | | | |", op.name());
                continue;
            }
        };
        let OpOutput::Scores(s) = out else { continue };
        let auc = stretto_core::metrics::auc(&s, &truth);
        let acc = s.iter().filter(|&&v| v > 0.0).count() as f64 / s.len() as f64;
        let rate = |want: bool| {
            let k: Vec<_> = s.iter().zip(&truth).filter(|(_, t)| **t == want).collect();
            k.iter().filter(|(v, _)| (**v > 0.0) == want).count() as f64 / k.len().max(1) as f64
        };
        let per = secs.iter().sum::<f64>() / secs.len() as f64;
        println!("| {} | {auc:.3} | {acc:.2} | {:.3} | {per:.4} |", op.name(), (rate(true) + rate(false)) / 2.0);
    }
    Ok(())
}
