//! Planning a linear layer on prototypes: shapes, usages and bytes before any allocation.
//!
//! `y = x W^T (+ b)` needs different directions of each operand in each GEMM:
//!
//! | GEMM | computes | operands (TN layout) |
//! |---|---|---|
//! | forward | `y = x W^T` | `x` rowwise, `W` rowwise |
//! | dgrad | `dx = dy W` | `dy` rowwise, `W` columnwise |
//! | wgrad | `dW = dy^T x` | `dy` columnwise, `x` columnwise |
//!
//! so training keeps `x` columnwise and `W` columnwise for the backward pass. With tensor
//! parallelism a column-parallel layer shards `W` along its output dim (and, with
//! sequence parallelism, all-gathers `x` along its leading dim first); a row-parallel
//! layer shards `W` along its input dim (and, with sequence parallelism, reduce-scatters
//! `y` along its leading dim). [`plan_linear`] answers all of it from prototypes.

use crate::buffer::BufferDesc;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::proto::TensorProto;
use crate::usage::Usage;

/// Tensor-parallel placement of the layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parallelism {
    /// No tensor parallelism.
    None,
    /// `W` sharded along its output dim; the given prototypes are the local shards.
    Column {
        /// Tensor-parallel world size.
        tp: usize,
        /// Sequence parallelism: the local input holds `1/tp` of the leading dim and is
        /// all-gathered before the forward GEMM.
        sequence_parallel: bool,
    },
    /// `W` sharded along its input dim; the given prototypes are the local shards.
    Row {
        /// Tensor-parallel world size.
        tp: usize,
        /// Sequence parallelism: the output is reduce-scattered along its leading dim.
        sequence_parallel: bool,
    },
}

/// One operand: its prototype with the union of the usages it needs, and which GEMMs use
/// which direction.
#[derive(Clone, Debug)]
pub struct OperandPlan {
    /// The operand as quantized (usage = everything it must serve).
    pub proto: TensorProto,
    /// Direction used by the forward GEMM (if any).
    pub forward: Option<Usage>,
    /// Direction used by the dgrad GEMM (if any).
    pub dgrad: Option<Usage>,
    /// Direction used by the wgrad GEMM (if any).
    pub wgrad: Option<Usage>,
}

/// Everything known about a linear layer before allocation.
#[derive(Clone, Debug)]
pub struct LinearPlan {
    /// Shape of the forward GEMM's input operand (after any all-gather).
    pub gemm_input_shape: Vec<usize>,
    /// Shape of the layer output `y` on this rank (after any reduce-scatter).
    pub output_shape: Vec<usize>,
    /// dtype of `y` (the input's high-precision dtype).
    pub output_dtype: DType,
    /// The input `x` (local shard).
    pub input: OperandPlan,
    /// The weight `W` (local shard).
    pub weight: OperandPlan,
    /// The output gradient `dy`.
    pub grad_output: OperandPlan,
    /// Buffers kept from the forward pass for the backward pass: `(operand, buffer)`.
    pub saved_for_backward: Vec<(String, BufferDesc)>,
    /// Bytes of the quantized forward operands (input + weight) plus the bias.
    pub forward_bytes: usize,
    /// Bytes of `saved_for_backward`.
    pub saved_bytes: usize,
    /// Bytes of every operand at its full usage, plus the bias and the output.
    pub total_bytes: usize,
}

fn bytes_of(descs: &[BufferDesc]) -> Result<usize> {
    descs
        .iter()
        .try_fold(0usize, |a, d| Ok(a.saturating_add(d.nbytes()?)))
}

