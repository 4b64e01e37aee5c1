//! PNG plots of a run, drawn from its `metrics.jsonl`: loss, accuracy, throughput and memory
//! by tag, each written next to the metrics as `loss.png`, `accuracy.png` (for a regression,
//! its evaluation errors), `throughput.png` and `memory.png`.
//!
//! Text is rendered by `ab_glyph` from the DejaVu Sans font embedded in the binary, so plotting
//! needs no fontconfig, freetype or any system font: the CI machines have none.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::chart::SeriesAnno;
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::error::{Error, Result};
use crate::metrics::{EvalMetrics, MetricsRecord, StepMetrics, read_metrics};

/// The size of every image, in pixels.
const SIZE: (u32, u32) = (1000, 600);

/// The font family every text style here asks for; the embedded font is registered under it.
const FONT: &str = "sans-serif";

/// The most points drawn per series: a chart 1000 pixels wide cannot show more, and drawing
/// a long run point by point would make plotting slow for nothing.
const MAX_POINTS: usize = 2000;

/// One MiB, the unit of the memory chart.
const MIB: f64 = 1024.0 * 1024.0;

/// Distinct colours for series and memory tags (the usual "tab10" set, minus grey and olive,
/// which read poorly as thin lines).
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// A chart over (step, value) in floating point.
type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// What drawing into a backend can fail with.
type DrawResult<T, DB> =
    std::result::Result<T, DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// A series ready to draw: (step, value) points, thinned to at most [`MAX_POINTS`] by
/// [`thin`].
type Points = Vec<(f64, f64)>;

/// Reads `run_dir/metrics.jsonl` and writes `loss.png`, `accuracy.png`, `throughput.png` and
/// `memory.png` into `run_dir`, returning their paths in that order.
///
/// Each image is rendered to a temporary file beside its final name and renamed into place, so
/// an interrupted plot never leaves a truncated PNG under the real name. A run without eval
/// records plots without eval series. A missing or empty metrics file, or one without training
/// steps, is an error naming the file.
pub fn plot_run(run_dir: &Path) -> Result<Vec<PathBuf>> {
    let metrics_path = run_dir.join("metrics.jsonl");
    let run = Run::read(&metrics_path)?;
    register_font().map_err(|what| Error::run(run_dir, what))?;
    Ok(vec![
        write_png(&run_dir.join("loss.png"), |area| draw_loss(&run, area))?,
        write_png(&run_dir.join("accuracy.png"), |area| draw_accuracy(&run, area))?,
        write_png(&run_dir.join("throughput.png"), |area| draw_throughput(&run, area))?,
        write_png(&run_dir.join("memory.png"), |area| draw_memory(&run, area))?,
    ])
}

/// Registers the embedded DejaVu Sans as [`FONT`], once per process. Plotters keeps its fonts
/// in a global table, and plotting from several threads at once (parallel tests, several runs
/// plotted side by side) must neither race nor parse the font again. A `OnceLock` rather than
/// a bare `Once` keeps the outcome, so a failure is an error on every call instead of a panic
/// that poisons the `Once`.
fn register_font() -> std::result::Result<(), &'static str> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok { Ok(()) } else { Err("the embedded DejaVu Sans font could not be parsed") }
}

/// Renders one image with `draw` in memory and writes it to `path` as a PNG, whole or not at
/// all ([`dp_data::AtomicFile`]): `path` is always either the old image or the complete new
/// one.
fn write_png(
    path: &Path,
    draw: impl for<'b> FnOnce(
        &DrawingArea<BitMapBackend<'b>, Shift>,
    ) -> DrawResult<(), BitMapBackend<'b>>,
) -> Result<PathBuf> {
    use image::ImageEncoder;
    let mut pixels = vec![0u8; SIZE.0 as usize * SIZE.1 as usize * 3];
    {
        let area = BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area();
        area.fill(&WHITE)
            .and_then(|()| draw(&area))
            .and_then(|()| area.present())
            .map_err(|e| Error::run(path, format!("cannot draw: {e}")))?;
    }
    let mut file = dp_data::AtomicFile::create(path)?;
    image::codecs::png::PngEncoder::new(&mut file)
        .write_image(&pixels, SIZE.0, SIZE.1, image::ExtendedColorType::Rgb8)
        .map_err(|e| Error::run(path, format!("cannot encode the plot: {e}")))?;
    file.commit()?;
    Ok(path.to_path_buf())
}

