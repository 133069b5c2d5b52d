//! Named, typed buffers: the bytes a quantized tensor is made of.
//!
//! A [`Buffer`] is a [`BufferDesc`] (name, dtype, shape) plus its bytes. Host bytes live
//! in a shared allocation and start on a 64-byte cache line, so typed views (`&[f32]`,
//! `&[i32]`) are free, kernels can write whole lines with streaming stores, and a grouped
//! tensor can hand out members as zero-copy views of one allocation.
//! Writing goes through copy-on-write: a buffer shared with a view is copied first,
//! never mutated under the view's feet.

use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::pages::PageBuf;
use crate::shape::checked_numel;

/// What a buffer must be: its name within the storage, element dtype and shape.
///
/// ```
/// use quant_core::{BufferDesc, DType};
/// let d = BufferDesc::new("rowwise_scale_inv", DType::U8, &[128, 4]);
/// assert_eq!(d.nbytes().unwrap(), 512);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BufferDesc {
    /// Name, e.g. `rowwise_data`; unique within a storage.
    pub name: String,
    /// Element dtype.
    pub dtype: DType,
    /// Element shape (may be any rank, including `[1]` for scalars).
    pub shape: Vec<usize>,
}

impl BufferDesc {
    /// A description.
    pub fn new(name: impl Into<String>, dtype: DType, shape: &[usize]) -> BufferDesc {
        BufferDesc {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// Number of elements, or an error naming the buffer on overflow.
    pub fn numel(&self) -> Result<usize> {
        checked_numel(&self.shape)
            .ok_or_else(|| Error::buffer(&self.name, "element count overflows usize"))
    }

    /// Number of bytes, or an error naming the buffer on overflow.
    pub fn nbytes(&self) -> Result<usize> {
        self.numel()?
            .checked_mul(self.dtype.size())
            .ok_or_else(|| Error::buffer(&self.name, "byte size overflows usize"))
    }
}

impl fmt::Display for BufferDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {:?}", self.name, self.dtype, self.shape)
    }
}

/// Rust element types a buffer can be viewed as, tied to their [`DType`].
pub trait BufferElem: bytemuck::Pod + Send + Sync + 'static {
    /// The dtype tag a buffer must have to be viewed as `Self`.
    const DTYPE: DType;
}

impl BufferElem for u8 {
    const DTYPE: DType = DType::U8;
}
impl BufferElem for i32 {
    const DTYPE: DType = DType::I32;
}
impl BufferElem for f32 {
    const DTYPE: DType = DType::F32;
}
impl BufferElem for f16 {
    const DTYPE: DType = DType::F16;
}
impl BufferElem for bf16 {
    const DTYPE: DType = DType::BF16;
}

/// Host bytes: a window into a shared allocation, whose own bytes start on a 64-byte
/// line.
#[derive(Clone)]
pub struct HostBytes {
    alloc: Arc<PageBuf>,
    start: usize,
    len: usize,
}

/// Bytes from the start of `alloc` to its first 64-byte line: where its data begins.
/// Streamed kernels write whole aligned lines: a columnwise quantize stores 64 or 128
/// bytes of each of thousands of rows per task, and rows that straddle lines left a
/// third to all of those stores partial, each a read for ownership missing in cache.
fn origin(alloc: &[u8]) -> usize {
    alloc.as_ptr().align_offset(64)
}

impl HostBytes {
    /// `len` zero bytes starting on a 64-byte line. Untouched pages cost nothing; large
    /// allocations ask for transparent huge pages ([`crate::pages`]).
    ///
    /// ```
    /// use quant_core::HostBytes;
    /// let b = HostBytes::zeroed(100);
    /// assert_eq!(b.as_slice().as_ptr().align_offset(64), 0);
    /// assert!(b.as_slice().iter().all(|&x| x == 0));
    /// ```
    pub fn zeroed(len: usize) -> HostBytes {
        // Up to 56 bytes before the first line (the heap's allocation is 8-byte aligned;
        // a mapping is page aligned).
        let alloc = PageBuf::zeroed(len + 56);
        HostBytes {
            start: origin(&alloc),
            alloc: Arc::new(alloc),
            len,
        }
    }

