//! The device handle: a CUDA context and stream, and the per-context kernel cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, sys};
use cudarc::nvrtc::Ptx;

use super::nvrtc;
use super::source::KernelSource;
use crate::error::{Error, Result};

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Cuda(format!("driver: {e}"))
    }
}

/// Whether the CUDA driver library (`libcuda.so`) can be loaded.
pub fn driver_available() -> bool {
    // SAFETY: only tries `dlopen` on the candidate names; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// Runs a driver call that may panic inside cudarc's dynamic loader (a symbol missing from
/// an old driver) and turns the panic into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T> + std::panic::UnwindSafe) -> Result<T> {
    match std::panic::catch_unwind(f) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(Error::Cuda(format!(
                "{what}: the CUDA driver library is unusable ({msg})"
            )))
        }
    }
}

/// The number of CUDA devices, or an error saying why there are none usable (no driver
/// library, driver initialisation failed, no device).
///
/// ```
/// # #[cfg(feature = "cuda")] {
/// match quant_core::cuda::device_count() {
///     Ok(n) => println!("{n} CUDA device(s)"),
///     Err(why) => println!("no GPU: {why}"),
/// }
/// # }
/// ```
pub fn device_count() -> Result<usize> {
    if !driver_available() {
        return Err(Error::Cuda(
            "the CUDA driver library (libcuda.so) was not found: no NVIDIA driver on this machine"
                .to_string(),
        ));
    }
    let n = guarded("counting devices", || {
        cudarc::driver::result::init()?;
        Ok(CudaContext::device_count()?)
    })?;
    let n = usize::try_from(n).unwrap_or(0);
    if n == 0 {
        return Err(Error::Cuda("the CUDA driver found no device".to_string()));
    }
    Ok(n)
}

type ModuleKey = (u64, String);

/// One CUDA device: its primary context, the stream every quantfmt operation runs on, and a
/// cache of compiled kernels keyed by (source hash, NVRTC options), so each kernel source is
/// compiled once per context and architecture.
///
/// Operations on one `CudaDevice` are issued on one stream, in order; results are read back
/// with synchronous copies ([`CudaDevice::dtoh`]), which wait for the work before them.
#[derive(Debug)]
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    cc: (i32, i32),
    name: String,
    sm_count: u32,
    modules: Mutex<HashMap<ModuleKey, Arc<CudaModule>>>,
    functions: Mutex<HashMap<(ModuleKey, String), CudaFunction>>,
}

