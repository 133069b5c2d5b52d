//! Shared pieces of the fuzz targets: building a quantizer of any registered format from
//! fuzzer bytes (no format is named: the registry is walked), and exercising whatever a
//! target managed to build, asserting the properties every format promises.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arbitrary::Arbitrary;
use quantfmt::{
    Buffer, DType, Direction, GroupedStorage, Quantizer, Shape, Storage, Usage, registry,
};

/// A quantizer chosen by the fuzzer: registry entry, a subset of its spec options (value
/// placeholders such as `eps=X` / `seed=N` filled from `values`) and a usage.
#[derive(Arbitrary, Debug, Clone)]
pub struct Recipe {
    /// Index into the registry (modulo its length).
    pub format: u8,
    /// Bit i selects the entry's option i.
    pub options: u16,
    /// Values for `NAME=X` style options.
    pub values: [u64; 2],
    /// 0 rowwise, 1 columnwise, 2 both.
    pub usage: u8,
}

impl Recipe {
    /// The spec string this recipe stands for, and its usage.
    pub fn spec(&self) -> (String, Usage) {
        let entries = registry().entries();
        let e = &entries[self.format as usize % entries.len()];
        let mut opts = Vec::new();
        let mut vi = 0;
        for (i, o) in e.options.iter().enumerate().take(16) {
            if self.options & (1 << i) == 0 {
                continue;
            }
            match o.name.split_once('=') {
                Some((k, v)) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_uppercase()) => {
                    let raw = self.values[vi % 2];
                    vi += 1;
                    let val = if v == "X" {
                        // A float: mostly small ones, sometimes any bit pattern.
                        let f = if raw & 1 == 0 {
                            (raw >> 8) as u16 as f32 / 256.0
                        } else {
                            f32::from_bits((raw >> 32) as u32)
                        };
                        f.to_string()
                    } else {
                        raw.to_string()
                    };
                    opts.push(format!("{k}={val}"));
                }
                _ => opts.push(o.name.to_string()),
            }
        }
        let usage = match self.usage % 3 {
            0 => Usage::ROWWISE,
            1 => Usage::COLUMNWISE,
            _ => Usage::BOTH,
        };
        let spec = if opts.is_empty() {
            e.name.to_string()
        } else {
            format!("{}:{}", e.name, opts.join(","))
        };
        (spec, usage)
    }

    /// The quantizer, or `None` when the registry refuses the combination (an error,
    /// which is fine: refusing is not a bug, panicking is).
    pub fn quantizer(&self) -> Option<Box<dyn Quantizer>> {
        let (spec, usage) = self.spec();
        registry().parse_spec(&spec, usage).ok()
    }
}

/// A shape from fuzzer words: rank 1..=3, dimensions biased towards multiples of 16 and
/// 32 (the block sizes), at most `max_numel` elements.
pub fn shape_from(dims: &[u16], max_numel: usize) -> Option<Shape> {
    let rank = dims.len().clamp(1, 3);
    let mut v = Vec::with_capacity(rank);
    for i in 0..rank {
        let d = dims.get(i).copied().unwrap_or(1);
        let n = match d >> 14 {
            0 => (d & 0x1FF) as usize,
            1 => ((d & 0xF) as usize + 1) * 16,
            2 => ((d & 0xF) as usize + 1) * 32,
            _ => ((d & 0x3) as usize + 1) * 128,
        };
        v.push(n);
    }
    let numel = v.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    if numel > max_numel {
        return None;
    }
    Shape::new(&v).ok()
}

/// The float dtype a byte picks.
pub fn dtype_from(b: u8) -> DType {
    match b % 3 {
        0 => DType::F32,
        1 => DType::BF16,
        _ => DType::F16,
    }
}

/// Copies of a storage's buffers (what a file round trip hands back).
pub fn copies(bufs: &[Buffer]) -> Vec<Buffer> {
    bufs.iter()
        .map(|b| Buffer::from_bytes(b.desc().clone(), b.bytes()).unwrap())
        .collect()
}

/// Exercises a storage that was accepted: every stored direction dequantizes (to every
/// output dtype), flatten -> unflatten through the registry is accepted and identical,
/// usage changes and row slices either work or refuse, never panic.
pub fn exercise(s: &dyn Storage) {
    for dir in [Direction::Rowwise, Direction::Columnwise] {
        if !s.usage().has(dir) {
            assert!(s.dequantize(dir, DType::F32).is_err());
            continue;
        }
        for out in [DType::F32, DType::BF16, DType::F16] {
            let y = s.dequantize(dir, out).unwrap();
            assert_eq!(y.shape(), s.shape());
        }
    }
    let q = s.quantizer();
    let back = registry()
        .unflatten(
            s.format_name(),
            &q.options().unwrap(),
            s.shape(),
            s.dtype(),
            copies(s.buffers()),
        )
        .unwrap_or_else(|e| panic!("{}: own buffers refused on reload: {e}", q.spec()));
    for (a, b) in s.buffers().iter().zip(back.buffers()) {
        assert_eq!(a.desc(), b.desc());
        assert!(a.bytes() == b.bytes());
    }
    for u in [Usage::ROWWISE, Usage::COLUMNWISE, Usage::BOTH] {
        let mut t = s.clone_box();
        if t.update_usage(u).is_ok() {
            assert_eq!(t.usage(), u);
            if let Some(dir) = u.preferred() {
                t.dequantize(dir, DType::F32).unwrap();
            }
        }
    }
    let rows = s.shape().dims()[0];
    for r in [0..rows, 0..rows / 2, rows / 2..rows, 0..1] {
        if let Ok(t) = s.slice_dim0(r) {
            let _ = t.dequantize_f32().unwrap();
        }
    }
}

/// Exercises a grouped storage: every member is a storage that passes [`exercise`].
pub fn exercise_grouped(g: &dyn GroupedStorage) {
    for i in 0..g.num_members() {
        let m = g.member(i).unwrap();
        if !m.shape().is_empty() {
            exercise(&*m);
        }
    }
    assert!(g.member(g.num_members()).is_err());
}