    /// A copy of `bytes` in aligned memory.
    pub fn copy_from(bytes: &[u8]) -> HostBytes {
        let mut out = HostBytes::zeroed(bytes.len());
        out.words_mut_unique()[..bytes.len()].copy_from_slice(bytes);
        out
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.alloc[self.start..self.start + self.len]
    }

    /// Mutable bytes; copies first when the allocation is shared or this is a window.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.start != origin(&self.alloc) || Arc::get_mut(&mut self.alloc).is_none() {
            *self = HostBytes::copy_from(self.as_slice());
        }
        let len = self.len;
        &mut self.words_mut_unique()[..len]
    }

    /// A zero-copy window `[offset, offset + len)` of these bytes.
    pub fn window(&self, offset: usize, len: usize) -> Result<HostBytes> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| {
                Error::invalid(
                    "window",
                    format!("{offset}..{}", offset.saturating_add(len)),
                    format!("must lie within the {} bytes of the buffer", self.len),
                )
            })?;
        debug_assert!(end <= self.len);
        Ok(HostBytes {
            alloc: Arc::clone(&self.alloc),
            start: self.start + offset,
            len,
        })
    }

    /// Whether the allocation is a mapping advised for transparent huge pages
    /// ([`crate::pages`]: large allocations on Linux, unless `QUANTFMT_HUGE_PAGES=0`).
    ///
    /// ```
    /// use quant_core::HostBytes;
    /// assert!(!HostBytes::zeroed(64).huge_pages_advised()); // small: the heap
    /// ```
    pub fn huge_pages_advised(&self) -> bool {
        self.alloc.is_advised()
    }

    /// Whether two windows share one allocation (zero-copy check for tests).
    pub fn shares_allocation(&self, other: &HostBytes) -> bool {
        Arc::ptr_eq(&self.alloc, &other.alloc)
    }

    /// The bytes from this window's start to the end of the allocation.
    fn words_mut_unique(&mut self) -> &mut [u8] {
        // Only called when `alloc` is uniquely owned (just created or checked above).
        match Arc::get_mut(&mut self.alloc) {
            Some(v) => &mut v[self.start..],
            None => &mut [],
        }
    }
}

impl fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostBytes({} bytes)", self.len)
    }
}

/// One named buffer of a quantized tensor.
#[derive(Clone, Debug)]
pub struct Buffer {
    desc: BufferDesc,
    data: HostBytes,
}

impl Buffer {
    /// A zero-filled buffer (padding regions of scale buffers stay zero).
    pub fn zeroed(desc: BufferDesc) -> Result<Buffer> {
        let n = desc.nbytes()?;
        Ok(Buffer {
            desc,
            data: HostBytes::zeroed(n),
        })
    }

    /// A buffer holding a copy of `bytes`, which must be exactly the described size.
    pub fn from_bytes(desc: BufferDesc, bytes: &[u8]) -> Result<Buffer> {
        let n = desc.nbytes()?;
        if bytes.len() != n {
            return Err(Error::buffer(
                &desc.name,
                format!(
                    "has {} bytes, but {} {:?} needs {n}",
                    bytes.len(),
                    desc.dtype,
                    desc.shape
                ),
            ));
        }
        Ok(Buffer {
            desc,
            data: HostBytes::copy_from(bytes),
        })
    }

    /// A buffer over existing host bytes (zero-copy), which must be exactly the described size.
    pub fn from_host_bytes(desc: BufferDesc, data: HostBytes) -> Result<Buffer> {
        let n = desc.nbytes()?;
        if data.len() != n {
            return Err(Error::buffer(
                &desc.name,
                format!("has {} bytes, but its description needs {n}", data.len()),
            ));
        }
        Ok(Buffer { desc, data })
    }

    /// A buffer holding a copy of typed values.
    pub fn from_slice<T: BufferElem>(name: &str, shape: &[usize], values: &[T]) -> Result<Buffer> {
        Buffer::from_bytes(
            BufferDesc::new(name, T::DTYPE, shape),
            bytemuck::cast_slice(values),
        )
    }

