//! The benchmark's pictures (plain SVG, no dependency):
//! `accuracy-vs-throughput.svg`, every cell as a point (utilisation across, the
//! peak window's overshoot up, one colour per mode), and
//! `latency-cdf-<pattern>-<n>n.svg`, the distribution of served requests' client
//! latency per mode for each pattern and cluster size.

use super::{BenchSpec, Cell, read_jsonl};
use crate::checker::Op;
use std::fmt::Write;

const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];
const W: f64 = 720.0;
const H: f64 = 440.0;
/// Plot area margins: left, right, top, bottom.
const MARGIN: (f64, f64, f64, f64) = (70.0, 190.0, 30.0, 50.0);

/// Writes every picture of the matrix into the spec's directory.
pub(super) fn write_all(spec: &BenchSpec, cells: &[Cell]) -> anyhow::Result<()> {
    if cells.is_empty() {
        return Ok(());
    }
    std::fs::write(
        spec.dir.join("accuracy-vs-throughput.svg"),
        accuracy_vs_throughput(&spec.modes, cells),
    )?;
    for pattern in &spec.patterns {
        for &nodes in &spec.nodes {
            let mut curves = Vec::new();
            for mode in &spec.modes {
                let dir = spec.dir.join(format!("{mode}-{nodes}n-{}", pattern.name()));
                let Ok(ops) = read_jsonl::<Op>(&dir.join("history.jsonl")) else {
                    continue;
                };
                let mut ms: Vec<u64> = (ops.iter())
                    .filter(|o| o.status == Some(200))
                    .filter_map(|o| o.complete_ms.map(|c| c.saturating_sub(o.invoke_ms)))
                    .collect();
                ms.sort_unstable();
                curves.push((mode.clone(), ms));
            }
            let title = format!("client latency, {} nodes, `{}`", nodes, pattern.name());
            let name = format!("latency-cdf-{}-{nodes}n.svg", pattern.name());
            std::fs::write(spec.dir.join(name), latency_cdf(&title, &curves))?;
        }
    }
    Ok(())
}

/// Every cell as a point: utilisation (what the upstream accepted over L)
/// across, overshoot (the worst window over L, minus 1) up; the promise lines at
/// 0 and +0.2.
pub(super) fn accuracy_vs_throughput(modes: &[String], cells: &[Cell]) -> String {
    let x_max = (cells.iter().map(|c| c.utilisation).fold(1.0, f64::max) * 10.0).ceil() / 10.0;
    let x_min = (cells.iter().map(|c| c.utilisation).fold(x_max, f64::min) * 10.0).floor() / 10.0;
    let y_max = (cells.iter().map(|c| c.overshoot).fold(0.3, f64::max) * 10.0).ceil() / 10.0;
    let y_min = (cells.iter().map(|c| c.overshoot).fold(-0.1, f64::min) * 10.0).floor() / 10.0;
    let frame = Frame::new(x_min.min(x_max - 0.1), x_max, y_min, y_max);
    let mut svg = open("overshoot against utilisation, every cell of the matrix");
    frame.axes(
        &mut svg,
        "utilisation (accepted by the upstream / L)",
        "overshoot (worst window / L - 1)",
        |v| format!("{v:.2}"),
        |v| format!("{v:.2}"),
    );
    for (y, label) in [(0.0, "L"), (0.2, "L x 1.2 (gossip's promise)")] {
        if y <= y_max {
            let py = frame.y(y);
            let _ = writeln!(
                svg,
                r##"<line x1="{}" y1="{py:.1}" x2="{}" y2="{py:.1}" stroke="#999" stroke-dasharray="4 3"/><text x="{}" y="{:.1}" fill="#666">{label}</text>"##,
                MARGIN.0,
                W - MARGIN.1,
                MARGIN.0 + 4.0,
                py - 3.0
            );
        }
    }
    for (i, mode) in modes.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        // Rings, the first mode's widest: modes landing on the same point (most
        // synced modes sit at utilisation 1, overshoot 0) stay visible.
        let r = 3.0 + 2.0 * (modes.len() - 1 - i) as f64;
        for c in cells.iter().filter(|c| &c.mode == mode) {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="{r}" fill="none" stroke="{color}" stroke-width="1.5"><title>{} {} nodes {}: overshoot {:+.3}, utilisation {:.2}</title></circle>"#,
                frame.x(c.utilisation),
                frame.y(c.overshoot),
                c.mode,
                c.nodes,
                c.pattern,
                c.overshoot,
                c.utilisation
            );
        }
        legend(&mut svg, i, mode, color);
    }
    svg.push_str("</svg>\n");
    svg
}

/// The cumulative distribution of each mode's latencies (sorted, ms), on a log
/// scale from 1 ms.
pub(super) fn latency_cdf(title: &str, curves: &[(String, Vec<u64>)]) -> String {
    let longest = (curves.iter())
        .filter_map(|(_, ms)| ms.last().copied())
        .max()
        .unwrap_or(1);
    let shortest = (curves.iter())
        .filter_map(|(_, ms)| ms.first().copied())
        .min()
        .unwrap_or(1);
    // From the decade below the fastest request to the one above the slowest.
    let first = (shortest.max(1) as f64).log10().floor();
    let decades = (longest.max(10) as f64).log10().ceil().max(first + 1.0);
    let frame = Frame::new(first, decades, 0.0, 1.0);
    let mut svg = open(title);
    frame.axes(
        &mut svg,
        "latency (ms, log scale)",
        "share of served requests",
        |_| String::new(),
        |v| format!("{v:.1}"),
    );
    for (i, (mode, ms)) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let n = ms.len();
        if n > 0 {
            let points: Vec<String> = (ms.iter().enumerate())
                .map(|(k, &v)| {
                    let x = frame.x((v.max(1) as f64).log10());
                    let y = frame.y((k + 1) as f64 / n as f64);
                    format!("{x:.1},{y:.1}")
                })
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#,
                points.join(" ")
            );
        }
        legend(&mut svg, i, &format!("{mode} ({n})"), color);
    }
    // The x axis is in decades: label each as milliseconds.
    for d in first as u32..=decades as u32 {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{} ms</text>"#,
            frame.x(f64::from(d)),
            H - MARGIN.3 + 30.0,
            10u64.pow(d)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn open(title: &str) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{}" y="18" font-size="13">{}</text>
"#,
        MARGIN.0,
        escape(title)
    )
}

