//! SVG figures of the experiments, drawn with `plotters`' SVG backend (no font files or system libraries needed:
//! text is written as SVG `<text>` and laid out by the viewer).
//!
//! Three shapes cover the paper's figures: grouped boxplots with 5–95% whiskers (Target Met), grouped bars
//! (runtimes, speedups) and a scatter (the runtime–quality points of the KV profiles).

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// Errors of drawing: the backend's, flattened to text with the file named.
pub type PlotError = Box<dyn std::error::Error + Send + Sync>;

/// The five numbers a box shows: 5th percentile, quartiles, median and 95th percentile (linear interpolation
/// between order statistics, as numpy's default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoxStats {
    /// 5th percentile (lower whisker).
    pub p5: f64,
    /// First quartile.
    pub q1: f64,
    /// Median.
    pub median: f64,
    /// Third quartile.
    pub q3: f64,
    /// 95th percentile (upper whisker).
    pub p95: f64,
}

/// The `q`-quantile of `sorted` (ascending, non-empty) with linear interpolation.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

impl BoxStats {
    /// The box of `values`, ignoring non-finite ones; `None` when nothing is left.
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Self {
            p5: quantile(&v, 0.05),
            q1: quantile(&v, 0.25),
            median: quantile(&v, 0.5),
            q3: quantile(&v, 0.75),
            p95: quantile(&v, 0.95),
        })
    }
}

/// One panel of grouped boxes: `values[category][series]` are the observations of one box.
pub struct BoxPanel {
    /// The y axis' description.
    pub y_desc: String,
    /// Observations per category and series.
    pub values: Vec<Vec<Vec<f64>>>,
    /// A horizontal reference line (e.g. 1.0 = target met exactly).
    pub reference: Option<f64>,
}

/// The `i`-th series colour: the ten of matplotlib's `tab10`, so that exp2's profile scatter (one series per KV
/// profile, seven or more with two LLMs at three ratios) gives every series its own colour.
fn color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    PALETTE[i % PALETTE.len()]
}

fn err(path: &Path, e: impl std::fmt::Display) -> PlotError {
    format!("cannot draw {}: {e}", path.display()).into()
}

/// Y range covering `values` with a margin, always including `extra`.
fn y_range(values: impl Iterator<Item = f64>, extra: &[f64]) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.chain(extra.iter().copied()).filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let pad = ((hi - lo) * 0.08).max(0.05);
    // Extra headroom on top keeps the legend (upper right) off the data.
    lo - pad..hi + 3.0 * pad
}

