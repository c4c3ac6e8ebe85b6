//! The Rate Limit Quota Service's engine: Envoy's `rate_limit_quota`
//! filter reports each quota bucket's use on a stream, and gets back for
//! each a token bucket, a blanket rule or an abandon. [`share`] decides how
//! one bucket's limit is split between the streams that report it.

pub mod ledgers;
pub mod share;
