//! `timeline.svg`: requests admitted per second per node (from the history)
//! against the limit's average rate (L / W), and tokens admitted per second per
//! node, nemesis intervals shaded and single events (kill -9) marked. Plain SVG,
//! no dependency.

use crate::checker::Op;

/// A nemesis interval or instant, in ms since the run started.
#[derive(Debug, Clone)]
pub struct Mark {
    /// Start.
    pub from_ms: u64,
    /// End (`None`: an instant).
    pub to_ms: Option<u64>,
    /// Label.
    pub label: String,
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
];

/// What one panel plots per node and second.
#[derive(Clone, Copy)]
enum Measure {
    Requests,
    Tokens,
}

/// The picture for `ops` over `duration_ms`, `nodes` nodes, limit rate `rate`
/// (req/s): two panels, requests admitted per second per node against the limit,
/// and tokens admitted per second per node (each response's reported usage), both
/// with the faults shaded.
pub fn render(ops: &[Op], nodes: usize, duration_ms: u64, rate: f64, marks: &[Mark]) -> String {
    let (w, panel_h) = (800.0, 300.0);
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{}" font-family="sans-serif" font-size="11">
<rect width="{w}" height="{}" fill="white"/>
"#,
        2.0 * panel_h,
        2.0 * panel_h
    );
    let requests = per_second(ops, nodes, duration_ms, Measure::Requests);
    let tokens = per_second(ops, nodes, duration_ms, Measure::Tokens);
    let frame = Frame {
        w,
        h: panel_h,
        top: 0.0,
        duration_ms,
    };
    panel(&mut svg, &frame, &requests, Some(rate), "requests/s", marks);
    let frame = Frame {
        top: panel_h,
        ..frame
    };
    panel(&mut svg, &frame, &tokens, None, "tokens/s", marks);
    svg.push_str("</svg>\n");
    svg
}

/// Admitted `measure` per node and whole second of the run.
fn per_second(ops: &[Op], nodes: usize, duration_ms: u64, measure: Measure) -> Vec<Vec<u64>> {
    let seconds = (duration_ms / 1000).max(1) as usize + 1;
    let mut per_node = vec![vec![0u64; seconds]; nodes];
    for op in ops.iter().filter(|o| o.status == Some(200)) {
        let s = (op.complete_ms.unwrap_or(op.invoke_ms) / 1000) as usize;
        if let Some(slot) = per_node.get_mut(op.node).and_then(|v| v.get_mut(s)) {
            *slot += match measure {
                Measure::Requests => 1,
                Measure::Tokens => op.tokens.unwrap_or(0),
            };
        }
    }
    per_node
}

/// Where a panel sits in the picture.
#[derive(Clone, Copy)]
struct Frame {
    w: f64,
    h: f64,
    top: f64,
    duration_ms: u64,
}

/// One panel: the faults, the limit line (if any), a line per node and the axes.
fn panel(
    svg: &mut String,
    f: &Frame,
    per_node: &[Vec<u64>],
    rate: Option<f64>,
    unit: &str,
    marks: &[Mark],
) {
    let pad = 40.0;
    let (w, h, top) = (f.w, f.h, f.top);
    let highest = per_node.iter().flatten().copied().max().unwrap_or(1).max(1) as f64;
    let peak = highest.max(rate.unwrap_or(0.0) * 1.5);
    let x = |ms: f64| pad + (w - 2.0 * pad) * ms / f.duration_ms.max(1) as f64;
    let y = |v: f64| top + h - pad - (h - 2.0 * pad) * v / peak;
    for m in marks {
        match m.to_ms {
            Some(to) => svg.push_str(&format!(
                r##"<rect x="{:.1}" y="{}" width="{:.1}" height="{:.1}" fill="#999" fill-opacity="0.2"/><text x="{:.1}" y="{}">{}</text>
"##,
                x(m.from_ms as f64),
                top + pad,
                x(to as f64) - x(m.from_ms as f64),
                h - 2.0 * pad,
                x(m.from_ms as f64) + 3.0,
                top + pad - 5.0,
                m.label
            )),
            None => svg.push_str(&format!(
                r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2}" stroke="#d62728" stroke-dasharray="3,3"/><text x="{3:.1}" y="{4}">{5}</text>
"##,
                x(m.from_ms as f64),
                top + pad,
                top + h - pad,
                x(m.from_ms as f64) + 3.0,
                top + pad - 5.0,
                m.label
            )),
        }
    }
    if let Some(rate) = rate {
        svg.push_str(&format!(
            r##"<line x1="{pad}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="black" stroke-dasharray="6,4"/><text x="{:.1}" y="{:.1}">limit L/W = {rate:.1}/s (cluster total)</text>
"##,
            w - pad,
            y(rate),
            y(rate),
            w - pad - 200.0,
            y(rate) - 4.0
        ));
    }
    for (node, counts) in per_node.iter().enumerate() {
        let points: Vec<String> = (counts.iter().enumerate())
            .map(|(s, c)| format!("{:.1},{:.1}", x(s as f64 * 1000.0 + 500.0), y(*c as f64)))
            .collect();
        let color = COLORS[node % COLORS.len()];
        svg.push_str(&format!(
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/><text x="{:.1}" y="{:.1}" fill="{color}">n{node}</text>
"#,
            points.join(" "),
            w - pad + 4.0,
            top + pad + 14.0 * node as f64
        ));
    }
    svg.push_str(&format!(
        r#"<line x1="{pad}" x2="{pad}" y1="{1}" y2="{0}" stroke="black"/><line x1="{pad}" x2="{2}" y1="{0}" y2="{0}" stroke="black"/><text x="{pad}" y="{3}">0 s</text><text x="{4}" y="{3}">{5} s</text><text x="4" y="{1}">{6:.0} {unit}</text>
"#,
        top + h - pad,
        top + pad,
        w - pad,
        top + h - pad + 14.0,
        w - pad - 20.0,
        f.duration_ms / 1000,
        peak
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_lines_marks_and_the_limit() {
        let ops = vec![
            Op {
                node: 0,
                invoke_ms: 100,
                complete_ms: Some(120),
                status: Some(200),
                tokens: Some(17),
                ..Op::default()
            },
            Op {
                node: 1,
                invoke_ms: 1_100,
                complete_ms: Some(1_120),
                status: Some(429),
                ..Op::default()
            },
        ];
        let marks = vec![
            Mark {
                from_ms: 500,
                to_ms: Some(1_500),
                label: "partition".into(),
            },
            Mark {
                from_ms: 700,
                to_ms: None,
                label: "kill -9 n1".into(),
            },
        ];
        let svg = render(&ops, 2, 2_000, 5.0, &marks);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 4, "two nodes, two panels");
        assert!(svg.contains("17 tokens/s"), "the tokens panel peaks at 17");
        assert!(
            svg.contains("partition") && svg.contains("kill -9 n1") && svg.contains("limit L/W")
        );
    }
}
