//! Reproducible pseudo-random test data without a dependency.

/// Marsaglia's xorshift64 (shifts 13, 7, 17): advances `s` and returns it.
pub(crate) fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}