/// Plans `y = x W^T (+ bias)` for training (forward, dgrad, wgrad).
///
/// `input` is `[..., K]` (local), `weight` is `[N, K]` (local shard), `grad_output` the
/// quantizer for `dy` (TE's HYBRID recipe uses E5M2 there); usages are set by the plan.
///
/// ```
/// # #![allow(dead_code)]
/// # use quant_core::*;
/// # use quant_core::plan::*;
/// # fn demo(q: &dyn Quantizer) -> Result<()> {
/// let x = TensorProto::new(&[2048, 4, 4096], DType::BF16, q)?;
/// let w = TensorProto::new(&[11008, 4096], DType::BF16, q)?;
/// let plan = plan_linear(&x, &w, q, true, Parallelism::None)?;
/// assert_eq!(plan.output_shape, vec![2048, 4, 11008]);
/// # Ok(()) }
/// ```
pub fn plan_linear(
    input: &TensorProto,
    weight: &TensorProto,
    grad_output: &dyn crate::traits::Quantizer,
    bias: bool,
    parallel: Parallelism,
) -> Result<LinearPlan> {
    let xd = input.shape().dims();
    let wd = weight.shape().dims();
    if wd.len() != 2 {
        return Err(Error::invalid(
            "weight shape",
            weight.shape(),
            "must be [N, K] (rank 2)",
        ));
    }
    let (n, k) = (wd[0], wd[1]);
    if input.shape().cols() != k {
        return Err(Error::invalid(
            "input shape",
            input.shape(),
            format!(
                "must end in K = {k}, the weight's input dim (weight {})",
                weight.shape()
            ),
        ));
    }
    let (gather, scatter) = match parallel {
        Parallelism::None => (1, 1),
        Parallelism::Column {
            tp,
            sequence_parallel,
        } => {
            check_tp(tp)?;
            (if sequence_parallel { tp } else { 1 }, 1)
        }
        Parallelism::Row {
            tp,
            sequence_parallel,
        } => {
            check_tp(tp)?;
            (1, if sequence_parallel { tp } else { 1 })
        }
    };
    let mut gemm_in = xd.to_vec();
    gemm_in[0] = gemm_in[0]
        .checked_mul(gather)
        .ok_or_else(|| Error::invalid("input shape", input.shape(), "gathered size overflows"))?;
    let mut out = gemm_in.clone();
    *out.last_mut().unwrap_or(&mut 0) = n;
    if out.len() < 2 && scatter > 1 {
        return Err(Error::invalid(
            "input shape",
            input.shape(),
            "needs a leading dim to reduce-scatter over with sequence parallelism",
        ));
    }
    if !out[0].is_multiple_of(scatter) {
        return Err(Error::invalid(
            "output leading dim",
            out[0],
            format!(
                "must be divisible by tp = {scatter} to reduce-scatter with sequence parallelism"
            ),
        ));
    }
    let mut local_out = out.clone();
    local_out[0] /= scatter;

    let x = input.with_usage(Usage::BOTH)?;
    let w = weight.with_usage(Usage::BOTH)?;
    let dy = TensorProto::new(&out, input.dtype(), grad_output)?.with_usage(Usage::BOTH)?;
    let x_col = input.with_usage(Usage::COLUMNWISE)?.buffers()?;
    let w_col = weight.with_usage(Usage::COLUMNWISE)?.buffers()?;
    let x_row = input.with_usage(Usage::ROWWISE)?.buffers()?;
    let w_row = weight.with_usage(Usage::ROWWISE)?.buffers()?;
    let bias_bytes = if bias { n * input.dtype().size() } else { 0 };
    let out_bytes = local_out.iter().product::<usize>() * input.dtype().size();

    let mut saved = Vec::new();
    saved.extend(x_col.iter().map(|d| ("input".to_string(), d.clone())));
    saved.extend(w_col.iter().map(|d| ("weight".to_string(), d.clone())));
    let saved_bytes = bytes_of(&x_col)? + bytes_of(&w_col)?;
    let forward_bytes = bytes_of(&x_row)? + bytes_of(&w_row)? + bias_bytes;
    let total_bytes = x.nbytes()? + w.nbytes()? + dy.nbytes()? + bias_bytes + out_bytes;
    Ok(LinearPlan {
        gemm_input_shape: gemm_in,
        output_shape: local_out,
        output_dtype: input.dtype(),
        input: OperandPlan {
            proto: x,
            forward: Some(Usage::ROWWISE),
            dgrad: None,
            wgrad: Some(Usage::COLUMNWISE),
        },
        weight: OperandPlan {
            proto: w,
            forward: Some(Usage::ROWWISE),
            dgrad: Some(Usage::COLUMNWISE),
            wgrad: None,
        },
        grad_output: OperandPlan {
            proto: dy,
            forward: None,
            dgrad: Some(Usage::ROWWISE),
            wgrad: Some(Usage::COLUMNWISE),
        },
        saved_for_backward: saved,
        forward_bytes,
        saved_bytes,
        total_bytes,
    })
}

fn check_tp(tp: usize) -> Result<()> {
    if tp == 0 {
        Err(Error::invalid("tp", 0, "tensor-parallel size must be >= 1"))
    } else {
        Ok(())
    }
}
