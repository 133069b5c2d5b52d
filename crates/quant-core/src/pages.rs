//! Zeroed host allocations, large ones on transparent huge pages.
//!
//! **Why.** A columnwise operand is stored transposed: one task of a columnwise
//! quantize or dequantize touches 128 to 512 bytes of each of thousands of stored rows,
//! each row a page or more from the next (8 KiB apart at 8192 columns of FP8). With
//! 4 KiB pages every such run is on a page of its own, and the walk needs a translation
//! for each: more pages than the first-level TLB holds, so the runs' loads and
//! streaming stores wait on page walks. A 2 MiB page holds 256 of those rows.
//!
//! Linux gives an anonymous mapping huge pages when the system's transparent-huge-page
//! mode is `always`, or when it is `madvise` (the common default) and the mapping is
//! advised `MADV_HUGEPAGE`. [`PageBuf::zeroed`] maps allocations of at least
//! [`HUGE_MIN`] bytes anonymously (zero-filled pages, untouched until written, as a
//! `calloc` of that size would be) and gives that advice through `memmap2`'s safe
//! [`advise`](memmap2::MmapMut::advise). Smaller allocations, other systems, a refused
//! mapping, and runs with `QUANTFMT_HUGE_PAGES=0` use the heap. Either way the bytes are
//! the same; only the time to reach them differs.
//!
//! Measured on a 2-vCPU Zen 4 (AVX2, 8192x8192 bf16, in process; the input, the storage
//! and the output all allocated here, against the same with `QUANTFMT_HUGE_PAGES=0`; 7
//! alternating pairs, median of the time ratios): FP8 1x128 columnwise quantize x1.08 and
//! dequantize x1.09, NVFP4 columnwise dequantize x1.11 and quantize x1.03; rowwise paths
//! x0.99-1.02. The allocating quantize (`Quantizer::quantize`, a fresh storage per call)
//! gains most: its first writes fault the storage in 2 MiB at a time instead of 4 KiB
//! (x2.2-4.0 in the same runs: FP8 1x128 rowwise from bf16 80 ms -> 16 ms). Earlier
//! 3-pair trials (THP forced on for the whole VM; this advice given through `libc`) saw
//! x1.00-1.12 and no clear gain; `docs/benchmarks-history.md` has them all.

use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;

/// The smallest allocation [`PageBuf::zeroed`] maps for huge pages: two of them, so
/// that at least one whole 2 MiB page lies inside the mapping wherever it starts.
pub const HUGE_MIN: usize = 4 << 20;

/// Whether large allocations ask for huge pages: yes unless the environment variable
/// `QUANTFMT_HUGE_PAGES` is `0`, `off`, `false` or `no` (read once per process).
///
/// ```
/// // On unless the environment turned it off.
/// if std::env::var_os("QUANTFMT_HUGE_PAGES").is_none() {
///     assert!(quant_core::pages::enabled());
/// }
/// ```
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("QUANTFMT_HUGE_PAGES").map_or(true, |v| {
            !matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "0" | "off" | "false" | "no"
            )
        })
    })
}

/// One line for benchmark headers: whether large buffers are advised for huge pages,
/// and the system's mode (`/sys/kernel/mm/transparent_hugepage/enabled`, the bracketed
/// word), e.g. `huge pages: advised (thp madvise)` or `huge pages: off
/// (QUANTFMT_HUGE_PAGES=0)`.
pub fn describe() -> String {
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|s| {
            let a = s.find('[')?;
            let b = s[a..].find(']')?;
            Some(s[a + 1..a + b].to_string())
        });
    let mode = mode.map_or_else(|| "no thp".to_string(), |m| format!("thp {m}"));
    if enabled() {
        format!("huge pages: advised ({mode})")
    } else {
        format!("huge pages: off ({mode}, QUANTFMT_HUGE_PAGES=0)")
    }
}

/// Zero-filled bytes, from the heap or (large ones, where the system allows) an
/// anonymous mapping advised for transparent huge pages (module docs).
///
/// ```
/// use quant_core::pages::PageBuf;
/// let mut b = PageBuf::zeroed(8 << 20);
/// assert!(b.iter().all(|&x| x == 0));
/// b[12345] = 7;
/// assert_eq!(b.len(), 8 << 20);
/// assert_eq!(PageBuf::zeroed(100).len(), 100);
/// ```
pub struct PageBuf(Backing);

enum Backing {
    /// At least 8-byte aligned; `len` bytes of the words.
    Heap(Vec<u64>, usize),
    /// Page aligned, advised for huge pages.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Mapped(memmap2::MmapMut),
}

impl PageBuf {
    /// `len` zero bytes (module docs for where they live).
    pub fn zeroed(len: usize) -> PageBuf {
        if len >= HUGE_MIN
            && enabled()
            && let Some(m) = mapped(len)
        {
            return PageBuf(Backing::Mapped(m));
        }
        PageBuf(Backing::Heap(vec![0u64; len.div_ceil(8)], len))
    }

    /// Whether these bytes are a mapping advised for huge pages (the kernel may still
    /// back parts of it with small pages when it has no huge page free).
    pub fn is_advised(&self) -> bool {
        matches!(self.0, Backing::Mapped(_))
    }
}

/// An anonymous mapping of `len` bytes advised `MADV_HUGEPAGE`, or `None` where the
/// mapping or the advice is refused (a kernel without THP answers `EINVAL`: then the
/// heap serves as well).
#[cfg(target_os = "linux")]
fn mapped(len: usize) -> Option<memmap2::MmapMut> {
    let m = memmap2::MmapMut::map_anon(len).ok()?;
    m.advise(memmap2::Advice::HugePage).ok()?;
    Some(m)
}

/// Huge-page advice is Linux's; elsewhere every allocation is the heap's.
#[cfg(not(target_os = "linux"))]
fn mapped(_len: usize) -> Option<memmap2::MmapMut> {
    None
}

impl Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Backing::Heap(w, len) => &bytemuck::cast_slice(w)[..*len],
            Backing::Mapped(m) => m,
        }
    }
}

impl DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Backing::Heap(w, len) => &mut bytemuck::cast_slice_mut(w)[..*len],
            Backing::Mapped(m) => m,
        }
    }
}

impl std::fmt::Debug for PageBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_advised() { "mapped" } else { "heap" };
        write!(f, "PageBuf({} bytes, {kind})", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the threshold reads as zeros, writes stick, and the large ones
    /// are mapped wherever this system maps (Linux with the variable unset).
    #[test]
    fn zeroed_at_every_size_class() {
        for len in [0, 1, 7, 8, 9, 4095, HUGE_MIN - 1, HUGE_MIN, HUGE_MIN + 3] {
            let mut b = PageBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0), "len {len}");
            if len > 0 {
                b[len - 1] = 0xA5;
                b[0] ^= 1;
                assert_eq!(b[len - 1], if len == 1 { 0xA4 } else { 0xA5 });
            }
            let large = len >= HUGE_MIN;
            if cfg!(target_os = "linux") && enabled() && large {
                // A refused mapping falls back to the heap; say so rather than fail.
                if !b.is_advised() {
                    eprintln!("note: {len} bytes fell back to the heap on this system");
                }
            } else {
                assert!(!b.is_advised(), "len {len}");
            }
        }
    }

    #[test]
    fn describe_names_the_setting() {
        let d = describe();
        assert!(d.starts_with("huge pages: "), "{d}");
        assert_eq!(d.contains("advised"), enabled());
    }
}