/// The records of a run, in step order.
#[derive(Debug)]
struct Run {
    train: Vec<StepMetrics>,
    eval: Vec<EvalMetrics>,
}

impl Run {
    fn read(path: &Path) -> Result<Self> {
        let mut train = Vec::new();
        let mut eval = Vec::new();
        for record in read_metrics(path)? {
            match record {
                MetricsRecord::Train(m) => train.push(m),
                MetricsRecord::Eval(m) => eval.push(m),
            }
        }
        if train.is_empty() {
            let what = if eval.is_empty() {
                "no records, nothing to plot"
            } else {
                "no training steps to plot"
            };
            return Err(Error::run(path, what));
        }
        // A resumed run appends to the same file and repeats the steps since its checkpoint;
        // the later record of a step is the one the run continued from.
        keep_last_per_step(&mut train, |m| m.step);
        keep_last_per_step(&mut eval, |m| m.step);
        Ok(Self { train, eval })
    }

    /// The steps the charts span, over train and eval records.
    fn steps(&self) -> Range<f64> {
        let steps = self.train.iter().map(|m| m.step).chain(self.eval.iter().map(|m| m.step));
        let (lo, hi) = steps.fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
        if lo >= hi { lo as f64 - 1.0..hi as f64 + 1.0 } else { lo as f64..hi as f64 }
    }

    /// The x axis label, saying when not every step is drawn.
    fn step_label(&self) -> String {
        match stride(self.train.len()) {
            1 => "step".into(),
            k => format!("step (lowest and highest of each {k} drawn)"),
        }
    }

    fn train_series(&self, value: impl Fn(&StepMetrics) -> f64) -> Points {
        thin(finite(self.train.iter().map(|m| (m.step as f64, value(m)))))
    }

    fn eval_series(&self, value: impl Fn(&EvalMetrics) -> f64) -> Points {
        thin(finite(self.eval.iter().map(|m| (m.step as f64, value(m)))))
    }
}

/// Sorts by step (stably) and keeps the last record of each step.
fn keep_last_per_step<T>(records: &mut Vec<T>, step: impl Fn(&T) -> u64) {
    records.reverse();
    records.sort_by_key(&step);
    records.dedup_by_key(|m| step(m));
    // After the reverse and the stable sort, the first of each run of equal steps is the one
    // written last, which is the one `dedup` keeps.
}

/// Drops points that cannot be drawn: a diverged run logs NaN or infinite losses.
fn finite(points: impl Iterator<Item = (f64, f64)>) -> Points {
    points.filter(|(_, y)| y.is_finite()).collect()
}

/// How many points of a series of `n` share one bucket when thinning it.
fn stride(n: usize) -> usize {
    n.div_ceil(MAX_POINTS / 2).max(1)
}

/// Thins a series to at most [`MAX_POINTS`] by keeping the lowest and the highest point of
/// each bucket of [`stride`] consecutive points, in step order. Every kept point is a real
/// measurement, and spikes survive: taking every k-th point would skip a memory spike or a
/// slow step that falls between the points taken. At a bucket per pixel column this draws
/// what the full series would.
fn thin(points: Points) -> Points {
    let k = stride(points.len());
    if k == 1 {
        return points;
    }
    let mut kept = Vec::with_capacity(2 * points.len().div_ceil(k));
    for bucket in points.chunks(k) {
        let by_y = |a: &&(f64, f64), b: &&(f64, f64)| a.1.total_cmp(&b.1);
        let lo = bucket.iter().min_by(by_y).expect("chunks are not empty");
        let hi = bucket.iter().max_by(by_y).expect("chunks are not empty");
        let (first, second) = if lo.0 <= hi.0 { (lo, hi) } else { (hi, lo) };
        kept.push(*first);
        if second != first {
            kept.push(*second);
        }
    }
    kept
}

/// The median of each point's window of `window` points centred on it (shrunk at the ends),
/// computed on the full series before thinning so the smoothing does not depend on it.
fn moving_median(points: &[(f64, f64)], window: usize) -> Points {
    let half = window / 2;
    let mut buf = Vec::with_capacity(window);
    points
        .iter()
        .enumerate()
        .map(|(i, &(x, _))| {
            let range = i.saturating_sub(half)..(i + half + 1).min(points.len());
            buf.clear();
            buf.extend(points[range].iter().map(|&(_, y)| y));
            buf.sort_by(f64::total_cmp);
            (x, buf[buf.len() / 2])
        })
        .collect()
}

