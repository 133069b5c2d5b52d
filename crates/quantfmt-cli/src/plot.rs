//! A hand-written SVG chart of quantization error against storage cost: one labelled
//! point per format (all tensors together), smaller markers per tensor class, axes with
//! ticks, a grid and a legend. Readable without the table.

use std::fmt::Write;

/// One point: x = bits per value, y = SQNR in dB.
#[derive(Clone, Debug)]
pub struct Point {
    /// Format spec (the label of overall points).
    pub label: String,
    /// Series: "all tensors" or a class name.
    pub series: String,
    /// Bits per value.
    pub x: f64,
    /// SQNR dB (finite).
    pub y: f64,
}

const W: f64 = 880.0;
const H: f64 = 560.0;
const L: f64 = 80.0;
const R: f64 = 210.0;
const T: f64 = 60.0;
const B: f64 = 70.0;
const COLORS: [&str; 7] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn nice_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= raw {
            return m * p;
        }
    }
    10.0 * p
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders the chart; `series` lists the class series in legend order (the overall
/// series is always first).
pub fn svg(points: &[Point], title: &str, series: &[String]) -> String {
    let finite: Vec<&Point> = points
        .iter()
        .filter(|p| p.x.is_finite() && p.y.is_finite())
        .collect();
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for p in &finite {
        x0 = x0.min(p.x);
        x1 = x1.max(p.x);
        y0 = y0.min(p.y);
        y1 = y1.max(p.y);
    }
    if finite.is_empty() {
        (x0, x1, y0, y1) = (0.0, 16.0, 0.0, 40.0);
    }
    let xs = nice_step((x1 - x0).max(1.0), 8.0);
    let ys = nice_step((y1 - y0).max(5.0), 8.0);
    let (x0, x1) = (
        (x0 / xs).floor() * xs - xs * 0.5,
        (x1 / xs).ceil() * xs + xs * 0.5,
    );
    let (y0, y1) = (
        (y0 / ys).floor() * ys - ys * 0.5,
        (y1 / ys).ceil() * ys + ys * 0.5,
    );
    let px = |x: f64| L + (x - x0) / (x1 - x0) * (W - L - R);
    let py = |y: f64| H - B - (y - y0) / (y1 - y0) * (H - T - B);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="{:.1}" y="30" font-size="18" text-anchor="middle" font-weight="bold">{}</text>
"#,
        (L + W - R) / 2.0,
        esc(title)
    );
    // Grid and ticks.
    let mut x = (x0 / xs).ceil() * xs;
    while x <= x1 + 1e-9 {
        let gx = px(x);
        let _ = writeln!(
            s,
            r##"<line x1="{gx:.1}" y1="{T}" x2="{gx:.1}" y2="{:.1}" stroke="#e6e6e6"/><text x="{gx:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text>"##,
            H - B,
            H - B + 18.0,
            trim(x)
        );
        x += xs;
    }
    let mut y = (y0 / ys).ceil() * ys;
    while y <= y1 + 1e-9 {
        let gy = py(y);
        let _ = writeln!(
            s,
            r##"<line x1="{L}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#e6e6e6"/><text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"##,
            W - R,
            L - 8.0,
            gy + 4.0,
            trim(y)
        );
        y += ys;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{L}" y="{T}" width="{:.1}" height="{:.1}" fill="none" stroke="#333"/>
<text x="{:.1}" y="{:.1}" font-size="14" text-anchor="middle">bits per value (all buffers, scales and padding included)</text>
<text x="22" y="{:.1}" font-size="14" text-anchor="middle" transform="rotate(-90 22 {:.1})">SQNR (dB, higher is better)</text>
<text x="{:.1}" y="{:.1}" font-size="11" fill="#555">better: up and to the left</text>"##,
        W - L - R,
        H - T - B,
        (L + W - R) / 2.0,
        H - 25.0,
        (T + H - B) / 2.0,
        (T + H - B) / 2.0,
        L + 8.0,
        T + 16.0
    );
    // Class markers first (under the labelled overall points).
    for p in finite.iter().filter(|p| p.series != "all tensors") {
        let ci = series.iter().position(|c| c == &p.series).unwrap_or(0);
        let c = COLORS[(ci + 1) % COLORS.len()];
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="7" height="7" fill="{c}" opacity="0.75"><title>{} {}: {:.3} bits, {:.2} dB</title></rect>"#,
            px(p.x) - 3.5,
            py(p.y) - 3.5,
            esc(&p.label),
            esc(&p.series),
            p.x,
            p.y
        );
    }
    // Overall points with labels placed so they do not overlap.
    let mut placed: Vec<(f64, f64, f64, f64)> = Vec::new();
    let mut overall: Vec<&&Point> = finite
        .iter()
        .filter(|p| p.series == "all tensors")
        .collect();
    overall.sort_by(|a, b| a.x.total_cmp(&b.x).then(b.y.total_cmp(&a.y)));
    for p in overall {
        let (cx, cy) = (px(p.x), py(p.y));
        let _ = writeln!(
            s,
            r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="5.5" fill="{}" stroke="black"><title>{}: {:.3} bits, {:.2} dB</title></circle>"#,
            COLORS[0],
            esc(&p.label),
            p.x,
            p.y
        );
        let w = 7.0 * p.label.len() as f64;
        // Right of the point when the label fits inside the plot, else left of it; the
        // first vertical offset whose box overlaps no placed label wins.
        let right_fits = cx + 9.0 + w <= W - R - 2.0;
        let mut chosen = None;
        'search: for dy in [-8.0, 14.0, -22.0, 28.0, -36.0, 42.0, -50.0, 56.0] {
            for right in [right_fits, !right_fits] {
                let x = if right { cx + 9.0 } else { cx - 9.0 - w };
                if x < L + 2.0 || x + w > W - R - 2.0 {
                    continue;
                }
                let (bx0, by0, bx1, by1) = (x, cy + dy - 11.0, x + w, cy + dy + 2.0);
                if !placed
                    .iter()
                    .any(|&(a0, b0, a1, b1)| bx0 < a1 && a0 < bx1 && by0 < b1 && b0 < by1)
                {
                    chosen = Some((x, cy + dy));
                    break 'search;
                }
            }
        }
        let chosen = chosen.unwrap_or((if right_fits { cx + 9.0 } else { cx - 9.0 - w }, cy - 8.0));
        placed.push((chosen.0, chosen.1 - 11.0, chosen.0 + w, chosen.1 + 2.0));
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            chosen.0,
            chosen.1,
            esc(&p.label)
        );
    }
    // Legend.
    let lx = W - R + 18.0;
    let _ = writeln!(
        s,
        r#"<text x="{lx:.1}" y="{:.1}" font-size="13" font-weight="bold">legend</text>
<circle cx="{:.1}" cy="{:.1}" r="5.5" fill="{}" stroke="black"/><text x="{:.1}" y="{:.1}" font-size="12">format, all tensors</text>"#,
        T + 12.0,
        lx + 6.0,
        T + 32.0,
        COLORS[0],
        lx + 18.0,
        T + 36.0
    );
    for (i, c) in series.iter().enumerate() {
        let y = T + 56.0 + 20.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="9" height="9" fill="{}" opacity="0.75"/><text x="{:.1}" y="{:.1}" font-size="12">{} tensors</text>"#,
            lx + 1.5,
            y - 4.5,
            COLORS[(i + 1) % COLORS.len()],
            lx + 18.0,
            y + 4.0,
            esc(c)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_points_labels_axes_and_legend() {
        let pts = vec![
            Point {
                label: "fp8".into(),
                series: "all tensors".into(),
                x: 8.0,
                y: 31.0,
            },
            Point {
                label: "nvfp4".into(),
                series: "all tensors".into(),
                x: 4.5,
                y: 19.0,
            },
            Point {
                label: "nvfp4:2d".into(),
                series: "all tensors".into(),
                x: 4.5,
                y: 18.8,
            },
            Point {
                label: "nvfp4".into(),
                series: "attention".into(),
                x: 4.5,
                y: 19.5,
            },
        ];
        let s = svg(&pts, "t <1>", &["attention".to_string()]);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains(">nvfp4:2d</text>") && s.contains("attention tensors"));
        assert!(s.contains("t &lt;1&gt;") && s.contains("bits per value"));
        assert_eq!(s.matches("<circle").count(), 4); // 3 points + legend
    }
}
