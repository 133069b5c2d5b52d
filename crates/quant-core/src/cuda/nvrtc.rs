//! Run-time compilation with NVRTC (loaded dynamically: a missing library is an error, never
//! a panic).
//!
//! Kernels are compiled to a **cubin for the device's exact `sm_XY`** (never to PTX that the
//! driver would JIT), so the PTX ISA version of the NVRTC in use can never be newer than the
//! driver understands. The options pin IEEE arithmetic: `--fmad=false` (no contraction of
//! `a*b+c` into an fma: Rust never contracts, and a contracted expression rounds once instead
//! of twice), `--ftz=false` (subnormals kept), `--prec-div=true`, `--prec-sqrt=true`.

use std::ffi::{CStr, CString, c_char, c_int};

use cudarc::nvrtc::sys;

use super::source::{HEADERS, KernelSource};
use crate::error::{Error, Result};

/// The options every kernel is compiled with, besides `--gpu-architecture`.
pub const BASE_OPTIONS: &[&str] = &[
    "--fmad=false",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--std=c++17",
];

/// The architectures CI compiles every kernel for (Ampere, Ada, Hopper, Blackwell).
pub const CI_ARCHS: &[&str] = &["sm_80", "sm_89", "sm_90a", "sm_100a"];

/// Whether the NVRTC library can be loaded (`libnvrtc.so*` on the library path).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries `dlopen` on the candidate names; no symbol is called.
    unsafe { sys::is_culib_present() }
}

fn require_nvrtc() -> Result<()> {
    if nvrtc_available() {
        Ok(())
    } else {
        Err(Error::Cuda(
            "the NVRTC library (libnvrtc.so) was not found on the library path; install the CUDA \
             toolkit or `pip install nvidia-cuda-nvrtc` and add its lib directory to LD_LIBRARY_PATH"
                .to_string(),
        ))
    }
}

/// The NVRTC version `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    require_nvrtc()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both pointers are valid for writes for the duration of the call.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    check(r, "nvrtcVersion")?;
    Ok((major, minor))
}

/// What a compile produced.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The `--gpu-architecture` it was compiled for (`sm_90`, `sm_100a`, `compute_90`).
    pub arch: String,
    /// A cubin (ELF) for `sm_*` architectures, NUL-free PTX text for `compute_*` ones.
    pub image: Vec<u8>,
    /// Whether `image` is a cubin.
    pub is_cubin: bool,
    /// The compiler log (warnings), possibly empty.
    pub log: String,
}

/// The full option list for `arch`.
pub fn options_for(arch: &str) -> Vec<String> {
    let mut v = vec![format!("--gpu-architecture={arch}")];
    v.extend(BASE_OPTIONS.iter().map(|s| s.to_string()));
    v
}

