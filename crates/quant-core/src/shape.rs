//! Logical tensor shapes and their 2-D view.
//!
//! Every recipe in TransformerEngine flattens a tensor to a matrix `[M, K]`: `K` is the
//! last dimension (the GEMM reduction dimension of a `y = x W^T` weight) and `M` is the
//! product of all leading dimensions. Quantizers reason about that view only.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A tensor shape of rank 1 to [`MAX_RANK`] with at most [`MAX_NUMEL`] elements.
///
/// ```
/// use quant_core::Shape;
/// let s = Shape::new(&[2, 3, 128]).unwrap();
/// assert_eq!(s.as_2d(), (6, 128));
/// assert_eq!(s.numel(), 768);
/// assert!(Shape::new(&[usize::MAX, 2]).is_err()); // product overflows
/// assert!(Shape::new(&[0, usize::MAX]).is_err()); // no elements, but K alone is too large
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Vec<usize>", into = "Vec<usize>")]
pub struct Shape {
    dims: Vec<usize>,
    numel: usize,
}

/// The largest rank accepted (hostile metadata cannot ask for more).
pub const MAX_RANK: usize = 8;

/// The largest element count accepted: 2^48 on 64-bit targets (256 Ti elements, far
/// beyond any real tensor), `usize::MAX / 16` on narrower ones.
///
/// The bound is what makes buffer-size arithmetic safe without checking every step:
/// formats round dimensions up to their block and tile sizes (at most a few hundred)
/// and multiply two or three such padded factors, and with every dimension and the
/// product of the non-zero dimensions at most 2^48 none of those products can come near
/// `usize::MAX`. Shapes read from untrusted files (a header claiming a 10^12 x 10^12
/// tensor) are refused here, before any format sees them.
pub const MAX_NUMEL: usize = if (usize::MAX as u64) > (1u64 << 48) {
    (1u64 << 48) as usize
} else {
    usize::MAX >> 4
};

impl Shape {
    /// A shape from its dimensions. Fails on rank 0, rank > [`MAX_RANK`], or when the
    /// product of the non-zero dimensions exceeds [`MAX_NUMEL`] (zero-sized dimensions
    /// are allowed here; quantizers refuse empty tensors themselves, and a zero cannot
    /// hide an absurd dimension next to it).
    pub fn new(dims: &[usize]) -> Result<Shape> {
        if dims.is_empty() {
            return Err(Error::invalid("shape", "[]", "rank must be at least 1"));
        }
        if dims.len() > MAX_RANK {
            return Err(Error::invalid(
                "shape",
                format!("{dims:?}"),
                format!("rank must be at most {MAX_RANK}"),
            ));
        }
        let span = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d.max(1)))
            .filter(|&n| n <= MAX_NUMEL);
        if span.is_none() {
            return Err(Error::invalid(
                "shape",
                format!("{dims:?}"),
                format!("must have at most {MAX_NUMEL} elements (product of the non-zero dims)"),
            ));
        }
        let numel = checked_numel(dims).unwrap_or(0);
        Ok(Shape {
            dims: dims.to_vec(),
            numel,
        })
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.numel == 0
    }

    /// `K`: the last dimension.
    pub fn cols(&self) -> usize {
        self.dims.last().copied().unwrap_or(1)
    }

    /// `M`: the product of the leading dimensions (1 for a rank-1 tensor).
    pub fn rows(&self) -> usize {
        match self.numel.checked_div(self.cols()) {
            Some(m) => m,
            // K = 0: the element count says nothing about M; multiply the leading dims.
            None => self.dims[..self.dims.len().saturating_sub(1)]
                .iter()
                .product(),
        }
    }

    /// The 2-D view `(M, K)`.
    pub fn as_2d(&self) -> (usize, usize) {
        (self.rows(), self.cols())
    }

    /// The shape of the transposed 2-D view as TransformerEngine stores it:
    /// `[K, d0, ..., d_{n-2}]` (a circular permute of the dimensions).
    pub fn transposed(&self) -> Shape {
        let mut dims = Vec::with_capacity(self.dims.len());
        dims.push(self.cols());
        dims.extend_from_slice(&self.dims[..self.dims.len() - 1]);
        Shape {
            dims,
            numel: self.numel,
        }
    }

    /// Refuses empty tensors with a message naming the format.
    pub fn require_nonempty(&self, format: &str) -> Result<()> {
        if self.is_empty() {
            Err(Error::shape(
                format,
                "shape",
                self,
                "has no elements; an empty tensor cannot be quantized",
            ))
        } else {
            Ok(())
        }
    }
}

/// Product of dimensions, `None` on overflow.
pub fn checked_numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

impl TryFrom<Vec<usize>> for Shape {
    type Error = Error;
    fn try_from(v: Vec<usize>) -> Result<Self> {
        Shape::new(&v)
    }
}

impl From<Shape> for Vec<usize> {
    fn from(s: Shape) -> Vec<usize> {
        s.dims
    }
}

impl TryFrom<&[usize]> for Shape {
    type Error = Error;
    fn try_from(v: &[usize]) -> Result<Self> {
        Shape::new(v)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims)
    }
}

/// `ceil(a / b)` for `b > 0`.
#[inline]
pub const fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// `a` rounded up to a multiple of `b` (`b > 0`).
#[inline]
pub const fn round_up(a: usize, b: usize) -> usize {
    a.div_ceil(b) * b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_d_view() {
        assert_eq!(Shape::new(&[7]).unwrap().as_2d(), (1, 7));
        assert_eq!(Shape::new(&[4, 5, 6]).unwrap().as_2d(), (20, 6));
        assert_eq!(Shape::new(&[4, 0]).unwrap().as_2d(), (4, 0));
        assert_eq!(
            Shape::new(&[2, 3, 4]).unwrap().transposed().dims(),
            &[4, 2, 3]
        );
    }

    #[test]
    fn refuses_bad_shapes() {
        assert!(Shape::new(&[]).is_err());
        assert!(Shape::new(&[1; 9]).is_err());
        assert!(Shape::new(&[1 << 40, 1 << 40]).is_err());
        assert!(Shape::new(&[1 << 30, 0, 1 << 30]).is_err());
        assert!(Shape::new(&[1 << 30, 1 << 30, 0]).is_err());
        let s = Shape::new(&[1 << 24, 0, 1 << 24]).unwrap();
        assert_eq!((s.numel(), s.rows(), s.cols()), (0, 0, 1 << 24));
        assert!(Shape::new(&[MAX_NUMEL]).is_ok());
        assert!(Shape::new(&[MAX_NUMEL + 1]).is_err());
        let e = Shape::new(&[0, 3])
            .unwrap()
            .require_nonempty("fp8")
            .unwrap_err();
        assert!(e.to_string().contains("no elements"), "{e}");
    }

    #[test]
    fn serde_validates() {
        let s: Shape = serde_json::from_str("[2,3]").unwrap();
        assert_eq!(s.numel(), 6);
        assert!(serde_json::from_str::<Shape>("[]").is_err());
    }

    #[test]
    fn rounding_helpers() {
        assert_eq!(ceil_div(129, 128), 2);
        assert_eq!(round_up(129, 128), 256);
        assert_eq!(round_up(0, 4), 0);
    }
}