/// A y range covering every point of `series` with a margin, starting at 0 when `from_zero`.
fn y_range(series: &[&Points], from_zero: bool) -> Range<f64> {
    let ys = series.iter().flat_map(|s| s.iter().map(|&(_, y)| y));
    let (lo, hi) =
        ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let lo = if from_zero { lo.min(0.0) } else { lo };
    if lo > hi {
        return 0.0..1.0;
    }
    let pad = if hi > lo { (hi - lo) * 0.05 } else { lo.abs().max(1.0) * 0.1 };
    let lo = if from_zero && lo >= 0.0 { lo } else { lo - pad };
    lo..hi + pad
}

fn new_chart<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    title: &str,
    x: Range<f64>,
    y: Range<f64>,
) -> DrawResult<Chart<'a, DB>, DB> {
    ChartBuilder::on(area)
        .caption(title, (FONT, 24))
        .margin(12)
        // Room for the last step's label, which is centred on the right edge.
        .margin_right(30)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(x, y)
}

fn mesh<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    x_desc: &str,
    y_desc: &str,
    y_format: &dyn Fn(&f64) -> String,
) -> DrawResult<(), DB> {
    // Steps are whole numbers: a short run gets a label per step rather than ten labels
    // rounded to the same few steps.
    let x = chart.as_coord_spec().get_x_range();
    let x_labels = ((x.end - x.start).round() as usize + 1).clamp(2, 10);
    chart
        .configure_mesh()
        .x_labels(x_labels)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .axis_desc_style((FONT, 16))
        .label_style((FONT, 14))
        .x_label_formatter(&|x| if x.fract() == 0.0 { format!("{x:.0}") } else { String::new() })
        .y_label_formatter(y_format)
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.08))
        .draw()
}

/// Draws `points` joined by straight segments, each its own element. Plotters joins the
/// segments of a wide polyline with unbounded miters, which turn every sharp zigzag of a noisy
/// or spiky series into a long spike across the chart; separate segments have no joins. A
/// series of one point (a run of one step) is drawn as a dot so it is not invisible.
fn polyline<'a, 'c, DB: DrawingBackend + 'a>(
    chart: &'c mut Chart<'a, DB>,
    points: &Points,
    style: ShapeStyle,
) -> DrawResult<&'c mut SeriesAnno<'a, DB>, DB> {
    match points.as_slice() {
        [p] => chart.draw_series(std::iter::once(Circle::new(*p, 3, style.filled()))),
        _ => {
            chart.draw_series(points.windows(2).map(|w| PathElement::new(vec![w[0], w[1]], style)))
        }
    }
}

/// Draws `points` as a line with a legend entry; an empty series draws nothing and gets none.
fn line<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    points: &Points,
    label: &str,
    style: ShapeStyle,
) -> DrawResult<(), DB> {
    if points.is_empty() {
        return Ok(());
    }
    polyline(chart, points, style)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    Ok(())
}

/// Draws `points` as a line with a marker on each point: eval points are few and each is a
/// measurement worth seeing.
fn marked_line<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    points: &Points,
    label: &str,
    color: RGBColor,
) -> DrawResult<(), DB> {
    if points.is_empty() {
        return Ok(());
    }
    let style = color.stroke_width(2);
    polyline(chart, points, style)?;
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?
        .label(label)
        .legend(move |(x, y)| {
            EmptyElement::at((x, y))
                + PathElement::new(vec![(0, 0), (20, 0)], style)
                + Circle::new((10, 0), 4, color.filled())
        });
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    position: SeriesLabelPosition,
) -> DrawResult<(), DB> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
}

