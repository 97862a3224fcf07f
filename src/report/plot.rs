//! SVG charts for reports, independent of what is plotted: a line chart of named series and a
//! bar chart of labelled values. SVG only (plotters' SVG backend, no font or bitmap stack), so
//! the files are small, diffable and open in any browser.
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::path::Path;

/// One line of a line chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const SIZE: (u32, u32) = (960, 540);
/// Beyond this many series the legend would cover the plot; the lines are still drawn.
const MAX_LEGEND: usize = 16;

fn failed(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

/// Span of `values` with a margin, never empty (a flat line still gets a visible axis).
fn span(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi <= lo {
        hi = lo + 1.0;
    }
    (lo, hi + (hi - lo) * 0.05)
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A chart on `area` over `xs` × `ys` with its mesh and axis labels drawn.
fn axes<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    caption: Option<&str>,
    (xs, ys): ((f64, f64), (f64, f64)),
    (x_label, y_label): (&str, &str),
    path: &Path,
) -> Result<Chart<'a, 'b>, String> {
    let mut builder = ChartBuilder::on(area);
    if let Some(c) = caption {
        builder.caption(c, ("sans-serif", 22));
    }
    let mut chart = builder
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(xs.0..xs.1, ys.0..ys.1)
        .map_err(|e| failed(path, e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| failed(path, e))?;
    Ok(chart)
}

/// The x-axis label at `x` of a chart with a category at each whole number: its name there,
/// nothing between.
fn category_at(names: &[&str], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() < 1e-6 && i >= 0.0 {
        names
            .get(i as usize)
            .map(|n| n.to_string())
            .unwrap_or_default()
    } else {
        String::new()
    }
}

/// The legend of what was drawn with labels, in the upper right corner.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>, path: &Path) -> Result<(), String> {
    legend_at(chart, SeriesLabelPosition::UpperRight, path)
}

fn legend_at<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    at: SeriesLabelPosition,
    path: &Path,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(at)
        .draw()
        .map_err(|e| failed(path, e))
}

/// Draws `series` as lines against a shared x axis and writes the SVG to `path`.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), String> {
    let xs = span(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.0)),
        false,
    );
    let ys = span(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        true,
    );
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(path, e))?;
    let mut chart = axes(&root, Some(title), (xs, ys), (x_label, y_label), path)?;
    for (k, s) in series.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let drawn = chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| failed(path, e))?;
        if k < MAX_LEGEND {
            drawn.label(s.name.clone()).legend(move |(x, y)| {
                PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
            });
        }
    }
    if !series.is_empty() {
        legend(&mut chart, path)?;
    }
    root.present().map_err(|e| failed(path, e))
}

/// Two panels over one time axis, written as an SVG to `path`: above, `lines` (the first
/// drawn black and thick: the total); below, with a y axis of its own (a flow's rate is a
/// small fraction of a total's), the spread of many series as bands (min–max light, p10–p90
/// darker, the median as a line). `spread` holds (x, [min, p10, median, p90, max]) per point;
/// `what` names what it spreads ("per flow").
pub fn band_chart(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    lines: &[Series],
    spread: &[(f64, [f64; 5])],
    what: &str,
) -> Result<(), String> {
    let xs = span(
        lines
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .chain(spread.iter().map(|p| p.0)),
        false,
    );
    let root = SVGBackend::new(path, (SIZE.0, SIZE.1 * 3 / 2)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(path, e))?;
    let root = root
        .titled(title, ("sans-serif", 22))
        .map_err(|e| failed(path, e))?;
    let (upper, lower) = root.split_vertically(SIZE.1 * 3 / 4);

    let ys = span(
        lines.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        true,
    );
    let mut chart = axes(&upper, None, (xs, ys), (x_label, y_label), path)?;
    for (k, s) in lines.iter().enumerate() {
        let style = if k == 0 {
            BLACK.stroke_width(3)
        } else {
            Palette99::pick(k + 1).to_rgba().stroke_width(2)
        };
        let drawn = chart
            .draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(|e| failed(path, e))?;
        if k < MAX_LEGEND {
            drawn
                .label(s.name.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
        }
    }
    if !lines.is_empty() {
        legend(&mut chart, path)?;
    }

    let ys = span(spread.iter().map(|p| p.1[4]), true);
    let lower_label = format!("{y_label}, {what}");
    let mut chart = axes(&lower, None, (xs, ys), (x_label, &lower_label), path)?;
    let band = |lo: usize, hi: usize| -> Vec<(f64, f64)> {
        let upper = spread.iter().map(|(x, q)| (*x, q[hi]));
        let lower = spread.iter().rev().map(|(x, q)| (*x, q[lo]));
        upper.chain(lower).collect()
    };
    if !spread.is_empty() {
        for ((lo, hi), alpha, name) in [
            ((0, 4), 0.15, format!("{what}: min-max")),
            ((1, 3), 0.35, format!("{what}: p10-p90")),
        ] {
            let style = BLUE.mix(alpha).filled();
            chart
                .draw_series(std::iter::once(Polygon::new(band(lo, hi), style)))
                .map_err(|e| failed(path, e))?
                .label(name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], style));
        }
        let median = BLUE.stroke_width(2);
        chart
            .draw_series(LineSeries::new(
                spread.iter().map(|(x, q)| (*x, q[2])),
                median,
            ))
            .map_err(|e| failed(path, e))?
            .label(format!("{what}: median"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], median));
        legend(&mut chart, path)?;
    }
    root.present().map_err(|e| failed(path, e))
}

