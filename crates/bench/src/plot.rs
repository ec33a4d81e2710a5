//! `--plot FILE.svg`: bandwidth (top) and p50 latency (bottom) against transfer size, one line
//! per case, both axes logarithmic, each case's ceiling as a dashed line in its colour.
//! Drawn with plotters' SVG backend only (no font or bitmap dependencies); PNG is made from
//! the SVG by the CLI with `rsvg-convert` when it is installed.

use plotters::prelude::*;

use crate::error::BenchError;
use crate::report::{Report, Status};

/// SI-style axis labels: `8`, `1k`, `10M`, `1G` (bytes) or plain numbers.
fn si(v: f64) -> String {
    if v < 1.0 {
        return if v >= 0.001 {
            format!("{v:.3}").trim_end_matches('0').to_string()
        } else {
            format!("{v:.0e}")
        };
    }
    let (d, u) = if v >= 1e9 {
        (v / 1e9, "G")
    } else if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    if d >= 10.0 || (d - d.round()).abs() < 1e-9 {
        format!("{d:.0}{u}")
    } else {
        format!("{d:.1}{u}")
    }
}

/// One line: key, points (size, value), ceiling.
struct Series {
    key: String,
    bw: Vec<(f64, f64)>,
    lat: Vec<(f64, f64)>,
    ceiling: Option<f64>,
}

fn err<E: std::fmt::Debug>(e: E) -> BenchError {
    BenchError::Plot(format!("{e:?}"))
}

/// A chart with both axes log-scaled.
type LogLogChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<LogCoord<f64>, LogCoord<f64>>>;

/// A chart on `area` with log-scaled axes over transfer sizes `x` and `y` (named `y_desc`).
fn log_log_chart<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    caption: &str,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    y_desc: &str,
) -> Result<LogLogChart<'a, 'b>, BenchError> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(42)
        .y_label_area_size(70)
        .build_cartesian_2d(x.log_scale(), y.log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("transfer size, bytes")
        .y_desc(y_desc)
        .x_label_formatter(&|v| si(*v))
        .y_label_formatter(&|v| si(*v))
        .draw()
        .map_err(err)?;
    Ok(chart)
}

fn series(report: &Report) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in report.results.iter().filter(|r| r.status == Status::Passed) {
        let i = match out.iter().position(|s| s.key == r.key) {
            Some(i) => i,
            None => {
                out.push(Series {
                    key: r.key.clone(),
                    bw: Vec::new(),
                    lat: Vec::new(),
                    ceiling: r.ceiling_gbps,
                });
                out.len() - 1
            }
        };
        let x = r.size_bytes.max(1) as f64;
        if let Some(b) = r.bw_gbps.filter(|b| *b > 0.0) {
            out[i].bw.push((x, b));
        }
        if let Some(l) = r.lat_p50_us.filter(|l| *l > 0.0) {
            out[i].lat.push((x, l));
        }
    }
    out
}

fn bounds(pts: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    pts.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

/// Render the report as an SVG document.
///
/// # Errors
/// When there is nothing to plot, or plotters fails.
pub fn svg(report: &Report, title: &str) -> Result<String, BenchError> {
    let all = series(report);
    let (xmin, xmax) = bounds(all.iter().flat_map(|s| s.bw.iter().map(|p| p.0)))
        .ok_or_else(|| BenchError::Plot("nothing to plot: no measured rows".into()))?;
    let (bmin, bmax) = bounds(
        all.iter()
            .flat_map(|s| s.bw.iter().map(|p| p.1).chain(s.ceiling)),
    )
    .ok_or_else(|| BenchError::Plot("nothing to plot".into()))?;
    let (lmin, lmax) =
        bounds(all.iter().flat_map(|s| s.lat.iter().map(|p| p.1))).unwrap_or((1.0, 10.0));
    let xr = (xmin / 1.5)..(xmax * 1.5);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1280, 1100)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(err)?;
        let (top, bottom) = root.split_vertically(620);
        let by = (bmin / 2.0).max(1e-6)..bmax * 2.0;
        let bw_caption = "bandwidth, GB/s (1e9 B/s); dashed: ceiling";
        let mut bw = log_log_chart(&top, bw_caption, xr.clone(), by, "GB/s")?;
        for (i, s) in all.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            bw.draw_series(LineSeries::new(s.bw.clone(), color.stroke_width(2)))
                .map_err(err)?
                .label(s.key.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            bw.draw_series(PointSeries::of_element(
                s.bw.clone(),
                3,
                color.filled(),
                &|c, sz, st| Circle::new(c, sz, st),
            ))
            .map_err(err)?;
            if let Some(c) = s.ceiling {
                bw.draw_series(DashedLineSeries::new(
                    vec![(xr.start, c), (xr.end, c)],
                    8,
                    5,
                    color.stroke_width(1),
                ))
                .map_err(err)?;
            }
        }
        bw.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(err)?;

        let ly = (lmin / 2.0).max(1e-3)..lmax * 2.0;
        let lat_caption = "latency p50, µs (one transfer and its completion, host clock)";
        let mut lat = log_log_chart(&bottom, lat_caption, xr, ly, "µs")?;
        for (i, s) in all.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            lat.draw_series(LineSeries::new(s.lat.clone(), color.stroke_width(2)))
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(out)
}