fn draw_loss<DB: DrawingBackend>(run: &Run, area: &DrawingArea<DB, Shift>) -> DrawResult<(), DB> {
    let train = run.train_series(|m| m.loss);
    let eval = run.eval_series(|m| m.eval_loss);
    let mut chart = new_chart(area, "Loss", run.steps(), y_range(&[&train, &eval], false))?;
    mesh(&mut chart, &run.step_label(), "loss", &|y| format!("{y:.3}"))?;
    line(&mut chart, &train, "train loss", PALETTE[0].stroke_width(1))?;
    marked_line(&mut chart, &eval, "eval loss", PALETTE[1])?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// Accuracy; for a regression, which has none, the evaluation's errors in the label's units.
fn draw_accuracy<DB: DrawingBackend>(
    run: &Run,
    area: &DrawingArea<DB, Shift>,
) -> DrawResult<(), DB> {
    if run.eval.iter().any(|m| m.eval_rmse.is_some()) {
        let rmse = run.eval_series(|m| m.eval_rmse.unwrap_or(f64::NAN));
        let mae = run.eval_series(|m| m.eval_mae.unwrap_or(f64::NAN));
        let mut chart = new_chart(area, "Eval error", run.steps(), y_range(&[&rmse, &mae], true))?;
        mesh(&mut chart, &run.step_label(), "label units", &|y| format!("{y:.3}"))?;
        marked_line(&mut chart, &rmse, "eval RMSE", PALETTE[0])?;
        marked_line(&mut chart, &mae, "eval MAE", PALETTE[1])?;
        return legend(&mut chart, SeriesLabelPosition::UpperRight);
    }
    let train = run.train_series(|m| m.accuracy.unwrap_or(f64::NAN));
    let eval = run.eval_series(|m| m.eval_accuracy.unwrap_or(f64::NAN));
    let mut chart = new_chart(area, "Accuracy", run.steps(), 0.0..1.0)?;
    mesh(&mut chart, &run.step_label(), "accuracy", &|y| format!("{y:.1}"))?;
    line(&mut chart, &train, "train accuracy", PALETTE[0].stroke_width(1))?;
    marked_line(&mut chart, &eval, "eval accuracy", PALETTE[1])?;
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// Samples/s on top, and below it the shares of each step spent waiting for data and for
/// communication that did not overlap with compute: the two reasons a step is slower than
/// its compute. Each is drawn per step (faint) and as a moving median (bold): per-step timings
/// on a shared machine are noisy, and the median shows the level without hiding the spikes.
fn draw_throughput<DB: DrawingBackend>(
    run: &Run,
    area: &DrawingArea<DB, Shift>,
) -> DrawResult<(), DB> {
    let steps = run.steps();
    let (top, bottom) = area.split_vertically(SIZE.1 * 55 / 100);
    // About fifty windows over the run, odd so each has a middle, at least 5 and at most 201.
    let window = (run.train.len() / 50).clamp(5, 201) | 1;
    let per_step_and_median = |value: &dyn Fn(&StepMetrics) -> f64| {
        let full = finite(run.train.iter().map(|m| (m.step as f64, value(m))));
        let median = thin(moving_median(&full, window));
        (thin(full), median)
    };
    let faint = |color: RGBColor| color.mix(0.3).stroke_width(1);

    let (samples, median) = per_step_and_median(&|m| m.samples_per_s);
    let mut chart = new_chart(&top, "Throughput", steps.clone(), y_range(&[&samples], true))?;
    mesh(&mut chart, "", "samples/s", &|y| format!("{y:.0}"))?;
    line(&mut chart, &samples, "per step", faint(PALETTE[0]))?;
    let label = format!("moving median of {window} steps");
    line(&mut chart, &median, &label, PALETTE[0].stroke_width(2))?;
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;

    let share =
        |part: fn(&StepMetrics) -> f64| per_step_and_median(&|m| 100.0 * part(m) / m.step_s);
    let (data, data_median) = share(|m| m.data_wait_s);
    let (comm, comm_median) = share(|m| m.comm_exposed_s);
    let hi = y_range(&[&data, &comm], true).end.clamp(1.0, 100.0);
    let title = "Share of step time spent waiting (faint: per step, bold: moving median)";
    let mut chart = new_chart(&bottom, title, steps, 0.0..hi)?;
    mesh(&mut chart, &run.step_label(), "% of step", &|y| format!("{y:.1}"))?;
    polyline(&mut chart, &data, faint(PALETTE[1]))?;
    polyline(&mut chart, &comm, faint(PALETTE[3]))?;
    line(&mut chart, &data_median, "data wait", PALETTE[1].stroke_width(2))?;
    line(&mut chart, &comm_median, "exposed communication", PALETTE[3].stroke_width(2))?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// One line per memory tag, over every tag any step reported (a tag missing from a step had
/// no bytes then).
fn draw_memory<DB: DrawingBackend>(run: &Run, area: &DrawingArea<DB, Shift>) -> DrawResult<(), DB> {
    let mut tags: Vec<&str> =
        run.train.iter().flat_map(|m| m.memory.keys().map(String::as_str)).collect();
    tags.sort_unstable();
    tags.dedup();
    let mib = |m: &StepMetrics, tag: &str| m.memory.get(tag).copied().unwrap_or(0) as f64 / MIB;
    // Peaks over every step, not only the drawn ones: a short spike is what a memory plot is
    // looked at for.
    let peaks: Vec<f64> =
        tags.iter().map(|&tag| run.train.iter().map(|m| mib(m, tag)).fold(0.0, f64::max)).collect();
    let top = peaks.iter().copied().fold(0.0, f64::max);
    // Headroom for the legend (one row per tag) above the highest line, which it would hide.
    let headroom = 1.05 + 0.055 * tags.len() as f64;
    let y = if top > 0.0 { 0.0..top * headroom } else { 0.0..1.0 };
    let title = if tags.is_empty() {
        "Memory in use by tag (none recorded)"
    } else {
        "Memory in use by tag"
    };
    let mut chart = new_chart(area, title, run.steps(), y)?;
    mesh(&mut chart, &run.step_label(), "MiB", &|y| format!("{y:.1}"))?;
    for (i, (&tag, peak)) in tags.iter().zip(&peaks).enumerate() {
        let points = run.train_series(|m| mib(m, tag));
        // Tags of equal size (parameters and gradients always are) draw on top of each other;
        // the peak in the legend still tells them apart.
        let label = format!("{tag} (peak {peak:.1} MiB)");
        line(&mut chart, &points, &label, PALETTE[i % PALETTE.len()].stroke_width(2))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thin_keeps_at_most_max_points_and_every_spike() {
        let mut points: Points = (0..100_001).map(|i| (i as f64, (i % 7) as f64)).collect();
        // Single-step spikes up and down where taking every k-th point would miss them.
        points[12_345].1 = 1000.0;
        points[67_891].1 = -1000.0;
        let kept = thin(points.clone());
        assert!(kept.len() <= MAX_POINTS, "{} points kept", kept.len());
        assert!(kept.contains(&(12_345.0, 1000.0)) && kept.contains(&(67_891.0, -1000.0)));
        assert!(kept.windows(2).all(|w| w[0].0 < w[1].0), "not in step order");
        assert!(kept.iter().all(|p| points[p.0 as usize] == *p), "a point that was not measured");
        let short: Points = (0..10).map(|i| (i as f64, 1.0)).collect();
        assert_eq!(thin(short.clone()), short);
    }

    #[test]
    fn moving_median_ignores_a_single_outlier() {
        let mut points: Points = (0..20).map(|i| (i as f64, 100.0)).collect();
        points[10].1 = 1.0e9;
        points[3].1 = 0.0;
        let median = moving_median(&points, 5);
        assert_eq!(median.len(), points.len());
        assert!(median.iter().all(|&(_, y)| y == 100.0), "{median:?}");
    }

    #[test]
    fn later_records_of_a_repeated_step_win() {
        let mut records = vec![(1, 'a'), (2, 'a'), (3, 'a'), (2, 'b'), (3, 'b'), (4, 'b')];
        keep_last_per_step(&mut records, |r| r.0);
        assert_eq!(records, [(1, 'a'), (2, 'b'), (3, 'b'), (4, 'b')]);
    }

    #[test]
    fn y_range_pads_a_flat_series_and_survives_an_empty_one() {
        let flat: Points = vec![(1.0, 2.0), (2.0, 2.0)];
        let r = y_range(&[&flat], false);
        assert!(r.start < 2.0 && r.end > 2.0, "{r:?}");
        assert_eq!(y_range(&[&Vec::new()], true), 0.0..1.0);
        let positive: Points = vec![(1.0, 5.0), (2.0, 10.0)];
        assert_eq!(y_range(&[&positive], true).start, 0.0);
    }

    #[test]
    fn the_font_registers_from_many_threads_at_once() {
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8).map(|_| s.spawn(register_font)).collect();
            handles.into_iter().map(|h| h.join().expect("no panic")).collect()
        });
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }
}