fn legend(svg: &mut String, i: usize, label: &str, color: &str) {
    let (x, y) = (W - MARGIN.1 + 15.0, MARGIN.2 + 10.0 + 18.0 * i as f64);
    let _ = writeln!(
        svg,
        r#"<rect x="{x}" y="{}" width="10" height="10" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
        y - 9.0,
        x + 15.0,
        y,
        escape(label)
    );
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Data ranges mapped onto the plot area.
struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    fn new(x0: f64, x1: f64, y0: f64, y1: f64) -> Frame {
        Frame {
            x0,
            x1: if x1 > x0 { x1 } else { x0 + 1.0 },
            y0,
            y1: if y1 > y0 { y1 } else { y0 + 1.0 },
        }
    }

    fn x(&self, v: f64) -> f64 {
        MARGIN.0 + (v - self.x0) / (self.x1 - self.x0) * (W - MARGIN.0 - MARGIN.1)
    }

    fn y(&self, v: f64) -> f64 {
        H - MARGIN.3 - (v - self.y0) / (self.y1 - self.y0) * (H - MARGIN.2 - MARGIN.3)
    }

    /// The box, five ticks on each axis (labelled by `fmt_x` and `fmt_y`), and
    /// the axis titles.
    fn axes(
        &self,
        svg: &mut String,
        x_title: &str,
        y_title: &str,
        fmt_x: impl Fn(f64) -> String,
        fmt_y: impl Fn(f64) -> String,
    ) {
        let (left, right, top, bottom) = (MARGIN.0, W - MARGIN.1, MARGIN.2, H - MARGIN.3);
        let _ = writeln!(
            svg,
            r##"<rect x="{left}" y="{top}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
            right - left,
            bottom - top
        );
        for k in 0..=5 {
            let t = f64::from(k) / 5.0;
            let (vx, vy) = (
                self.x0 + t * (self.x1 - self.x0),
                self.y0 + t * (self.y1 - self.y0),
            );
            let (px, py) = (self.x(vx), self.y(vy));
            let _ = writeln!(
                svg,
                r##"<line x1="{px:.1}" y1="{bottom}" x2="{px:.1}" y2="{}" stroke="#333"/><text x="{px:.1}" y="{}" text-anchor="middle" fill="#555">{}</text>"##,
                bottom + 4.0,
                bottom + 16.0,
                fmt_x(vx)
            );
            let _ = writeln!(
                svg,
                r##"<line x1="{}" y1="{py:.1}" x2="{left}" y2="{py:.1}" stroke="#333"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                left - 4.0,
                left - 6.0,
                py + 4.0,
                fmt_y(vy)
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (left + right) / 2.0,
            H - 6.0,
            escape(x_title),
            (top + bottom) / 2.0,
            escape(y_title)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(mode: &str, overshoot: f64, utilisation: f64) -> Cell {
        Cell {
            mode: mode.into(),
            nodes: 3,
            pattern: "uniform".into(),
            overshoot,
            utilisation,
            steady_fill: utilisation,
            upstream_429s: 0,
            gateway_429s: 0,
            latency_ms: [1, 2, 3],
            requests_per_s: 1.0,
            tokens_per_s: 1.0,
            sync_bytes_per_s: 1.0,
            promise_kept: true,
        }
    }

    #[test]
    fn every_cell_is_a_point_placed_by_its_figures() {
        let modes = ["lease".to_owned(), "local-full".to_owned()];
        let svg = accuracy_vs_throughput(
            &modes,
            &[cell("lease", 0.0, 1.0), cell("local-full", 0.3, 0.5)],
        );
        assert_eq!(svg.matches("<circle").count(), 2, "{svg}");
        // Overshoot 0 sits on the L line; utilisation 1 at the right end (x 0.5-1).
        let frame = Frame::new(0.5, 1.0, -0.1, 0.3);
        let lease = format!(r#"cx="{:.1}" cy="{:.1}""#, frame.x(1.0), frame.y(0.0));
        assert!(svg.contains(&lease), "{svg}");
        assert!(svg.contains(">local-full</text>"), "{svg}");
    }

    #[test]
    fn a_cdf_rises_to_one_at_the_slowest_request() {
        let svg = latency_cdf("t", &[("lease".into(), vec![1, 10, 100])]);
        let frame = Frame::new(0.0, 2.0, 0.0, 1.0);
        let top = format!("{:.1},{:.1}", frame.x(2.0), frame.y(1.0));
        assert!(svg.contains(&top), "{svg}");
        assert!(
            svg.contains(">100 ms</text>") && svg.contains("lease (3)"),
            "{svg}"
        );
    }
}