/// Lines through some points and loose points around them, written as an SVG to `path`:
/// each of `lines` is drawn as a line with a dot at every point (e.g. a configuration's mean),
/// each of `dots` as small hollow circles in the colour of the line of the same index (e.g.
/// the runs behind that mean). A line or dot series may be empty.
pub fn scatter_chart(
    path: &Path,
    title: &str,
    labels: (&str, &str),
    lines: &[Series],
    dots: &[Series],
) -> Result<(), String> {
    let extras = Extras {
        y_from_zero: true,
        ..Extras::default()
    };
    scatter_chart_with(path, title, labels, (lines, dots), &extras)
}

/// What a [`scatter_chart_with`] draws besides its lines and dots, and its y axis.
#[derive(Debug, Default)]
pub struct Extras<'a> {
    /// Lines drawn black, without dots (a fitted line), labelled when named.
    pub fits: &'a [Series],
    /// Thin grey lines without dots (thresholds, where a fit crosses them), labelled when
    /// named.
    pub guides: &'a [Series],
    /// Whether the y axis starts at 0; else it spans the data (slowdowns near 1).
    pub y_from_zero: bool,
    /// The legend in the upper left corner (where data rising to the right leaves room).
    pub legend_left: bool,
}

/// [`scatter_chart`] with fitted lines, guides and the y axis as `extras` say.
pub fn scatter_chart_with(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    (lines, dots): (&[Series], &[Series]),
    extras: &Extras,
) -> Result<(), String> {
    let all = || {
        lines
            .iter()
            .chain(dots)
            .chain(extras.fits)
            .chain(extras.guides)
            .flat_map(|s| s.points.iter())
    };
    let xs = span(all().map(|p| p.0), true);
    let ys = span(all().map(|p| p.1), extras.y_from_zero);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(path, e))?;
    let mut chart = axes(&root, Some(title), (xs, ys), (x_label, y_label), path)?;
    let mut labelled = false;
    let plain = [
        (extras.guides, BLACK.mix(0.45).stroke_width(1)),
        (extras.fits, BLACK.stroke_width(2)),
    ];
    for (series, style) in plain {
        for s in series {
            let drawn = chart
                .draw_series(LineSeries::new(s.points.iter().copied(), style))
                .map_err(|e| failed(path, e))?;
            if !s.name.is_empty() {
                labelled = true;
                drawn
                    .label(s.name.clone())
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
            }
        }
    }
    for (k, s) in lines.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let drawn = chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| failed(path, e))?;
        if k < MAX_LEGEND && !s.name.is_empty() {
            labelled = true;
            drawn.label(s.name.clone()).legend(move |(x, y)| {
                PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
            });
        }
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| failed(path, e))?;
    }
    for (k, s) in dots.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(
                s.points
                    .iter()
                    .map(|&p| Circle::new(p, 3, color.stroke_width(1))),
            )
            .map_err(|e| failed(path, e))?;
    }
    if labelled {
        let at = if extras.legend_left {
            SeriesLabelPosition::UpperLeft
        } else {
            SeriesLabelPosition::UpperRight
        };
        legend_at(&mut chart, at, path)?;
    }
    root.present().map_err(|e| failed(path, e))
}