    /// The description.
    pub fn desc(&self) -> &BufferDesc {
        &self.desc
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.desc.name
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.desc.dtype
    }

    /// The element shape.
    pub fn shape(&self) -> &[usize] {
        &self.desc.shape
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.data.len()
    }

    /// The host bytes.
    pub fn bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// The underlying host allocation window.
    pub fn host(&self) -> &HostBytes {
        &self.data
    }

    /// Mutable bytes (copy-on-write if shared with a view).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.data.as_mut_slice()
    }

    /// Typed view; the buffer's dtype must be `T`'s.
    pub fn as_slice<T: BufferElem>(&self) -> Result<&[T]> {
        self.check_elem::<T>()?;
        bytemuck::try_cast_slice(self.bytes()).map_err(|e| {
            Error::buffer(
                &self.desc.name,
                format!("cannot be viewed as {}: {e:?}", T::DTYPE),
            )
        })
    }

    /// Typed mutable view (copy-on-write); the buffer's dtype must be `T`'s.
    pub fn as_mut_slice<T: BufferElem>(&mut self) -> Result<&mut [T]> {
        self.check_elem::<T>()?;
        let name = self.desc.name.clone();
        bytemuck::try_cast_slice_mut(self.bytes_mut())
            .map_err(|e| Error::buffer(name, format!("cannot be viewed as {}: {e:?}", T::DTYPE)))
    }

    /// A mutable view for kernels (copy-on-write first if the bytes are shared).
    pub fn as_mut_view(&mut self) -> BufferMut<'_> {
        BufferMut {
            desc: &self.desc,
            bytes: self.data.as_mut_slice(),
        }
    }

    /// A zero-copy view of `[offset, offset + desc.nbytes())` of this buffer's bytes.
    pub fn view(&self, desc: BufferDesc, offset: usize) -> Result<Buffer> {
        let n = desc.nbytes()?;
        let data = self.data.window(offset, n)?;
        Ok(Buffer { desc, data })
    }

    /// Checks this buffer against a description: same name, dtype, shape and byte count.
    pub fn check_against(&self, want: &BufferDesc) -> Result<()> {
        if self.desc.name != want.name {
            return Err(Error::buffer(
                &self.desc.name,
                format!("expected buffer `{}` here", want.name),
            ));
        }
        if self.desc.dtype != want.dtype {
            return Err(Error::buffer(
                &want.name,
                format!(
                    "has dtype {}, but the format stores {}",
                    self.desc.dtype, want.dtype
                ),
            ));
        }
        if self.desc.shape != want.shape {
            return Err(Error::buffer(
                &want.name,
                format!(
                    "has shape {:?}, but the format needs {:?}",
                    self.desc.shape, want.shape
                ),
            ));
        }
        let n = want.nbytes()?;
        if self.data.len() != n {
            return Err(Error::buffer(
                &want.name,
                format!("has {} bytes, but needs {n}", self.data.len()),
            ));
        }
        Ok(())
    }

    fn check_elem<T: BufferElem>(&self) -> Result<()> {
        check_elem::<T>(&self.desc)
    }
}

/// A writable view of one buffer: its description and its bytes, borrowed.
///
/// Kernels write through this type, so the same kernel fills a standalone tensor's
/// buffers, a member's window of a grouped allocation, or caller-provided memory.
#[derive(Debug)]
pub struct BufferMut<'a> {
    desc: &'a BufferDesc,
    bytes: &'a mut [u8],
}

