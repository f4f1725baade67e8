//! SVG charts with plotters: a latency CDF with several series on a log axis, and throughput
//! against payload size.

use std::path::Path;

use plotters::prelude::*;

/// One named series of `(x, y)` points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Latency CDF: x = latency in µs (log scale), y = fraction of operations at or below it.
pub fn latency_cdf(path: &Path, title: &str, series: &[Series]) -> anyhow::Result<()> {
    let (lo, hi) = bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    draw(
        path,
        title,
        lo.max(0.1)..hi * 1.2,
        0.0..1.0,
        ("latency (µs, log scale)", "fraction of operations ≤ x"),
        series,
        false,
        SeriesLabelPosition::LowerRight,
    )
}

/// Throughput (MiB/s) against payload size (bytes, log scale).
pub fn throughput_vs_size(path: &Path, title: &str, series: &[Series]) -> anyhow::Result<()> {
    let (lo, hi) = bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let (_, ymax) = bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    draw(
        path,
        title,
        lo.max(1.0)..hi * 1.5,
        0.0..ymax * 1.15,
        ("payload (bytes, log scale)", "MiB/s"),
        series,
        true,
        SeriesLabelPosition::UpperLeft,
    )
}

/// One chart: a log-scale x axis, a linear y axis, a line per series (with point markers when
/// `markers`), and a legend at `legend`.
#[allow(clippy::too_many_arguments)] // reason: a private drawing helper; a struct would only rename these
fn draw(
    path: &Path,
    title: &str,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    (x_desc, y_desc): (&str, &str),
    series: &[Series],
    markers: bool,
    legend: SeriesLabelPosition,
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x.log_scale(), y)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()?;
    for (k, s) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(&s.label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        if markers {
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values
        .filter(|v| v.is_finite())
        .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_written_as_svg_with_every_series() {
        let dir = std::env::temp_dir().join(format!("rdmalog-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let series = vec![
            Series {
                label: "rdmalog commit".into(),
                points: vec![(100.0, 0.0), (200.0, 0.5), (900.0, 0.99), (1500.0, 1.0)],
            },
            Series {
                label: "ib_write_lat".into(),
                points: vec![(50.0, 0.0), (80.0, 0.5), (300.0, 0.99), (400.0, 1.0)],
            },
        ];
        let cdf = dir.join("cdf.svg");
        latency_cdf(&cdf, "latency", &series).unwrap();
        let text = std::fs::read_to_string(&cdf).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..60.min(text.len())]);
        assert!(text.contains("rdmalog commit") && text.contains("ib_write_lat"));
        let tp = dir.join("tp.svg");
        throughput_vs_size(&tp, "throughput", &series).unwrap();
        assert!(std::fs::read_to_string(&tp).unwrap().contains("MiB/s"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
