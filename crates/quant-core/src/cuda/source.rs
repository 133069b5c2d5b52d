//! Kernel sources: the `.cu` files embedded in the crates, and the shared headers of the
//! top-level `kernels/` directory that NVRTC sees as named headers.

/// A shared header: what `#include "<name>"` resolves to inside a kernel source.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    /// The include name, e.g. `quantfmt_codecs.cuh`.
    pub name: &'static str,
    /// The header text.
    pub source: &'static str,
}

/// The shared headers (`kernels/*.cuh`), handed to every NVRTC program as named headers:
/// NVRTC's include search (`-I`) cannot see strings embedded in a binary, so each header is
/// passed with the name the sources include it by.
pub const HEADERS: &[Header] = &[
    Header {
        name: "quantfmt_common.cuh",
        source: include_str!("../../../../kernels/quantfmt_common.cuh"),
    },
    Header {
        name: "quantfmt_codecs.cuh",
        source: include_str!("../../../../kernels/quantfmt_codecs.cuh"),
    },
    Header {
        name: "quantfmt_layout.cuh",
        source: include_str!("../../../../kernels/quantfmt_layout.cuh"),
    },
];

/// One `.cu` translation unit, embedded with `include_str!`, and the `extern "C"` entry
/// points it defines (checked to exist after every compile test and module load).
///
/// ```
/// # #[cfg(feature = "cuda")] {
/// let k = &quant_core::cuda::CORE_KERNELS;
/// assert!(k.entry_points.contains(&"qf_amax_bf16"));
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// A name for logs and errors, e.g. `fmt-fp8/kernels/fp8.cu`.
    pub name: &'static str,
    /// The source text.
    pub source: &'static str,
    /// Every `extern "C" __global__` function the source defines.
    pub entry_points: &'static [&'static str],
}

impl KernelSource {
    /// A stable 64-bit FNV-1a hash of the source and every shared header: the compile
    /// cache key (with the options), so an edited kernel never hits a stale module.
    pub fn content_hash(&self) -> u64 {
        let mut h = Fnv::new();
        h.write(self.name.as_bytes());
        h.write(self.source.as_bytes());
        for hd in HEADERS {
            h.write(hd.name.as_bytes());
            h.write(hd.source.as_bytes());
        }
        h.finish()
    }
}

/// The kernels of quant-core itself (NaN-ignoring amax reductions), used by the formats.
pub const CORE_KERNELS: KernelSource = KernelSource {
    name: "quant-core/kernels/core.cu",
    source: include_str!("../../kernels/core.cu"),
    entry_points: &[
        "qf_amax_f32",
        "qf_amax_bf16",
        "qf_amax_f16",
        "qf_row_amax_f32",
        "qf_row_amax_bf16",
        "qf_row_amax_f16",
        "qf_col_amax_f32",
        "qf_col_amax_bf16",
        "qf_col_amax_f16",
    ],
};

/// Self-test kernels: the shared header's conversions over given inputs, for GPU tests that
/// compare them value by value with `quant_core::codec` and `half`.
pub const SELFTEST_KERNELS: KernelSource = KernelSource {
    name: "quant-core/kernels/selftest.cu",
    source: include_str!("../../kernels/selftest.cu"),
    entry_points: &[
        "qf_selftest_encode",
        "qf_selftest_decode",
        "qf_selftest_convert",
        "qf_selftest_swizzle",
    ],
};

struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01B3);
        }
        // Separator, so ("ab", "c") and ("a", "bc") differ.
        self.0 ^= 0xFF;
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01B3);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_sees_sources() {
        let a = KernelSource {
            name: "a",
            source: "x",
            entry_points: &[],
        };
        let b = KernelSource { source: "y", ..a };
        assert_ne!(a.content_hash(), b.content_hash());
        assert_eq!(a.content_hash(), a.content_hash());
    }

    #[test]
    fn sources_include_only_known_headers() {
        for src in [CORE_KERNELS.source, SELFTEST_KERNELS.source]
            .into_iter()
            .chain(HEADERS.iter().map(|h| h.source))
        {
            for line in src.lines() {
                if let Some(rest) = line.trim().strip_prefix("#include") {
                    let name = rest.trim().trim_matches('"');
                    assert!(
                        HEADERS.iter().any(|h| h.name == name),
                        "unknown include {name}"
                    );
                }
            }
        }
    }
}
