//! Error statistics between a tensor and its dequantized copy.

/// Accumulated error of a reconstruction (f64 sums; non-finite inputs are skipped).
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrorStats {
    /// Σ x².
    pub signal: f64,
    /// Σ (x - x̂)².
    pub noise: f64,
    /// Σ |x - x̂|.
    pub abs_sum: f64,
    /// max |x - x̂|.
    pub max_abs: f64,
    /// Values compared.
    pub count: u64,
}

impl ErrorStats {
    /// Statistics of `approx` against `exact` (same length).
    pub fn between(exact: &[f32], approx: &[f32]) -> ErrorStats {
        let mut s = ErrorStats::default();
        for (&x, &y) in exact.iter().zip(approx) {
            if !x.is_finite() {
                continue;
            }
            let (x, y) = (f64::from(x), f64::from(y));
            let d = (x - y).abs();
            s.signal += x * x;
            s.noise += d * d;
            s.abs_sum += d;
            s.max_abs = s.max_abs.max(if d.is_nan() { f64::INFINITY } else { d });
            s.count += 1;
        }
        s
    }

    /// Combines two accumulations.
    pub fn merge(self, o: ErrorStats) -> ErrorStats {
        ErrorStats {
            signal: self.signal + o.signal,
            noise: self.noise + o.noise,
            abs_sum: self.abs_sum + o.abs_sum,
            max_abs: self.max_abs.max(o.max_abs),
            count: self.count + o.count,
        }
    }

    /// Signal-to-quantization-noise ratio in dB (∞ when exact).
    pub fn sqnr_db(&self) -> f64 {
        if self.noise == 0.0 {
            f64::INFINITY
        } else {
            10.0 * (self.signal / self.noise).log10()
        }
    }

    /// Relative Frobenius error ‖x - x̂‖ / ‖x‖.
    pub fn rel_fro(&self) -> f64 {
        if self.signal == 0.0 {
            if self.noise == 0.0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (self.noise / self.signal).sqrt()
        }
    }

    /// Mean absolute error.
    pub fn mean_abs(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.abs_sum / self.count as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqnr_of_known_noise() {
        let s = ErrorStats::between(&[1.0, -1.0, f32::NAN], &[1.1, -0.9, 0.0]);
        assert_eq!(s.count, 2);
        assert!((s.sqnr_db() - 20.0).abs() < 1e-4, "{}", s.sqnr_db());
        assert!((s.max_abs - 0.1).abs() < 1e-6);
        assert_eq!(ErrorStats::between(&[2.0], &[2.0]).sqnr_db(), f64::INFINITY);
    }
}
