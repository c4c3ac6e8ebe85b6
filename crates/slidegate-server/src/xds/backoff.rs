//! The delay before each reconnection to the control plane.

use std::time::Duration;

/// How long the xDS client waits before it connects again, after a failed
/// connection or a lost stream: envoyproxy/ratelimit's
/// `XDS_CLIENT_BACKOFF_*` settings.
///
/// The `n`-th wait in a row (from 0) is `initial × 2ⁿ`, at most `max`;
/// with `jitter`, that is multiplied by a factor drawn uniformly from
/// `[1 − random_factor, 1 + random_factor]`, and again held to `max`. A
/// stream that brought at least one response starts the count again.
///
/// ```
/// use slidegate_server::xds::XdsBackoff;
/// use std::time::Duration;
///
/// let backoff = XdsBackoff { jitter: false, ..XdsBackoff::default() };
/// let waits: Vec<u64> = (0..5).map(|n| backoff.delay(n, 0.0).as_secs()).collect();
/// assert_eq!(waits, [10, 20, 40, 60, 60]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct XdsBackoff {
    /// The first wait (`XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`, 10 s by
    /// default).
    pub initial: Duration,
    /// The longest wait (`XDS_CLIENT_BACKOFF_MAX_INTERVAL`, 60 s by
    /// default).
    pub max: Duration,
    /// How far jitter moves a wait, from 0 to 1
    /// (`XDS_CLIENT_BACKOFF_RANDOM_FACTOR`, 0.5 by default).
    pub random_factor: f64,
    /// Whether waits are jittered (`XDS_CLIENT_BACKOFF_JITTER`, on by
    /// default), so that many instances do not reconnect in step.
    pub jitter: bool,
}

impl Default for XdsBackoff {
    fn default() -> Self {
        XdsBackoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            random_factor: 0.5,
            jitter: true,
        }
    }
}

impl XdsBackoff {
    /// The wait before reconnection `attempt` (from 0: the first after a
    /// good stream), `unit` being a random number in `[0, 1)` (unused
    /// without jitter).
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let doubled = 2u32
            .checked_pow(attempt)
            .and_then(|factor| self.initial.checked_mul(factor))
            .unwrap_or(self.max);
        let base = doubled.min(self.max);
        if !self.jitter {
            return base;
        }
        let unit = if unit.is_finite() { unit.clamp(0.0, 1.0) } else { 0.5 };
        let factor = 1.0 - self.random_factor + 2.0 * self.random_factor * unit;
        Duration::try_from_secs_f64(base.as_secs_f64() * factor)
            .unwrap_or(base)
            .min(self.max)
    }

    /// Why these settings cannot be used, if they cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.initial.is_zero() {
            return Err("the initial backoff interval must be more than 0".to_owned());
        }
        if self.max < self.initial {
            return Err(format!(
                "the maximum backoff interval ({:?}) is shorter than the initial one ({:?})",
                self.max, self.initial
            ));
        }
        if !(0.0..=1.0).contains(&self.random_factor) {
            return Err(format!(
                "the backoff's random factor must be from 0 to 1, found {}",
                self.random_factor
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// Without jitter: doubling from the initial wait, held to the
    /// maximum, and no overflow however long it goes on.
    #[test]
    fn doubles_up_to_the_maximum() {
        let backoff = XdsBackoff {
            initial: S,
            max: 30 * S,
            random_factor: 0.5,
            jitter: false,
        };
        let waits: Vec<Duration> = (0..7).map(|n| backoff.delay(n, 0.9)).collect();
        assert_eq!(waits, [S, 2 * S, 4 * S, 8 * S, 16 * S, 30 * S, 30 * S]);
        assert_eq!(backoff.delay(64, 0.0), 30 * S);
        assert_eq!(backoff.delay(u32::MAX, 0.0), 30 * S);
        // envoyproxy/ratelimit's defaults.
        let upstream = XdsBackoff {
            jitter: false,
            ..XdsBackoff::default()
        };
        let waits: Vec<Duration> = (0..4).map(|n| upstream.delay(n, 0.0)).collect();
        assert_eq!(waits, [10 * S, 20 * S, 40 * S, 60 * S]);
    }

    /// With jitter: the random factor's bounds at the ends of `unit`, the
    /// middle unchanged, and never past the maximum.
    #[test]
    fn jitter_spreads_each_wait() {
        let backoff = XdsBackoff {
            initial: 10 * S,
            max: 60 * S,
            random_factor: 0.5,
            jitter: true,
        };
        assert_eq!(backoff.delay(0, 0.0), 5 * S);
        assert_eq!(backoff.delay(0, 0.5), 10 * S);
        assert_eq!(backoff.delay(0, 1.0), 15 * S);
        assert_eq!(backoff.delay(1, 0.0), 10 * S);
        assert_eq!(backoff.delay(2, 1.0), 60 * S, "40 s × 1.5, held to 60 s");
        assert_eq!(backoff.delay(9, 0.0), 30 * S);
        let none = XdsBackoff {
            random_factor: 0.0,
            ..backoff
        };
        assert_eq!(none.delay(1, 0.99), 20 * S);
    }

    #[test]
    fn bad_settings_are_named() {
        let zero = XdsBackoff {
            initial: Duration::ZERO,
            ..XdsBackoff::default()
        };
        assert!(zero.check().unwrap_err().contains("initial"));
        let short = XdsBackoff {
            max: S,
            ..XdsBackoff::default()
        };
        assert!(short.check().unwrap_err().contains("shorter"));
        let wild = XdsBackoff {
            random_factor: 1.5,
            ..XdsBackoff::default()
        };
        assert!(wild.check().unwrap_err().contains("1.5"));
        assert!(XdsBackoff::default().check().is_ok());
    }
}
