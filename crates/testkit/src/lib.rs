//! Reproducible pseudo-random data for quantfmt's tests, benches and examples.
//!
//! Marsaglia's xorshift generators, written once instead of copied into every test file:
//! no dependency, the same stream on every platform and run, and a failing case
//! reproduces from its seed alone. Dev-only (`publish = false`): the published crates take
//! it as a dev-dependency, never as a dependency.
//!
//! The streams and mappings below are part of what the tests check: a different shift,
//! seed rule or bit mapping silently changes the inputs of every test that uses them.

/// What a zero seed becomes (xorshift maps 0 to 0 forever): the golden ratio, `2^64 / phi`
/// (also [`XorShift64::scrambled`]'s multiplier) and its top 32 bits.
const ZERO_SEED_64: u64 = 0x9E37_79B9_7F4A_7C15;
const ZERO_SEED_32: u32 = 0x9E37_79B9;

/// Marsaglia's xorshift64 (shifts 13, 7, 17): a full-period (2^64 - 1) generator that is
/// fast, dependency-free and plenty random for test inputs (not for statistics or crypto).
///
/// ```
/// use quantfmt_testkit::XorShift64;
/// let mut rng = XorShift64::new(1);
/// assert_eq!(rng.next_u64(), 0x4082_2041);
/// assert_eq!(rng.next_u64(), 0x1000_4106_0C01_1441);
/// ```
#[derive(Clone, Debug)]
pub struct XorShift64 {
    state: u64,
}

impl XorShift64 {
    /// A generator whose state is `seed`, so a seed written as a state before this crate
    /// existed gives the same stream. Zero, which xorshift never leaves, is replaced by
    /// `0x9E37_79B9_7F4A_7C15` instead of giving a stream of zeros.
    ///
    /// ```
    /// use quantfmt_testkit::XorShift64;
    /// let zero = XorShift64::new(0).next_u64();
    /// assert_eq!(zero, XorShift64::new(0x9E37_79B9_7F4A_7C15).next_u64());
    /// assert_ne!(zero, 0);
    /// ```
    pub const fn new(seed: u64) -> Self {
        Self {
            state: if seed == 0 { ZERO_SEED_64 } else { seed },
        }
    }

    /// A generator whose state is `seed * 0x9E37_79B9_7F4A_7C15 | 1`: small or counter-like
    /// seeds (0, 1, 2, ...) start far apart, and the state is never zero.
    ///
    /// ```
    /// use quantfmt_testkit::XorShift64;
    /// let mut a = XorShift64::scrambled(2);
    /// let mut b = XorShift64::new(2u64.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    /// assert_eq!(a.next_u64(), b.next_u64());
    /// assert_ne!(XorShift64::scrambled(0).next_u64(), 0);
    /// ```
    pub const fn scrambled(seed: u64) -> Self {
        Self::new(seed.wrapping_mul(ZERO_SEED_64) | 1)
    }

    /// Advances the state and returns it: all 64 bits, for callers that slice one draw into
    /// several fields (a special-value pick, a sign bit, a magnitude).
    ///
    /// ```
    /// use quantfmt_testkit::XorShift64;
    /// let mut rng = XorShift64::new(7);
    /// let mut again = rng.clone();
    /// assert_eq!(rng.next_u64(), again.next_u64());
    /// assert!((0..1000).all(|_| rng.next_u64() != 0));
    /// ```
    pub fn next_u64(&mut self) -> u64 {
        let mut s = self.state;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        self.state = s;
        s
    }

    /// The next draw as a uniform `f32` in `[0, 1)`, from its top 24 bits
    /// ([`unit_f32`]): every value is exact, a multiple of 2^-24.
    ///
    /// ```
    /// use quantfmt_testkit::{XorShift64, unit_f32};
    /// let mut a = XorShift64::new(3);
    /// assert_eq!(a.next_f32(), unit_f32(XorShift64::new(3).next_u64()));
    /// ```
    pub fn next_f32(&mut self) -> f32 {
        unit_f32(self.next_u64())
    }

    /// The next draw as a uniform `f64` in `[0, 1)`, from its top 53 bits
    /// ([`unit_f64`]): every value is exact, a multiple of 2^-53.
    ///
    /// ```
    /// use quantfmt_testkit::{XorShift64, unit_f64};
    /// let mut a = XorShift64::new(3);
    /// assert_eq!(a.next_f64(), unit_f64(XorShift64::new(3).next_u64()));
    /// ```
    pub fn next_f64(&mut self) -> f64 {
        unit_f64(self.next_u64())
    }
}

/// `bits`' top 24 bits as an `f32` in `[0, 1)`: `(bits >> 40) / 2^24`, exact (24 bits fit
/// the mantissa), for a draw whose low bits also pick something else.
///
/// ```
/// use quantfmt_testkit::unit_f32;
/// assert_eq!(unit_f32(0), 0.0);
/// assert_eq!(unit_f32(1 << 63), 0.5);
/// assert_eq!(unit_f32(u64::MAX), 1.0 - 2f32.powi(-24));
/// ```
pub fn unit_f32(bits: u64) -> f32 {
    (bits >> 40) as f32 / (1u64 << 24) as f32
}

/// `bits`' top 53 bits as an `f64` in `[0, 1)`: `(bits >> 11) / 2^53`, exact (53 bits fit
/// the mantissa), for a draw whose low bits also pick something else.
///
/// ```
/// use quantfmt_testkit::unit_f64;
/// assert_eq!(unit_f64(0), 0.0);
/// assert_eq!(unit_f64(1 << 63), 0.5);
/// assert_eq!(unit_f64(u64::MAX), 1.0 - 2f64.powi(-53));
/// ```
pub fn unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Marsaglia's 32-bit xorshift (shifts 13, 17, 5; period 2^32 - 1): the generator of the
/// tests whose data was always drawn 32 bits at a time. A different stream from
/// [`XorShift64`], kept so those tests keep their inputs.
///
/// ```
/// use quantfmt_testkit::XorShift32;
/// let mut rng = XorShift32::new(1);
/// assert_eq!(rng.next_u32(), 0x0004_2021);
/// assert_eq!(rng.next_u32(), 0x0408_0601);
/// ```
#[derive(Clone, Debug)]
pub struct XorShift32 {
    state: u32,
}

impl XorShift32 {
    /// A generator whose state is `seed` (an old seed gives its old stream); zero, which
    /// xorshift never leaves, is replaced by `0x9E37_79B9`.
    ///
    /// ```
    /// use quantfmt_testkit::XorShift32;
    /// let zero = XorShift32::new(0).next_u32();
    /// assert_eq!(zero, XorShift32::new(0x9E37_79B9).next_u32());
    /// assert_ne!(zero, 0);
    /// ```
    pub const fn new(seed: u32) -> Self {
        Self {
            state: if seed == 0 { ZERO_SEED_32 } else { seed },
        }
    }

    /// Advances the state and returns it: all 32 bits, which callers slice as they need.
    ///
    /// ```
    /// use quantfmt_testkit::XorShift32;
    /// let mut rng = XorShift32::new(0x1234_5678);
    /// assert!((0..1000).all(|_| rng.next_u32() != 0));
    /// ```
    pub fn next_u32(&mut self) -> u32 {
        let mut s = self.state;
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        self.state = s;
        s
    }
}