/// One column per category, written as an SVG to `path`: every value as a dot (spread a little
/// sideways so equal values stay visible), the mean as a bar across the column and its
/// interval `(low, high)` as a vertical whisker. Categories are `(label, values, (low, high))`.
pub fn strip_chart(
    path: &Path,
    title: &str,
    y_label: &str,
    categories: &[(String, Vec<f64>, (f64, f64))],
) -> Result<(), String> {
    let ys = span(
        categories.iter().flat_map(|c| {
            c.1.iter()
                .copied()
                .chain([c.2 .0, c.2 .1].into_iter().filter(|v| v.is_finite()))
        }),
        true,
    );
    let n = categories.len().max(1);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(64)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), ys.0..ys.1)
        .map_err(|e| failed(path, e))?;
    let names: Vec<&str> = categories.iter().map(|c| c.0.as_str()).collect();
    let label = |x: &f64| category_at(&names, *x);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_label)
        .x_labels(n * 2 + 1)
        .x_label_formatter(&label)
        .x_label_style(if n <= 8 {
            ("sans-serif", 13).into_font()
        } else {
            // Many columns: names stand upright so they do not run into each other.
            ("sans-serif", 12)
                .into_font()
                .transform(FontTransform::Rotate90)
        })
        .draw()
        .map_err(|e| failed(path, e))?;
    for (i, (_, values, (lo, hi))) in categories.iter().enumerate() {
        let x = i as f64;
        let color = Palette99::pick(i).to_rgba();
        let k = values.len().max(1) as f64;
        chart
            .draw_series(values.iter().enumerate().map(|(j, &v)| {
                let dx = 0.25 * ((j as f64 + 0.5) / k - 0.5);
                Circle::new((x + dx, v), 3, color.stroke_width(1))
            }))
            .map_err(|e| failed(path, e))?;
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        if !finite.is_empty() {
            let m = finite.iter().sum::<f64>() / finite.len() as f64;
            chart
                .draw_series(std::iter::once(PathElement::new(
                    [(x - 0.3, m), (x + 0.3, m)],
                    BLACK.stroke_width(2),
                )))
                .map_err(|e| failed(path, e))?;
        }
        if lo.is_finite() && hi.is_finite() {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    [(x, *lo), (x, *hi)],
                    BLACK.stroke_width(2),
                )))
                .map_err(|e| failed(path, e))?;
        }
    }
    root.present().map_err(|e| failed(path, e))
}

/// Draws one bar per `(label, value)`, in order, and writes the SVG to `path`.
pub fn bar_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    bars: &[(String, f64)],
) -> Result<(), String> {
    let ys = span(bars.iter().map(|b| b.1), true);
    let n = bars.len().max(1);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((0..n).into_segmented(), ys.0..ys.1)
        .map_err(|e| failed(path, e))?;
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
            bars.get(*i).map(|b| b.0.clone()).unwrap_or_default()
        }
        SegmentValue::Last => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_labels(n.min(25))
        .x_label_formatter(&label)
        .draw()
        .map_err(|e| failed(path, e))?;
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .style(BLUE.mix(0.6).filled())
                .margin(2)
                .data(bars.iter().enumerate().map(|(i, b)| (i, b.1))),
        )
        .map_err(|e| failed(path, e))?;
    root.present().map_err(|e| failed(path, e))
}

