//! Agreeing on scales across ranks: the amax-reduction hook.
//!
//! Recipes with a tensor-wide amax (FP8 per-tensor current scaling, NVFP4's global amax)
//! give different bytes on each shard of a sharded tensor unless the ranks agree on the
//! amax first. TransformerEngine all-reduces it (MAX) over `amax_reduction_group`; here
//! the same step is the small [`AmaxReducer`] trait. [`InProcessGroup`] implements it for
//! threads (tests, single-process sharding); the CUDA build adds an NCCL implementation.

use std::sync::{Arc, Barrier, Mutex};

use crate::error::{Error, Result};

/// Reduces per-rank amaxes to their maximum across a group of ranks.
pub trait AmaxReducer: Send + Sync {
    /// Replaces each element of `values` with its maximum over all ranks (NaN ignored,
    /// as CUDA `fmaxf` does). Every rank must call this with the same length.
    fn all_reduce_max(&self, values: &mut [f32]) -> Result<()>;
    /// Number of ranks in the group.
    fn world_size(&self) -> usize;
}

/// A single rank: reduction is the identity.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoReduction;

impl AmaxReducer for NoReduction {
    fn all_reduce_max(&self, _values: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn world_size(&self) -> usize {
        1
    }
}

#[derive(Debug)]
struct Shared {
    barrier: Barrier,
    acc: Mutex<Vec<f32>>,
}

/// An in-process group of `n` ranks (threads) that reduce amaxes through shared memory.
///
/// ```
/// use quant_core::parallel::{AmaxReducer, InProcessGroup};
/// let ranks = InProcessGroup::new(3).unwrap();
/// let out: Vec<f32> = std::thread::scope(|s| {
///     let hs: Vec<_> = ranks.iter().enumerate().map(|(i, r)| s.spawn(move || {
///         let mut v = [i as f32];
///         r.all_reduce_max(&mut v).unwrap();
///         v[0]
///     })).collect();
///     hs.into_iter().map(|h| h.join().unwrap()).collect()
/// });
/// assert_eq!(out, vec![2.0, 2.0, 2.0]);
/// ```
#[derive(Clone, Debug)]
pub struct InProcessGroup {
    shared: Arc<Shared>,
    size: usize,
}

impl InProcessGroup {
    /// `n` rank handles sharing one group; give one to each thread.
    pub fn new(n: usize) -> Result<Vec<InProcessGroup>> {
        if n == 0 {
            return Err(Error::invalid(
                "ranks",
                0,
                "a group needs at least one rank",
            ));
        }
        let shared = Arc::new(Shared {
            barrier: Barrier::new(n),
            acc: Mutex::new(Vec::new()),
        });
        Ok((0..n)
            .map(|_| InProcessGroup {
                shared: Arc::clone(&shared),
                size: n,
            })
            .collect())
    }
}

impl AmaxReducer for InProcessGroup {
    fn all_reduce_max(&self, values: &mut [f32]) -> Result<()> {
        let poisoned = || {
            Error::invalid(
                "amax reduction",
                "poisoned",
                "a rank panicked during the reduction",
            )
        };
        // Phase 1: everyone folds its values in; the first to arrive sizes the buffer.
        let leader = self.shared.barrier.wait().is_leader();
        if leader {
            let mut acc = self.shared.acc.lock().map_err(|_| poisoned())?;
            acc.clear();
            acc.resize(values.len(), 0.0);
        }
        self.shared.barrier.wait();
        {
            let mut acc = self.shared.acc.lock().map_err(|_| poisoned())?;
            if acc.len() != values.len() {
                return Err(Error::invalid(
                    "amax reduction",
                    values.len(),
                    format!(
                        "every rank must reduce the same number of values ({})",
                        acc.len()
                    ),
                ));
            }
            for (a, &v) in acc.iter_mut().zip(values.iter()) {
                if v > *a {
                    *a = v;
                }
            }
        }
        // Phase 2: everyone reads the result.
        self.shared.barrier.wait();
        {
            let acc = self.shared.acc.lock().map_err(|_| poisoned())?;
            values.copy_from_slice(&acc);
        }
        self.shared.barrier.wait();
        Ok(())
    }

    fn world_size(&self) -> usize {
        self.size
    }
}
