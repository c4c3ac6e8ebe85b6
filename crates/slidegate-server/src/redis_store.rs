//! Redis as the engine's shared counter store: several instances of the
//! service on one Redis (or one Redis Cluster) share their limits.
//!
//! The store is built by `slidegate-redis` from [`RedisOptions`]
//! ([`RedisOptions::connect_probed`]: [`RedisStore`](slidegate_redis::RedisStore)
//! behind the failure policy). A counter's
//! Redis key is `<prefix><policy tag>:{<counter key>}` where the tag is
//! [`Policy::tag`](slidegate_core::Policy::tag)
//! (`v1:sliding_window:100:60000000000:8c`) and the counter key is
//! the readable one of [`Match::counter_key`](crate::config::Match::counter_key)
//! (or `adhoc:<key>` for `/v1/check`'s ad-hoc keys): the same on every
//! instance, so that they count together; a changed limit starts afresh,
//! an unchanged one keeps counting across reloads and restarts.
//!
//! What stays here is the service's own: the log lines of an outage
//! ([`OutageLog`]) and the failure policy's name in them.

pub use slidegate_redis::{RedisConnectError, RedisOptions};
use slidegate_store::FailurePolicy;

/// What the log says about the store's health: one warning when Redis
/// starts failing and one line when it answers again, never one per
/// request. Fed the failure policy's figures at each look (every second).
#[derive(Debug, Default)]
pub struct OutageLog {
    /// The figures at the last look: outages met, decisions of Redis.
    seen: (u64, u64),
    failing: bool,
}

/// A change the log reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Redis started failing: this many calls met an outage since the
    /// last look.
    Failing(u64),
    /// Redis answers again.
    Recovered,
}

impl OutageLog {
    /// The change since the last look, given the failure policy's figures
    /// now: calls that met an outage, and decisions Redis made.
    pub fn observe(&mut self, stats: &slidegate_store::FailOverStats) -> Option<Transition> {
        let now = (stats.outages, stats.store_admitted + stats.store_refused);
        let (outages, decided) = (now.0.saturating_sub(self.seen.0), now.1.saturating_sub(self.seen.1));
        self.seen = now;
        match (self.failing, outages > 0, decided > 0) {
            (false, true, _) => {
                self.failing = true;
                Some(Transition::Failing(outages))
            }
            (true, false, true) => {
                self.failing = false;
                Some(Transition::Recovered)
            }
            _ => None,
        }
    }
}

/// The failure policy as the log names it.
pub fn policy_name(policy: FailurePolicy) -> String {
    match policy {
        FailurePolicy::Open => "open (admit)".to_owned(),
        FailurePolicy::Closed => "closed (refuse)".to_owned(),
        FailurePolicy::Local { instances } => format!("local (count in memory on the limit / {instances})"),
        _ => "unknown".to_owned(),
    }
}

#[cfg(test)]
mod outage_tests {
    use super::*;
    use slidegate_store::FailOverStats;

    fn stats(outages: u64, decided: u64) -> FailOverStats {
        let mut stats = FailOverStats::default();
        stats.outages = outages;
        stats.store_admitted = decided;
        stats
    }

    #[test]
    fn one_line_when_redis_fails_and_one_when_it_is_back() {
        let mut log = OutageLog::default();
        assert_eq!(log.observe(&stats(0, 10)), None);
        // Failing: one warning, however long it lasts.
        assert_eq!(log.observe(&stats(5, 10)), Some(Transition::Failing(5)));
        assert_eq!(log.observe(&stats(900, 10)), None);
        assert_eq!(log.observe(&stats(1800, 12)), None);
        // No outage and Redis decides again: recovered, once.
        assert_eq!(log.observe(&stats(1800, 20)), Some(Transition::Recovered));
        assert_eq!(log.observe(&stats(1800, 30)), None);
        // Idle (nothing asked): no line either way.
        assert_eq!(log.observe(&stats(1800, 30)), None);
        assert_eq!(log.observe(&stats(1801, 30)), Some(Transition::Failing(1)));
        // A quiet second alone is not a recovery.
        assert_eq!(log.observe(&stats(1801, 30)), None);
        assert_eq!(log.observe(&stats(1801, 31)), Some(Transition::Recovered));
    }
}