/// Compiles `src` (with the shared headers) for `arch`: a cubin for `sm_XY[a]`, PTX for
/// `compute_XY[a]`. A compile error is an [`Error::Cuda`] carrying the NVRTC log.
pub fn compile(src: &KernelSource, arch: &str) -> Result<Compiled> {
    require_nvrtc()?;
    let is_cubin = arch.starts_with("sm_");
    if !is_cubin && !arch.starts_with("compute_") {
        return Err(Error::invalid(
            "arch",
            arch,
            "must be sm_XY (cubin) or compute_XY (PTX), e.g. sm_90a",
        ));
    }
    let cstr = |s: &str, what: &str| {
        CString::new(s).map_err(|_| Error::invalid(what, s.len(), "must not contain NUL bytes"))
    };
    let source = cstr(src.source, "kernel source")?;
    let name = cstr(src.name, "kernel name")?;
    let header_src: Vec<CString> = HEADERS
        .iter()
        .map(|h| cstr(h.source, "header"))
        .collect::<Result<_>>()?;
    let header_names: Vec<CString> = HEADERS
        .iter()
        .map(|h| cstr(h.name, "header name"))
        .collect::<Result<_>>()?;
    let header_src_ptrs: Vec<*const c_char> = header_src.iter().map(|c| c.as_ptr()).collect();
    let header_name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
    let n_headers = c_int::try_from(HEADERS.len())
        .map_err(|_| Error::invalid("headers", HEADERS.len(), "too many"))?;

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer refers to a NUL-terminated string owned by a local that outlives
    // the call; the two header arrays have `n_headers` entries each.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            source.as_ptr(),
            name.as_ptr(),
            n_headers,
            header_src_ptrs.as_ptr(),
            header_name_ptrs.as_ptr(),
        )
    };
    check(r, "nvrtcCreateProgram")?;
    let prog = Program(prog);

    let opts: Vec<CString> = options_for(arch)
        .iter()
        .map(|o| cstr(o, "option"))
        .collect::<Result<_>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();
    let n_opts =
        c_int::try_from(opt_ptrs.len()).map_err(|_| Error::invalid("options", 0, "too many"))?;
    // SAFETY: `prog.0` is a live program; the option array has `n_opts` valid C strings.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, n_opts, opt_ptrs.as_ptr()) };
    let log = program_log(prog.0);
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Cuda(format!(
            "NVRTC could not compile {} for {arch} ({}); options {:?}; log:\n{log}",
            src.name,
            error_string(r),
            options_for(arch)
        )));
    }
    let image = if is_cubin {
        let mut size = 0usize;
        // SAFETY: live program, valid out pointer.
        let r = unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) };
        check(r, "nvrtcGetCUBINSize")?;
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` has the `size` bytes NVRTC reported.
        let r = unsafe { sys::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr().cast::<c_char>()) };
        check(r, "nvrtcGetCUBIN")?;
        buf
    } else {
        let mut size = 0usize;
        // SAFETY: live program, valid out pointer.
        let r = unsafe { sys::nvrtcGetPTXSize(prog.0, &mut size) };
        check(r, "nvrtcGetPTXSize")?;
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` has the `size` bytes NVRTC reported (NUL included).
        let r = unsafe { sys::nvrtcGetPTX(prog.0, buf.as_mut_ptr().cast::<c_char>()) };
        check(r, "nvrtcGetPTX")?;
        while buf.last() == Some(&0) {
            buf.pop();
        }
        buf
    };
    if image.is_empty() {
        return Err(Error::Cuda(format!(
            "NVRTC produced an empty image for {} ({arch})",
            src.name
        )));
    }
    Ok(Compiled {
        arch: arch.to_string(),
        image,
        is_cubin,
        log,
    })
}

/// Destroys the program on every exit path (errors ignored: nothing useful can be done).
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from a successful nvrtcCreateProgram and is destroyed once.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

fn program_log(prog: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: live program, valid out pointer.
    if unsafe { sys::nvrtcGetProgramLogSize(prog, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS
        || size == 0
    {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` has the `size` bytes NVRTC reported.
    if unsafe { sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast::<c_char>()) }
        != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return String::new();
    }
    while buf.last() == Some(&0) {
        buf.pop();
    }
    String::from_utf8_lossy(&buf).into_owned()
}

fn error_string(r: sys::nvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString returns a pointer to a static NUL-terminated string (or null).
    let p = unsafe { sys::nvrtcGetErrorString(r) };
    if p.is_null() {
        return format!("{r:?}");
    }
    // SAFETY: non-null pointer to a static C string, per the NVRTC documentation.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn check(r: sys::nvrtcResult, what: &str) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(format!("{what} failed: {}", error_string(r))))
    }
}

/// Whether `name` appears as a whole symbol in a compiled image: in a cubin's string table
/// (`\0name\0` or `.text.name\0`) or in PTX (`.entry name(`). A cheap check that an entry
/// point a source promises really exists.
pub fn image_has_symbol(image: &[u8], name: &str) -> bool {
    let n = name.as_bytes();
    if n.is_empty() || image.len() < n.len() + 2 {
        return false;
    }
    image.windows(n.len() + 2).any(|w| {
        matches!(w[0], 0 | b'.' | b' ')
            && &w[1..=n.len()] == n
            && matches!(w[n.len() + 1], 0 | b'(')
    })
}