impl CudaDevice {
    /// Opens device `ordinal` (its primary context and a new stream). Fails with
    /// [`Error::Cuda`], never panics, when there is no driver or no such device.
    pub fn new(ordinal: usize) -> Result<Arc<CudaDevice>> {
        let n = device_count()?;
        if ordinal >= n {
            return Err(Error::invalid(
                "device ordinal",
                ordinal,
                format!("this machine has {n} CUDA device(s)"),
            ));
        }
        guarded("opening the device", move || {
            let ctx = CudaContext::new(ordinal)?;
            let stream = ctx.new_stream()?;
            let cc = ctx.compute_capability()?;
            let name = ctx.name()?;
            let sm = ctx.attribute(
                sys::CUdevice_attribute_enum::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?;
            Ok(Arc::new(CudaDevice {
                ordinal,
                ctx,
                stream,
                cc,
                name,
                sm_count: u32::try_from(sm).unwrap_or(1).max(1),
                modules: Mutex::new(HashMap::new()),
                functions: Mutex::new(HashMap::new()),
            }))
        })
    }

    /// A process-wide shared handle to device `ordinal` (opened on first use), so every
    /// caller shares one kernel cache.
    pub fn shared(ordinal: usize) -> Result<Arc<CudaDevice>> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
        let map = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
        let mut map = map
            .lock()
            .map_err(|_| Error::Cuda("device registry poisoned".to_string()))?;
        if let Some(d) = map.get(&ordinal) {
            return Ok(Arc::clone(d));
        }
        let d = CudaDevice::new(ordinal)?;
        map.insert(ordinal, Arc::clone(&d));
        Ok(d)
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// Number of streaming multiprocessors (sizes persistent grids).
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The exact architecture kernels are compiled for, `sm_{major}{minor}` (a cubin for
    /// this device only; no PTX is handed to the driver).
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.cc.0, self.cc.1)
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream all work of this handle is issued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for all work issued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    /// The compiled module of `src` for this device (compiled by NVRTC on first use, then
    /// cached per context under the source hash and options).
    pub fn module(&self, src: &KernelSource) -> Result<Arc<CudaModule>> {
        let arch = self.arch();
        let key: ModuleKey = (src.content_hash(), nvrtc::options_for(&arch).join(" "));
        let mut mods = self
            .modules
            .lock()
            .map_err(|_| Error::Cuda("kernel cache poisoned".to_string()))?;
        if let Some(m) = mods.get(&key) {
            return Ok(Arc::clone(m));
        }
        let compiled = nvrtc::compile(src, &arch)?;
        let ctx = Arc::clone(&self.ctx);
        let module = guarded("loading a module", move || {
            Ok(ctx.load_module(Ptx::from_binary(compiled.image))?)
        })?;
        mods.insert(key, Arc::clone(&module));
        Ok(module)
    }

    /// Entry point `name` of `src` (which must list it), compiled and loaded on first use.
    pub fn function(&self, src: &KernelSource, name: &str) -> Result<CudaFunction> {
        if !src.entry_points.contains(&name) {
            return Err(Error::invalid(
                "kernel",
                name,
                format!("is not an entry point of {}", src.name),
            ));
        }
        let arch = self.arch();
        let key = (
            (src.content_hash(), nvrtc::options_for(&arch).join(" ")),
            name.to_string(),
        );
        {
            let f = self
                .functions
                .lock()
                .map_err(|_| Error::Cuda("kernel cache poisoned".to_string()))?;
            if let Some(func) = f.get(&key) {
                return Ok(func.clone());
            }
        }
        let module = self.module(src)?;
        let func = module.load_function(name)?;
        self.functions
            .lock()
            .map_err(|_| Error::Cuda("kernel cache poisoned".to_string()))?
            .insert(key, func.clone());
        Ok(func)
    }

    /// `n` zero bytes of device memory (`n > 0`).
    pub fn alloc_zeros(&self, n: usize) -> Result<CudaSlice<u8>> {
        if n == 0 {
            return Err(Error::invalid(
                "device allocation",
                0,
                "must be at least one byte",
            ));
        }
        Ok(self.stream.alloc_zeros::<u8>(n)?)
    }

    /// A device copy of `bytes` (non-empty).
    pub fn htod(&self, bytes: &[u8]) -> Result<CudaSlice<u8>> {
        if bytes.is_empty() {
            return Err(Error::invalid("host bytes", 0, "must not be empty"));
        }
        Ok(self.stream.clone_htod(bytes)?)
    }

    /// Copies `bytes` into `dst`, whose length must equal `bytes.len()`.
    pub fn htod_into(&self, bytes: &[u8], dst: &mut CudaSlice<u8>) -> Result<()> {
        if dst.len() != bytes.len() {
            return Err(Error::invalid(
                "host-to-device copy",
                bytes.len(),
                format!("must fill the {}-byte destination exactly", dst.len()),
            ));
        }
        Ok(self.stream.memcpy_htod(bytes, dst)?)
    }

    /// The bytes of `src` on the host (waits for the work queued before it).
    pub fn dtoh(&self, src: &CudaSlice<u8>) -> Result<Vec<u8>> {
        let v = self.stream.clone_dtoh(src)?;
        self.stream.synchronize()?;
        Ok(v)
    }

    /// Copies `src` into `dst` on the device (equal lengths).
    pub fn dtod(&self, src: &CudaSlice<u8>, dst: &mut CudaSlice<u8>) -> Result<()> {
        if dst.len() != src.len() {
            return Err(Error::invalid(
                "device-to-device copy",
                src.len(),
                format!("must fill the {}-byte destination exactly", dst.len()),
            ));
        }
        Ok(self.stream.memcpy_dtod(src, dst)?)
    }
}
