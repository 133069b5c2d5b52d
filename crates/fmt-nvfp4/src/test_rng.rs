//! Reproducible pseudo-random test data without a dependency.

/// Marsaglia's 32-bit xorshift (shifts 13, 17, 5): advances `s` and returns it.
pub(crate) fn xorshift32(s: &mut u32) -> u32 {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    *s
}
