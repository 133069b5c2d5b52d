//! Grouped tensors: N members of one quantizer in one allocation per buffer kind.
//!
//! The layout is TransformerEngine's `GroupedTensor`: for every buffer kind of the format
//! (`rowwise_data`, `rowwise_scale_inv`, `scale_inv`, ...), the members' buffers are
//! concatenated back to back with no padding between them, each member keeping its own
//! individually padded block (so per-tensor scalars become arrays of length N and each
//! member's scale matrix keeps its own `roundup(M_i, 128)` padding). Grouped buffers are
//! 1-D. Offsets are prefix sums, in elements of the logical tensor and in bytes of each
//! buffer kind.
//!
//! ```text
//! member shapes      [M0,K] [M1,K] [M2,K]
//! rowwise_data       |--M0*K--|--M1*K--|--M2*K--|           (bytes; FP4 halves)
//! rowwise_scale_inv  |-pad(M0)-|-pad(M1)-|-pad(M2)-|        (each padded on its own)
//! scale_inv (fp8)    |s0|s1|s2|                             (one f32 per member)
//! ```
//!
//! The layout is generic: it needs nothing from a format but its buffer descriptions, so
//! every [`Format`] has a grouped form, and the grouped bytes equal, byte for byte, the
//! concatenation of quantizing each member alone.

use std::any::Any;
use std::fmt;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::buffer::{Buffer, BufferDesc, BufferMut};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::{Format, QuantizedTensor};
use crate::shape::Shape;
use crate::tensor::HostTensor;
use crate::traits::{GroupedStorage, Quantizer, Storage};

/// How member shapes vary (TE's four cases), which fixes the logical 2-D shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    /// All members equal `[M, K]`: logical `[N*M, K]`.
    Uniform,
    /// Members `[M_i, K]`: logical `[sum M_i, K]`.
    VaryingFirst,
    /// Members `[M, K_i]`: logical `[M, sum K_i]`.
    VaryingLast,
    /// Members `[M_i, K_i]`: logical `[1, sum M_i*K_i]`.
    VaryingBoth,
}

impl GroupKind {
    /// Classifies member shapes (2-D views) and returns the kind and the logical shape.
    pub fn classify(shapes: &[Shape]) -> Result<(GroupKind, [usize; 2])> {
        let first = shapes.first().ok_or_else(|| {
            Error::invalid("members", 0, "a grouped tensor needs at least one member")
        })?;
        let (m0, k0) = first.as_2d();
        let same_m = shapes.iter().all(|s| s.rows() == m0);
        let same_k = shapes.iter().all(|s| s.cols() == k0);
        let sum = |f: &dyn Fn(&Shape) -> usize| -> Result<usize> {
            shapes.iter().try_fold(0usize, |a, s| {
                a.checked_add(f(s)).ok_or_else(|| {
                    Error::invalid("members", shapes.len(), "total size overflows usize")
                })
            })
        };
        Ok(match (same_m, same_k) {
            (true, true) => (GroupKind::Uniform, [sum(&|s| s.rows())?, k0]),
            (false, true) => (GroupKind::VaryingFirst, [sum(&|s| s.rows())?, k0]),
            (true, false) => (GroupKind::VaryingLast, [m0, sum(&|s| s.cols())?]),
            (false, false) => (GroupKind::VaryingBoth, [1, sum(&|s| s.numel())?]),
        })
    }
}

/// Member layout of a grouped tensor: shapes, per-member buffer descriptions and offsets.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupLayout {
    shapes: Vec<Shape>,
    kind: GroupKind,
    logical: [usize; 2],
    /// `descs[i][b]`: member i's description of buffer kind b.
    descs: Vec<Vec<BufferDesc>>,
    elem_offsets: Vec<usize>,
    /// `byte_offsets[b]`: N+1 prefix sums of member byte sizes in buffer kind b.
    byte_offsets: Vec<Vec<usize>>,
}