/// A latency distribution as an SVG document: the share of samples slower than x (the
/// complementary CDF), both axes logarithmic, so the tail reads off directly (p99 at 10^-2,
/// p99.9 at 10^-3) and the quantiles are marked. `sorted_s` are latencies in seconds,
/// ascending (`gdx stream --plot`).
///
/// # Errors
/// When there is no sample, or plotters fails.
pub fn latency_svg(sorted_s: &[f64], title: &str) -> Result<String, BenchError> {
    let n = sorted_s.len();
    let us: Vec<f64> = sorted_s.iter().map(|s| (s * 1e6).max(1e-3)).collect();
    let (Some(&lo), Some(&hi)) = (us.first(), us.last()) else {
        return Err(BenchError::Plot(
            "nothing to plot: no latency sample".into(),
        ));
    };
    // At most ~4000 points: every sample at the tail, evenly spaced below it.
    let step = (n / 4000).max(1);
    let pts: Vec<(f64, f64)> = us
        .iter()
        .enumerate()
        .filter(|(i, _)| i % step == 0 || n - i <= 2000)
        .map(|(i, &x)| (x, ((n - i) as f64 / n as f64).max(1.0 / n as f64)))
        .collect();
    let plot_err = |e: String| BenchError::Plot(e);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1100, 640)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(format!("{e:?}")))?;
        let mut ch = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(
                ((lo / 1.5)..(hi * 1.5)).log_scale(),
                ((0.5 / n as f64)..1.5).log_scale(),
            )
            .map_err(|e| plot_err(format!("{e:?}")))?;
        ch.configure_mesh()
            .x_desc("end-to-end latency, µs")
            .y_desc("share of frames slower")
            .x_label_formatter(&|v| si(*v))
            .y_label_formatter(&|v| format!("{v:.0e}"))
            .draw()
            .map_err(|e| plot_err(format!("{e:?}")))?;
        let color = Palette99::pick(0).to_rgba();
        ch.draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|e| plot_err(format!("{e:?}")))?
            .label(format!("{n} frames"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        for (q, name) in [(0.5, "p50"), (0.99, "p99"), (0.999, "p99.9")] {
            let Some(x) = gdx_base::stats::quantile(&us, q) else {
                continue;
            };
            let y = 1.0 - q;
            ch.draw_series(PointSeries::of_element(
                vec![(x, y)],
                4,
                BLACK.filled(),
                &|c, sz, st| {
                    EmptyElement::at(c)
                        + Circle::new((0, 0), sz, st)
                        + Text::new(format!("{name} {}µs", si(x)), (8, -14), ("sans-serif", 14))
                },
            ))
            .map_err(|e| plot_err(format!("{e:?}")))?;
        }
        ch.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| plot_err(format!("{e:?}")))?;
        root.present().map_err(|e| plot_err(format!("{e:?}")))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_short() {
        assert_eq!(si(8.0), "8");
        assert_eq!(si(1000.0), "1k");
        assert_eq!(si(1.5e6), "1.5M");
        assert_eq!(si(1e9), "1G");
        assert_eq!(si(0.01), "0.01");
        assert_eq!(si(0.0001), "1e-4");
    }

    #[test]
    fn latency_plots_mark_the_quantiles_and_refuse_an_empty_sample() {
        let v: Vec<f64> = (1..=10_000).map(|i| f64::from(i) * 1e-7).collect();
        let svg = latency_svg(&v, "t").unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("p99.9") && svg.contains("10000 frames"));
        assert!(latency_svg(&[], "t").is_err());
    }
}
