//! slidegate's rate limit service.
#![forbid(unsafe_code)]