impl<'a> BufferMut<'a> {
    /// A view over `bytes`, which must be exactly the described size.
    pub fn new(desc: &'a BufferDesc, bytes: &'a mut [u8]) -> Result<BufferMut<'a>> {
        let n = desc.nbytes()?;
        if bytes.len() != n {
            return Err(Error::buffer(
                &desc.name,
                format!(
                    "view has {} bytes, but its description needs {n}",
                    bytes.len()
                ),
            ));
        }
        Ok(BufferMut { desc, bytes })
    }

    /// The description.
    pub fn desc(&self) -> &BufferDesc {
        self.desc
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.desc.name
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.desc.dtype
    }

    /// The element shape.
    pub fn shape(&self) -> &[usize] {
        &self.desc.shape
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.bytes
    }

    /// Typed view; the dtype must be `T`'s.
    pub fn as_slice<T: BufferElem>(&self) -> Result<&[T]> {
        check_elem::<T>(self.desc)?;
        bytemuck::try_cast_slice(self.bytes).map_err(|e| {
            Error::buffer(
                &self.desc.name,
                format!("cannot be viewed as {}: {e:?}", T::DTYPE),
            )
        })
    }

    /// Typed writable view; the dtype must be `T`'s.
    pub fn as_mut_slice<T: BufferElem>(&mut self) -> Result<&mut [T]> {
        check_elem::<T>(self.desc)?;
        let name = &self.desc.name;
        bytemuck::try_cast_slice_mut(self.bytes)
            .map_err(|e| Error::buffer(name, format!("cannot be viewed as {}: {e:?}", T::DTYPE)))
    }
}

fn check_elem<T: BufferElem>(desc: &BufferDesc) -> Result<()> {
    if desc.dtype == T::DTYPE {
        Ok(())
    } else {
        Err(Error::buffer(
            &desc.name,
            format!("has dtype {}, not {}", desc.dtype, T::DTYPE),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_on_write_keeps_views_intact() {
        let mut b = Buffer::from_slice::<u8>("x", &[4], &[1, 2, 3, 4]).unwrap();
        let v = b.view(BufferDesc::new("y", DType::U8, &[2]), 2).unwrap();
        assert!(v.host().shares_allocation(b.host()));
        b.bytes_mut()[2] = 9;
        assert_eq!(v.bytes(), &[3, 4]);
        assert_eq!(b.bytes(), &[1, 2, 9, 4]);
    }

    /// A buffer large enough to be mapped for huge pages behaves as a heap one: zeroed,
    /// on a line, windows shared, writes through a shared window copied first.
    #[test]
    fn large_buffers_are_mapped_and_copy_on_write() {
        let len = crate::pages::HUGE_MIN + 100;
        let mut a = HostBytes::zeroed(len);
        assert_eq!(a.as_slice().as_ptr().align_offset(64), 0);
        assert!(a.as_slice().iter().all(|&x| x == 0));
        if cfg!(target_os = "linux") && crate::pages::enabled() && !a.huge_pages_advised() {
            eprintln!("note: the mapping was refused here; the heap served");
        }
        a.as_mut_slice()[len - 1] = 9;
        let w = a.window(len - 10, 10).unwrap();
        assert!(w.shares_allocation(&a));
        let mut w2 = w.clone();
        w2.as_mut_slice()[9] = 1;
        assert!(!w2.shares_allocation(&a));
        assert_eq!(
            (a.as_slice()[len - 1], w.as_slice()[9], w2.as_slice()[9]),
            (9, 9, 1)
        );
        let c = HostBytes::copy_from(a.as_slice());
        assert_eq!(c.as_slice(), a.as_slice());
        assert_eq!(c.huge_pages_advised(), a.huge_pages_advised());
    }

    #[test]
    fn typed_views_check_dtype() {
        let b = Buffer::from_slice::<f32>("s", &[2], &[1.0, 2.0]).unwrap();
        assert_eq!(b.as_slice::<f32>().unwrap(), &[1.0, 2.0]);
        let e = b.as_slice::<i32>().unwrap_err().to_string();
        assert!(e.contains("has dtype f32, not i32"), "{e}");
    }

    #[test]
    fn size_mismatch_named() {
        let e = Buffer::from_bytes(BufferDesc::new("d", DType::F32, &[3]), &[0; 11])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "buffer `d`: has 11 bytes, but f32 [3] needs 12");
        let b = Buffer::from_slice::<u8>("x", &[4], &[0; 4]).unwrap();
        assert!(b.view(BufferDesc::new("y", DType::U8, &[3]), 2).is_err());
        assert!(
            b.view(BufferDesc::new("y", DType::U8, &[1]), usize::MAX)
                .is_err()
        );
    }
}