impl GroupLayout {
    /// Computes the layout of `shapes` under quantizer `q` (every member checked against
    /// the format's shape rule; members with zero rows are allowed, e.g. an expert that
    /// received no tokens).
    pub fn new(q: &dyn Quantizer, shapes: &[Shape]) -> Result<GroupLayout> {
        let (kind, logical) = GroupKind::classify(shapes)?;
        let mut descs = Vec::with_capacity(shapes.len());
        for (i, s) in shapes.iter().enumerate() {
            q.check_shape(s).map_err(|e| {
                Error::invalid(
                    format!("member {i}"),
                    s,
                    format!("breaks the format's rule: {e}"),
                )
            })?;
            descs.push(q.buffers(s)?);
        }
        let names: Vec<&str> = descs[0].iter().map(|d| d.name.as_str()).collect();
        for (i, d) in descs.iter().enumerate() {
            let n: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
            if n != names {
                return Err(Error::invalid(
                    format!("member {i}"),
                    n.join(","),
                    format!(
                        "must have the same buffers as member 0 ({})",
                        names.join(",")
                    ),
                ));
            }
        }
        let mut elem_offsets = vec![0usize];
        for s in shapes {
            let last = *elem_offsets.last().unwrap_or(&0);
            elem_offsets.push(last.checked_add(s.numel()).ok_or_else(|| {
                Error::invalid("members", shapes.len(), "total size overflows usize")
            })?);
        }
        let mut byte_offsets = Vec::with_capacity(names.len());
        for b in 0..names.len() {
            let mut offs = vec![0usize];
            for d in &descs {
                let last = *offs.last().unwrap_or(&0);
                offs.push(
                    last.checked_add(d[b].nbytes()?)
                        .ok_or_else(|| Error::buffer(&d[b].name, "grouped size overflows usize"))?,
                );
            }
            byte_offsets.push(offs);
        }
        Ok(GroupLayout {
            shapes: shapes.to_vec(),
            kind,
            logical,
            descs,
            elem_offsets,
            byte_offsets,
        })
    }

    /// Member shapes.
    pub fn shapes(&self) -> &[Shape] {
        &self.shapes
    }

    /// Which dims vary.
    pub fn kind(&self) -> GroupKind {
        self.kind
    }

    /// The logical 2-D shape.
    pub fn logical_shape(&self) -> [usize; 2] {
        self.logical
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.shapes.len()
    }

    /// Whether there are no members (never true for a constructed layout).
    pub fn is_empty(&self) -> bool {
        self.shapes.is_empty()
    }

    /// Element offsets (N+1 prefix sums).
    pub fn element_offsets(&self) -> &[usize] {
        &self.elem_offsets
    }

    /// Byte offsets of buffer kind `b` (N+1 prefix sums).
    pub fn byte_offsets_of(&self, b: usize) -> &[usize] {
        &self.byte_offsets[b]
    }

    /// The grouped (1-D) buffer descriptions.
    pub fn grouped_descs(&self) -> Vec<BufferDesc> {
        self.descs[0]
            .iter()
            .enumerate()
            .map(|(b, d)| {
                let total = self.byte_offsets[b].last().copied().unwrap_or(0);
                BufferDesc::new(d.name.clone(), d.dtype, &[total / d.dtype.size()])
            })
            .collect()
    }

    /// Member `i`'s buffer descriptions.
    pub fn member_descs(&self, i: usize) -> &[BufferDesc] {
        &self.descs[i]
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.descs[0].iter().position(|d| d.name == name)
    }
}

/// N tensors of one format in one allocation per buffer kind.
#[derive(Clone)]
pub struct GroupedTensor<F: Format> {
    format: F,
    dtype: DType,
    layout: GroupLayout,
    buffers: Vec<Buffer>,
}

impl<F: Format> fmt::Debug for GroupedTensor<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupedTensor")
            .field("format", &self.format.spec())
            .field("dtype", &self.dtype)
            .field("members", &self.layout.shapes)
            .field("kind", &self.layout.kind)
            .finish()
    }
}

impl<F: Format> GroupedTensor<F> {
    /// A zero-filled grouped tensor.
    pub fn allocate(format: F, shapes: &[Shape], dtype: DType) -> Result<Self> {
        if !dtype.is_float() {
            return Err(Error::invalid("dtype", dtype, "must be f32, bf16 or f16"));
        }
        format.usage().require_some()?;
        let layout = GroupLayout::new(&format, shapes)?;
        let buffers = layout
            .grouped_descs()
            .into_iter()
            .map(Buffer::zeroed)
            .collect::<Result<Vec<_>>>()?;
        Ok(GroupedTensor {
            format,
            dtype,
            layout,
            buffers,
        })
    }

