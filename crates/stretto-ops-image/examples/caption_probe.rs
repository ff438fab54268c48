//! Caption-bridge prompt formats on bundled photos (AUC of "shows a t-shirt" against `is_tshirt_or_top`):
//! `cargo run --release -p stretto-ops-image --example caption_probe -- [MODEL]`.
use arrow::array::{Array, AsArray};
use arrow::datatypes::Int64Type;
use stretto_core::datasets::Dataset;
use stretto_kv::decoder::{Step, Want};

fn auc(scores: &[f32], labels: &[bool]) -> f64 {
    stretto_core::metrics::auc(&scores.iter().map(|&s| s as f64).collect::<Vec<_>>(), labels)
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let ds = Dataset::load("ecommerce")?;
    let products = ds.table("products")?;
    let photo = products.column_by_name("photo").ok_or("no photo")?.as_string::<i32>();
    let rows: Vec<usize> = (0..products.num_rows()).filter(|&i| photo.is_valid(i)).take(96).collect();
    let t =
        ds.table("labels")?.column_by_name("is_tshirt_or_top").ok_or("no label")?.as_primitive::<Int64Type>().clone();
    let labels: Vec<bool> = rows.iter().map(|&i| t.value(i) == 1).collect();
    let paths: Vec<String> = rows.iter().map(|&i| photo.value(i).to_string()).collect();
    let ctx = stretto_core::OpContext::from_env()?;
    let (classes, _) = stretto_ops_image::bridge::image_classes(&ctx, None, &paths, 5)?;
    let caps: Vec<String> = classes.iter().map(stretto_ops_image::caption::caption).collect();
    let dec = stretto_kv::pool::decoder(
        &ctx.model_home,
        ctx.threads,
        &std::env::args().nth(1).unwrap_or_else(|| "smollm2-135m".into()),
    )?;
    let (yes, no) = (dec.token_id(" Yes")?, dec.token_id(" No")?);
    let shots = "Photo: A photo. An image classifier recognises in it: golden retriever (91%), Labrador retriever (5%).\nQuestion: Does the photo show a dog?\nAnswer: Yes\n\nPhoto: A photo. An image classifier recognises in it: sports car (80%), convertible (12%).\nQuestion: Does the photo show a dog?\nAnswer: No\n\n";
    for (name, fmt) in [("plain few-shot", 0), ("plain zero-shot", 1)] {
        let mut s = vec![];
        for c in &caps {
            let text = if fmt == 0 {
                format!("{shots}Photo: {c}\nQuestion: Does the photo show a t-shirt?\nAnswer:")
            } else {
                format!("Photo: {c}\nQuestion: Does the photo show a t-shirt?\nAnswer:")
            };
            let ids = dec.encode(&text)?;
            let o = dec.run(&[Step { past: None, tokens: &ids }], Want::default())?;
            s.push(o[0].logits[yes as usize] - o[0].logits[no as usize]);
        }
        println!("{name}: AUC {:.3}", auc(&s, &labels));
    }
    Ok(())
}