/// Grouped boxplots, one panel per entry of `panels` side by side: categories along x, one coloured box per
/// series within a category, whiskers at the 5th and 95th percentiles.
pub fn grouped_boxes(
    path: &Path,
    title: &str,
    categories: &[String],
    series: &[String],
    panels: &[BoxPanel],
) -> Result<(), PlotError> {
    let width = 420 * panels.len().max(1) as u32;
    let root = SVGBackend::new(path, (width, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(|e| err(path, e))?;
    let areas = root.split_evenly((1, panels.len().max(1)));
    let n_series = series.len().max(1) as f64;
    let slot = 0.8 / n_series;
    for (panel, area) in panels.iter().zip(&areas) {
        let all = panel.values.iter().flatten().flatten().copied();
        let extra: Vec<f64> = panel.reference.into_iter().collect();
        let mut chart = ChartBuilder::on(area)
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..categories.len() as f64, y_range(all, &extra))
            .map_err(|e| err(path, e))?;
        category_mesh(&mut chart, categories, &panel.y_desc, path)?;
        if let Some(r) = panel.reference {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(0.0, r), (categories.len() as f64, r)],
                    BLACK.mix(0.5).stroke_width(1),
                )))
                .map_err(|e| err(path, e))?;
        }
        for (c, per_series) in panel.values.iter().enumerate() {
            for (s, values) in per_series.iter().enumerate() {
                let Some(b) = BoxStats::of(values) else { continue };
                let x0 = c as f64 + 0.1 + slot * s as f64 + slot * 0.1;
                let x1 = x0 + slot * 0.8;
                let mid = (x0 + x1) / 2.0;
                let col = color(s);
                let mut shapes: Vec<DynElement<SVGBackend, (f64, f64)>> = vec![
                    Rectangle::new([(x0, b.q1), (x1, b.q3)], col.mix(0.35).filled()).into_dyn(),
                    Rectangle::new([(x0, b.q1), (x1, b.q3)], col.stroke_width(1)).into_dyn(),
                    PathElement::new(vec![(x0, b.median), (x1, b.median)], col.stroke_width(2)).into_dyn(),
                    PathElement::new(vec![(mid, b.q3), (mid, b.p95)], col.stroke_width(1)).into_dyn(),
                    PathElement::new(vec![(mid, b.q1), (mid, b.p5)], col.stroke_width(1)).into_dyn(),
                ];
                for w in [b.p5, b.p95] {
                    let q = slot * 0.2;
                    shapes.push(PathElement::new(vec![(mid - q, w), (mid + q, w)], col.stroke_width(1)).into_dyn());
                }
                chart.draw_series(shapes).map_err(|e| err(path, e))?;
            }
        }
        legend(&mut chart, series, path, SeriesLabelPosition::UpperRight)?;
    }
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The mesh of a categorical x axis: category `i` spans `[i, i + 1)` and is labelled at its middle.
fn category_mesh<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    categories: &[String],
    y_desc: &str,
    path: &Path,
) -> Result<(), PlotError> {
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(categories.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 1e-6 {
                categories.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .draw()
        .map_err(|e| err(path, e))?;
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    series: &[String],
    path: &Path,
    position: SeriesLabelPosition,
) -> Result<(), PlotError> {
    // Empty series carry only the legend entries (the drawn elements are not series plotters knows of).
    for (s, name) in series.iter().enumerate() {
        let col = color(s);
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
            .map_err(|e| err(path, e))?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], col.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .position(position)
        .draw()
        .map_err(|e| err(path, e))?;
    Ok(())
}

/// Grouped bars: `values[category][series]`, categories along x, one coloured bar per series.
pub fn grouped_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    categories: &[String],
    series: &[String],
    values: &[Vec<f64>],
    reference: Option<f64>,
) -> Result<(), PlotError> {
    let root = SVGBackend::new(path, (640, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let hi = values.iter().flatten().copied().filter(|v| v.is_finite()).fold(reference.unwrap_or(0.0), f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..categories.len() as f64, 0f64..(hi * 1.3).max(1e-6))
        .map_err(|e| err(path, e))?;
    category_mesh(&mut chart, categories, y_desc, path)?;
    if let Some(r) = reference {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, r), (categories.len() as f64, r)],
                BLACK.mix(0.5).stroke_width(1),
            )))
            .map_err(|e| err(path, e))?;
    }
    let slot = 0.8 / series.len().max(1) as f64;
    for (c, per_series) in values.iter().enumerate() {
        for (s, v) in per_series.iter().enumerate() {
            if !v.is_finite() {
                continue;
            }
            let x0 = c as f64 + 0.1 + slot * s as f64 + slot * 0.1;
            chart
                .draw_series(std::iter::once(Rectangle::new([(x0, 0.0), (x0 + slot * 0.8, *v)], color(s).filled())))
                .map_err(|e| err(path, e))?;
        }
    }
    legend(&mut chart, series, path, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

/// A scatter of `(series index, x, y)` points, x on a log scale when `log_x` (costs span decades).
pub fn scatter(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[String],
    points: &[(usize, f64, f64)],
    log_x: bool,
) -> Result<(), PlotError> {
    let root = SVGBackend::new(path, (640, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let fx = |x: f64| if log_x { x.max(1e-9).log10() } else { x };
    let xs = y_range(points.iter().map(|p| fx(p.1)), &[]);
    let ys = y_range(points.iter().map(|p| p.2), &[0.5, 1.0]);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(xs, ys)
        .map_err(|e| err(path, e))?;
    let x_desc = if log_x { format!("{x_desc} (log10)") } else { x_desc.to_string() };
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(|e| err(path, e))?;
    chart
        .draw_series(points.iter().map(|&(s, x, y)| Circle::new((fx(x), y), 4, color(s).filled())))
        .map_err(|e| err(path, e))?;
    // Cheap and as good as gold is the corner profiles rarely reach.
    legend(&mut chart, series, path, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn box_stats_interpolate_like_numpy() {
        let b = BoxStats::of(&[1.0, 2.0, 3.0, 4.0, 5.0, f64::NAN]).unwrap();
        // numpy.percentile([1,2,3,4,5], [5,25,50,75,95]) = 1.2, 2, 3, 4, 4.8
        assert!((b.p5 - 1.2).abs() < 1e-12 && (b.p95 - 4.8).abs() < 1e-12);
        assert_eq!((b.q1, b.median, b.q3), (2.0, 3.0, 4.0));
        assert!(BoxStats::of(&[f64::NAN]).is_none());
    }

    #[test]
    fn figures_are_written_as_svg() {
        let dir = tempfile::tempdir().unwrap();
        let cats = vec!["0.5".to_string(), "0.9".into()];
        let series = vec!["global".to_string(), "lotus".into()];
        let p = dir.path().join("box.svg");
        let panel = BoxPanel {
            y_desc: "precision / target".into(),
            values: vec![vec![vec![1.0, 1.2, 1.9], vec![0.9]], vec![vec![], vec![1.1, 1.0]]],
            reference: Some(1.0),
        };
        grouped_boxes(&p, "Target met", &cats, &series, &[panel]).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("Target met") && svg.contains("lotus"));
        // Three non-empty boxes, each a filled and an outlined rectangle.
        assert!(svg.matches("<rect").count() >= 6, "{svg}");

        let p = dir.path().join("bars.svg");
        grouped_bars(&p, "Cost", "seconds", &cats, &series, &[vec![1.0, 2.0], vec![0.5, f64::NAN]], None).unwrap();
        assert!(std::fs::read_to_string(&p).unwrap().contains("seconds"));

        let p = dir.path().join("scatter.svg");
        scatter(&p, "Profiles", ("cost", "AUC"), &series, &[(0, 0.01, 0.8), (1, 0.1, 0.9)], true).unwrap();
        assert!(std::fs::read_to_string(&p).unwrap().contains("<circle"));
    }

    #[test]
    fn ten_series_get_ten_colours() {
        let colours: std::collections::HashSet<(u8, u8, u8)> = (0..10).map(color).map(|c| (c.0, c.1, c.2)).collect();
        assert_eq!(colours.len(), 10);
    }
}