    /// Quantizes one contiguous input holding the members back to back (member i is
    /// elements `[offset_i, offset_{i+1})`), all members in one parallel pass.
    pub fn quantize(format: &F, x: &HostTensor<'_>, shapes: &[Shape]) -> Result<Self> {
        let mut g = GroupedTensor::allocate(format.clone(), shapes, x.dtype())?;
        let total = *g.layout.elem_offsets.last().unwrap_or(&0);
        if x.shape().numel() != total {
            return Err(Error::invalid(
                "x",
                x.shape(),
                format!("must hold the {total} elements of the members back to back"),
            ));
        }
        let members: Vec<HostTensor<'_>> = (0..shapes.len())
            .map(|i| slice_elements(x, g.layout.elem_offsets[i], &shapes[i]))
            .collect::<Result<_>>()?;
        g.fill(&members)?;
        Ok(g)
    }

    /// Quantizes a list of member inputs (one parallel pass).
    pub fn quantize_list(format: &F, xs: &[HostTensor<'_>]) -> Result<Self> {
        let dtype = xs.first().map(HostTensor::dtype).ok_or_else(|| {
            Error::invalid("members", 0, "a grouped tensor needs at least one member")
        })?;
        if let Some((i, x)) = xs.iter().enumerate().find(|(_, x)| x.dtype() != dtype) {
            return Err(Error::invalid(
                format!("member {i} dtype"),
                x.dtype(),
                format!("must match member 0 ({dtype})"),
            ));
        }
        let shapes: Vec<Shape> = xs.iter().map(|x| x.shape().clone()).collect();
        let mut g = GroupedTensor::allocate(format.clone(), &shapes, dtype)?;
        g.fill(xs)?;
        Ok(g)
    }

    fn fill(&mut self, xs: &[HostTensor<'_>]) -> Result<()> {
        let n = self.layout.len();
        // Split every grouped buffer into per-member windows.
        let mut per_member: Vec<Vec<BufferMut<'_>>> = (0..n).map(|_| Vec::new()).collect();
        for (b, buf) in self.buffers.iter_mut().enumerate() {
            let offs = &self.layout.byte_offsets[b];
            let mut rest: &mut [u8] = buf.bytes_mut();
            for (i, member) in per_member.iter_mut().enumerate() {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(offs[i + 1] - offs[i]);
                member.push(BufferMut::new(&self.layout.descs[i][b], head)?);
                rest = tail;
            }
        }
        let format = &self.format;
        per_member
            .into_par_iter()
            .zip(xs.par_iter())
            .try_for_each(|(mut views, x)| {
                if x.shape().is_empty() {
                    return Ok(());
                }
                format.quantize_into(x, &mut views)
            })
    }

    /// Concatenates standalone member tensors (same quantizer and dtype) into one group.
    pub fn from_members(members: &[QuantizedTensor<F>]) -> Result<Self> {
        let first = members.first().ok_or_else(|| {
            Error::invalid("members", 0, "a grouped tensor needs at least one member")
        })?;
        for (i, m) in members.iter().enumerate() {
            if m.quantizer() != first.quantizer() || m.dtype() != first.dtype() {
                return Err(Error::invalid(
                    format!("member {i}"),
                    format!("{} {}", m.quantizer().spec(), m.dtype()),
                    format!(
                        "must have member 0's quantizer and dtype ({} {})",
                        first.quantizer().spec(),
                        first.dtype()
                    ),
                ));
            }
        }
        let shapes: Vec<Shape> = members.iter().map(|m| m.shape().clone()).collect();
        let mut g = GroupedTensor::allocate(first.quantizer().clone(), &shapes, first.dtype())?;
        for (b, buf) in g.buffers.iter_mut().enumerate() {
            let offs = &g.layout.byte_offsets[b];
            let dst = buf.bytes_mut();
            for (i, m) in members.iter().enumerate() {
                dst[offs[i]..offs[i + 1]].copy_from_slice(m.buffers()[b].bytes());
            }
        }
        Ok(g)
    }

    /// Rebuilds from grouped buffers (read from a file): each checked against the layout.
    pub fn from_buffers(
        format: F,
        shapes: &[Shape],
        dtype: DType,
        buffers: Vec<Buffer>,
    ) -> Result<Self> {
        format.validate_options()?;
        if !dtype.is_float() {
            return Err(Error::invalid("dtype", dtype, "must be f32, bf16 or f16"));
        }
        format.usage().require_some()?;
        // No zero-filled allocation first: the buffers given are checked and kept, so
        // rebuilding from a file costs the file's bytes once, not twice.
        let layout = GroupLayout::new(&format, shapes)?;
        let want = layout.grouped_descs();
        let mut given: Vec<Option<Buffer>> = buffers.into_iter().map(Some).collect();
        let mut ordered = Vec::with_capacity(want.len());
        for desc in &want {
            let buf = given
                .iter_mut()
                .find(|x| x.as_ref().is_some_and(|x| x.name() == desc.name))
                .and_then(Option::take)
                .ok_or_else(|| Error::buffer(&desc.name, "is missing from the grouped tensor"))?;
            buf.check_against(desc)?;
            ordered.push(buf);
        }
        if let Some(extra) = given.into_iter().flatten().next() {
            return Err(Error::buffer(
                extra.name(),
                "is not a buffer of this grouped tensor",
            ));
        }
        let g = GroupedTensor {
            format,
            dtype,
            layout,
            buffers: ordered,
        };
        for i in 0..g.layout.len() {
            if !g.layout.shapes[i].is_empty() {
                let m = g.member_view(i)?;
                g.format.validate_buffers(m.shape(), m.buffers())?;
            }
        }
        Ok(g)
    }

    /// The layout.
    pub fn layout(&self) -> &GroupLayout {
        &self.layout
    }

    /// The shared quantizer.
    pub fn quantizer(&self) -> &F {
        &self.format
    }

    /// The grouped buffers.
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// Member `i` as a zero-copy [`QuantizedTensor`] (its buffers are windows of the group's).
    pub fn member_view(&self, i: usize) -> Result<QuantizedTensor<F>> {
        if i >= self.layout.len() {
            return Err(Error::invalid(
                "member",
                i,
                format!("must be < {} (the number of members)", self.layout.len()),
            ));
        }
        let bufs = self
            .buffers
            .iter()
            .enumerate()
            .map(|(b, buf)| {
                buf.view(
                    self.layout.descs[i][b].clone(),
                    self.layout.byte_offsets[b][i],
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(QuantizedTensor::from_parts_trusted(
            self.format.clone(),
            self.layout.shapes[i].clone(),
            self.dtype,
            bufs,
        ))
    }

    /// All members as zero-copy views.
    pub fn split(&self) -> Result<Vec<QuantizedTensor<F>>> {
        (0..self.layout.len())
            .map(|i| self.member_view(i))
            .collect()
    }
}

/// Member `shape`'s elements starting at `offset` of a contiguous tensor (zero-copy).
fn slice_elements<'a>(
    x: &'a HostTensor<'_>,
    offset: usize,
    shape: &Shape,
) -> Result<HostTensor<'a>> {
    let n = shape.numel();
    let bytes = x.as_bytes();
    let sz = x.dtype().size();
    let range = offset * sz..(offset + n) * sz;
    let b = bytes
        .get(range)
        .ok_or_else(|| Error::invalid("x", x.shape(), "is too small for the member shapes"))?;
    HostTensor::from_le_bytes(x.dtype(), b, shape.dims())
}

impl<F: Format> GroupedStorage for GroupedTensor<F> {
    fn quantizer(&self) -> &dyn Quantizer {
        &self.format
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn num_members(&self) -> usize {
        self.layout.len()
    }
    fn member_shapes(&self) -> &[Shape] {
        &self.layout.shapes
    }
    fn kind(&self) -> GroupKind {
        self.layout.kind
    }
    fn logical_shape(&self) -> [usize; 2] {
        self.layout.logical
    }
    fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }
    fn element_offsets(&self) -> &[usize] {
        &self.layout.elem_offsets
    }
    fn byte_offsets(&self, name: &str) -> Result<&[usize]> {
        let b = self
            .layout
            .index_of(name)
            .ok_or_else(|| Error::buffer(name, "is not a buffer of this grouped tensor"))?;
        Ok(&self.layout.byte_offsets[b])
    }
    fn member(&self, i: usize) -> Result<Box<dyn Storage>> {
        Ok(Box::new(self.member_view(i)?))
    }
    fn clone_box(&self) -> Box<dyn GroupedStorage> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}
