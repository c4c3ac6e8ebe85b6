//! Division by a divisor fixed when a policy is built.

/// Divides by `d` with two multiplications instead of a `div` instruction:
/// `m = ⌊2⁶⁴/d⌋` (`2⁶⁴ − 1` for `d = 1`) gives a quotient at most 1 below
/// the true one, which one conditional subtraction corrects. Exact for every
/// `u64` and `d ≥ 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Divisor {
    d: u64,
    m: u64,
}

impl Divisor {
    /// A divisor of `d`, with 0 taken as 1.
    pub(crate) const fn new(d: u64) -> Self {
        let d = if d == 0 { 1 } else { d };
        let m = if d == 1 {
            u64::MAX
        } else {
            ((1u128 << 64) / d as u128) as u64
        };
        Divisor { d, m }
    }

    /// The divisor.
    #[inline]
    pub(crate) fn get(self) -> u64 {
        self.d
    }

    /// `(x / d, x % d)`.
    #[inline]
    pub(crate) fn div_rem(self, x: u64) -> (u64, u64) {
        // m ≤ 2⁶⁴/d, so q ≤ x/d and q·d ≤ x; and 2⁶⁴/d − m < 1, so
        // x/d − q < x/2⁶⁴ + 1 < 2: q is ⌊x/d⌋ or one less.
        let q = ((u128::from(x) * u128::from(self.m)) >> 64) as u64;
        let r = x - q * self.d;
        if r >= self.d { (q + 1, r - self.d) } else { (q, r) }
    }

    /// `x % d`.
    #[inline]
    pub(crate) fn rem(self, x: u64) -> u64 {
        self.div_rem(x).1
    }

    /// `(x / d, x % d)` for a wide `x`, with the quotient saturated to `u64`.
    #[inline]
    pub(crate) fn div_rem_wide(self, x: u128) -> (u64, u64) {
        match u64::try_from(x) {
            Ok(x) => self.div_rem(x),
            Err(_) => {
                let d = u128::from(self.d);
                (u64::try_from(x / d).unwrap_or(u64::MAX), (x % d) as u64)
            }
        }
    }
}

/// `a / b` for a wide `a`, with a `u64` division when `a` fits.
#[inline]
pub(crate) fn div_wide(a: u128, b: u64) -> u128 {
    match u64::try_from(a) {
        Ok(a) => u128::from(a / b),
        Err(_) => a / u128::from(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn edges() {
        for d in [1, 2, 3, 7, 10, 1_000_000_007, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            let div = Divisor::new(d);
            for x in [
                0,
                1,
                d - 1,
                d,
                d.saturating_add(1),
                u64::MAX - 1,
                u64::MAX,
                u64::MAX / 3,
            ] {
                assert_eq!(div.div_rem(x), (x / d, x % d), "{x} / {d}");
            }
        }
        assert_eq!(Divisor::new(0).get(), 1);
        assert_eq!(
            Divisor::new(10).div_rem_wide(u128::from(u64::MAX) * 10 + 7),
            (u64::MAX, 7)
        );
        assert_eq!(Divisor::new(1).div_rem_wide(u128::MAX), (u64::MAX, 0));
        assert_eq!(div_wide(u128::from(u64::MAX) * 4, 2), u128::from(u64::MAX) * 2);
        assert_eq!(div_wide(9, 2), 4);
    }

    proptest! {
        #[test]
        fn exact_for_every_input(x: u64, d in 1u64..) {
            prop_assert_eq!(Divisor::new(d).div_rem(x), (x / d, x % d));
        }

        #[test]
        fn exact_for_small_divisors(x: u64, d in 1u64..100_000) {
            prop_assert_eq!(Divisor::new(d).div_rem(x), (x / d, x % d));
        }

        #[test]
        fn wide_is_exact(x: u128, d in 1u64..) {
            let (q, r) = Divisor::new(d).div_rem_wide(x);
            let d = u128::from(d);
            prop_assert_eq!(u128::from(q), (x / d).min(u128::from(u64::MAX)));
            prop_assert_eq!(u128::from(r), x % d);
        }
    }
}
