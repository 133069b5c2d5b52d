//! An NCCL-backed [`AmaxReducer`] (feature `nccl`): multi-GPU jobs agree on the tensor-wide
//! amax, so every rank computes the scale the whole tensor would get.
//!
//! NCCL is loaded dynamically like the driver: a build with this feature needs no NCCL, and
//! constructing a reducer without `libnccl.so` fails with [`Error::Cuda`].

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;
use cudarc::nccl::{Comm, Id, ReduceOp};

use super::device::CudaDevice;
use crate::error::{Error, Result};
use crate::parallel::AmaxReducer;

/// Whether the NCCL library (`libnccl.so`) can be loaded.
pub fn nccl_available() -> bool {
    // SAFETY: only tries `dlopen` on the candidate names; no symbol is called.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

fn require_nccl() -> Result<()> {
    if nccl_available() {
        Ok(())
    } else {
        Err(Error::Cuda(
            "the NCCL library (libnccl.so) was not found on the library path".to_string(),
        ))
    }
}

fn nccl_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Cuda(format!("NCCL {what}: {e:?}"))
}

/// A rank of an NCCL communicator that all-reduces amaxes with `ncclMax`.
///
/// [`AmaxReducer::all_reduce_max`] takes host values (the trait is device-agnostic), so each
/// call stages them through a small device buffer: copy in, all-reduce on the device's
/// stream, copy out. Calls are serialised by a mutex (an NCCL communicator must not be used
/// from two threads at once).
pub struct NcclAmaxReducer {
    device: Arc<CudaDevice>,
    comm: Mutex<Comm>,
    world_size: usize,
}

// SAFETY: the communicator is only touched under the mutex, so it is never used from two
// threads at once; NCCL allows a communicator to be used from any thread under that rule.
unsafe impl Send for NcclAmaxReducer {}
// SAFETY: as above: every access to the communicator goes through the mutex.
unsafe impl Sync for NcclAmaxReducer {}

impl std::fmt::Debug for NcclAmaxReducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclAmaxReducer")
            .field("device", &self.device.ordinal())
            .field("world_size", &self.world_size)
            .finish()
    }
}

/// A fresh NCCL unique id (on rank 0; send its 128 bytes to the other ranks).
pub fn new_unique_id() -> Result<[u8; 128]> {
    require_nccl()?;
    let id = Id::new().map_err(|e| nccl_err("unique id", e))?;
    Ok(id.internal().map(|c| c.to_ne_bytes()[0]))
}

impl NcclAmaxReducer {
    /// Rank `rank` of `world_size` ranks that share the unique id `id` (from
    /// [`new_unique_id`] on one rank, distributed by the caller). Blocks until every rank
    /// has joined.
    pub fn from_rank(
        device: &Arc<CudaDevice>,
        rank: usize,
        world_size: usize,
        id: [u8; 128],
    ) -> Result<NcclAmaxReducer> {
        require_nccl()?;
        if world_size == 0 || rank >= world_size || i32::try_from(world_size).is_err() {
            return Err(Error::invalid(
                "rank",
                format!("{rank} of {world_size}"),
                "needs 0 <= rank < world_size <= i32::MAX",
            ));
        }
        let id = Id::uninit(id.map(|b| std::ffi::c_char::from_ne_bytes([b])));
        let comm = Comm::from_rank(Arc::clone(device.stream()), rank, world_size, id)
            .map_err(|e| nccl_err("communicator init", e))?;
        Ok(NcclAmaxReducer {
            device: Arc::clone(device),
            comm: Mutex::new(comm),
            world_size,
        })
    }

    /// A single-rank communicator on `device` (reduction is the identity; used to check the
    /// NCCL path on one GPU).
    pub fn single(device: &Arc<CudaDevice>) -> Result<NcclAmaxReducer> {
        require_nccl()?;
        let mut comms = Comm::from_devices(vec![Arc::clone(device.stream())])
            .map_err(|e| nccl_err("communicator init", e))?;
        let comm = comms
            .pop()
            .ok_or_else(|| Error::Cuda("NCCL returned no communicator".to_string()))?;
        Ok(NcclAmaxReducer {
            device: Arc::clone(device),
            comm: Mutex::new(comm),
            world_size: 1,
        })
    }
}

impl AmaxReducer for NcclAmaxReducer {
    fn all_reduce_max(&self, values: &mut [f32]) -> Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        let comm = self
            .comm
            .lock()
            .map_err(|_| Error::Cuda("NCCL communicator poisoned".to_string()))?;
        let stream = self.device.stream();
        let mut buf: CudaSlice<f32> = stream.clone_htod(values)?;
        comm.all_reduce_in_place(&mut buf, &ReduceOp::Max)
            .map_err(|e| nccl_err("all-reduce", e))?;
        stream.memcpy_dtoh(&buf, values)?;
        stream.synchronize()?;
        Ok(())
    }

    fn world_size(&self) -> usize {
        self.world_size
    }
}