/// Lines over categories on a logarithmic y axis (values spanning orders of magnitude, such
/// as slowdowns), written as an SVG to `path`: each series has one value per category
/// (`points` as (category index, value); values at or below 0 are left out), with a dot at
/// each.
pub fn category_log_chart(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    categories: &[String],
    series: &[Series],
) -> Result<(), String> {
    let values = || {
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .filter(|v| *v > 0.0)
    };
    let lo = values().fold(f64::INFINITY, f64::min);
    let hi = values().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if lo.is_finite() {
        (lo / 2.0, hi * 2.0)
    } else {
        (0.1, 10.0)
    };
    let n = categories.len().max(1);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, (lo..hi).log_scale())
        .map_err(|e| failed(path, e))?;
    let names: Vec<&str> = categories.iter().map(String::as_str).collect();
    let label = |x: &f64| category_at(&names, *x);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_labels(n * 2 + 1)
        .x_label_formatter(&label)
        .draw()
        .map_err(|e| failed(path, e))?;
    for (k, s) in series.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let pts: Vec<(f64, f64)> = s.points.iter().copied().filter(|p| p.1 > 0.0).collect();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| failed(path, e))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| failed(path, e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| failed(path, e))?;
    root.present().map_err(|e| failed(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_with_their_labels() {
        let dir = std::env::temp_dir().join(format!("ibjitter-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let line = dir.join("line.svg");
        let series = vec![
            Series {
                name: "flow 0".into(),
                points: vec![(0.0, 1.0), (1.0, 2.0)],
            },
            Series {
                name: "flow 1".into(),
                points: vec![(0.0, 0.5)],
            },
        ];
        line_chart(&line, "throughput", "time [s]", "Gb/s", &series).unwrap();
        let text = std::fs::read_to_string(&line).unwrap();
        assert!(text.starts_with("<svg") && text.contains("flow 1") && text.contains("Gb/s"));

        let bars = dir.join("bars.svg");
        let data = vec![("0-1".to_string(), 3.0), ("1-2".to_string(), 7.0)];
        bar_chart(&bars, "IPD", "interval [us]", "occurrences", &data).unwrap();
        let text = std::fs::read_to_string(&bars).unwrap();
        assert!(text.contains("1-2") && text.contains("<rect"));
        // An empty chart still renders (a flow without gaps).
        bar_chart(&bars, "IPD", "x", "y", &[]).unwrap();
        let band = dir.join("band.svg");
        let spread: Vec<(f64, [f64; 5])> = (0..10)
            .map(|k| (k as f64, [0.0, 1.0, 2.0, 3.0, 4.0 + k as f64]))
            .collect();
        band_chart(
            &band,
            "incast",
            ("time [s]", "Mb/s"),
            &series,
            &spread,
            "per flow",
        )
        .unwrap();
        let text = std::fs::read_to_string(&band).unwrap();
        for label in [
            "per flow: min-max",
            "per flow: p10-p90",
            "per flow: median",
            "flow 0",
        ] {
            assert!(text.contains(label), "{label}");
        }
        assert!(text.contains("<polygon"), "bands are drawn");
        let scatter = dir.join("scatter.svg");
        scatter_chart(
            &scatter,
            "runtime vs sd",
            ("sd [us]", "s"),
            &series,
            &series,
        )
        .unwrap();
        let text = std::fs::read_to_string(&scatter).unwrap();
        assert!(text.contains("flow 1") && text.contains("<circle"));
        // A fit and a guide add labelled lines and no dots.
        let extra = |name: &str| Series {
            name: name.into(),
            points: vec![(0.0, 1.05), (1.0, 1.05)],
        };
        let extras = Extras {
            fits: &[extra("fitted line")],
            guides: &[extra("5 % slower")],
            y_from_zero: false,
            legend_left: true,
        };
        scatter_chart_with(
            &scatter,
            "slowdown",
            ("us", "x"),
            (&series, &series),
            &extras,
        )
        .unwrap();
        let guided = std::fs::read_to_string(&scatter).unwrap();
        assert!(guided.contains("5 % slower") && guided.contains("fitted line"));
        assert_eq!(
            guided.matches("<circle").count(),
            text.matches("<circle").count()
        );
        let strip = dir.join("strip.svg");
        let cats = vec![
            ("clean".to_string(), vec![1.0, 1.1, 0.9], (0.8, 1.2)),
            (
                "heavy-scale25".to_string(),
                vec![2.0, 2.5],
                (f64::NAN, f64::NAN),
            ),
        ];
        strip_chart(&strip, "runs", "runtime [s]", &cats).unwrap();
        let text = std::fs::read_to_string(&strip).unwrap();
        assert!(text.contains("heavy-scale25") && text.matches("<circle").count() == 5);
        let err = line_chart(&dir.join("no/such/dir.svg"), "t", "x", "y", &series).unwrap_err();
        assert!(err.contains("no/such/dir.svg"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
