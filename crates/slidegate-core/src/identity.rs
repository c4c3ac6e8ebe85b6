//! [`Identity`]: what a store counts a limit under, written once.

use crate::policy::{Algorithm, Policy, Weighting};
use alloc::string::String;
use alloc::sync::Arc;
use core::fmt::{self, Write};

/// What every store counts a limit under: its text form, the version of
/// that form, a 64-bit digest of the text and its Redis key, all derived
/// from one text, so that two limits count together in every store or in
/// none.
///
/// The text of a policy ([`Identity::of`], [`Policy::tag`]) is
/// `v1:<algorithm>:<limit>:<window in ns>`, then `:<buckets><i|c>` for a
/// sliding window (interpolated or conservative), `:<burst>` for GCRA or
/// `:<epsilon>` for the exponential histogram: two policies that decide
/// differently never share it, and a policy keeps it across restarts,
/// reloads and instances. A consumer may name a count otherwise
/// ([`Identity::of_count`], [`Identity::parse`]) so that a count carries
/// over from one policy to another.
///
/// - The in-memory stores hold a key's count under the key's hash mixed
///   with [`Identity::digest`], FNV-1a of the text: the same in every
///   process, equal whenever the texts are. Two texts share a digest with
///   a probability of about `n² / 2⁶⁵` for `n` identities in use, no more
///   than the in-memory store's own 64-bit slots already allow (a wider
///   digest would not narrow them), and an identity is chosen by the
///   operator or the layer's builder, never by a client alone.
/// - Redis holds it under [`Identity::redis_key`],
///   `<prefix><text>:{<key>}`.
///
/// # Examples
///
/// ```
/// use slidegate_core::{Algorithm, Identity, Policy};
/// use std::time::Duration;
///
/// let policy = Policy::new(5, Duration::from_secs(60), Algorithm::FixedWindow).unwrap();
/// let identity = Identity::of(&policy);
/// assert_eq!(identity.as_str(), "v1:fixed_window:5:60000000000");
/// assert_eq!(identity.version(), Some(1));
/// assert_eq!(Identity::parse(identity.as_str()), Ok(identity.clone()));
/// assert_eq!(identity.redis_key("rl:", "user:42"), "rl:v1:fixed_window:5:60000000000:{user:42}");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    text: Arc<str>,
    digest: u64,
}

impl Identity {
    /// The version of the text form of a policy's identity. A change to
    /// the form bumps it, so that counts kept under an older text are never
    /// read as the new one's.
    pub const VERSION: u32 = 1;

    /// The identity of `policy`: its text is [`Policy::tag`].
    pub fn of(policy: &Policy) -> Identity {
        let mut text = String::with_capacity(48);
        // Writing into a `String` cannot fail.
        let _ = Identity::write(policy, &mut text);
        Identity::from_text(text)
    }

    /// The identity of the count of `policy` as the `place`-th limit of a
    /// rule whose limits are always charged together:
    /// `v1:<algorithm>:count:<window in ns><parameters>#<place>`, without
    /// the limit, so that a count carries over a change of the limit alone
    /// (their places tell a rule's counts apart). `gcra`'s state is
    /// measured in the limit's emission interval: its identity keeps the
    /// limit (`<its policy's text>#<place>`).
    pub fn of_count(policy: &Policy, place: usize) -> Identity {
        let mut text = String::with_capacity(48);
        let algorithm = policy.algorithm();
        // Writing into a `String` cannot fail.
        let _ = if matches!(algorithm, Algorithm::Gcra { .. }) {
            Identity::write(policy, &mut text).and_then(|()| write!(text, "#{place}"))
        } else {
            write!(
                text,
                "v{}:{}:count:{}",
                Self::VERSION,
                algorithm.name(),
                policy.window_ns()
            )
            .and_then(|()| write_parameters(algorithm, &mut text))
            .and_then(|()| write!(text, "#{place}"))
        };
        Identity::from_text(text)
    }

    /// The identity whose text is `text`: any text without `{` or `}`
    /// (Redis keys put the counted key in braces), not empty.
    ///
    /// # Errors
    ///
    /// [`IdentityError`] for an empty text or one with `{` or `}`.
    pub fn parse(text: &str) -> Result<Identity, IdentityError> {
        let reason = if text.is_empty() {
            "it is empty"
        } else if text.contains(['{', '}']) {
            "it must not contain `{` or `}`"
        } else {
            return Ok(Identity::from_text(text));
        };
        Err(IdentityError {
            text: text.into(),
            reason,
        })
    }

    /// Writes the text of [`Identity::of`]`(policy)` into `out`, without
    /// allocating.
    ///
    /// # Errors
    ///
    /// Only those of `out`.
    pub fn write<W: Write>(policy: &Policy, out: &mut W) -> fmt::Result {
        let algorithm = policy.algorithm();
        write!(
            out,
            "v{}:{}:{}:{}",
            Self::VERSION,
            algorithm.name(),
            policy.limit(),
            policy.window_ns()
        )?;
        write_parameters(algorithm, out)
    }

    /// [`Identity::digest`] of [`Identity::of`]`(policy)`, hashed as the
    /// text would be written, without formatting or allocating: a quota is
    /// made per request on some paths (the ad-hoc API's).
    pub fn digest_of(policy: &Policy) -> u64 {
        let algorithm = policy.algorithm();
        let fnv = Fnv::new()
            .byte(b'v')
            .decimal(u64::from(Self::VERSION))
            .byte(b':')
            .bytes(algorithm.name().as_bytes())
            .byte(b':')
            .decimal(policy.limit())
            .byte(b':')
            .decimal(policy.window_ns());
        match algorithm {
            Algorithm::SlidingWindow { buckets, weighting } => {
                let w = if weighting == Weighting::Conservative {
                    b'c'
                } else {
                    b'i'
                };
                fnv.byte(b':').decimal(u64::from(buckets)).byte(w).0
            }
            Algorithm::Gcra { burst } => fnv.byte(b':').decimal(burst).0,
            Algorithm::FixedWindow | Algorithm::SlidingLog => fnv.0,
            Algorithm::ExponentialHistogram { .. } => {
                let mut fnv = fnv;
                // Hashing cannot fail.
                let _ = write_parameters(algorithm, &mut fnv);
                fnv.0
            }
        }
    }

    fn from_text(text: impl Into<Arc<str>>) -> Identity {
        let text = text.into();
        let digest = Fnv::new().bytes(text.as_bytes()).0;
        Identity { text, digest }
    }

    /// The text form.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The version of the form the text is written in: `n` for a text
    /// that starts `v<n>:` (every identity this type writes), `None` for a
    /// name a consumer gave in no versioned form.
    pub fn version(&self) -> Option<u32> {
        let rest = self.text.strip_prefix('v')?;
        let (digits, _) = rest.split_once(':')?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    /// FNV-1a of the text: the same in every process, equal whenever the
    /// texts are; what in-memory stores hash a key together with.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// The Redis key of `key`'s count under this identity:
    /// `<prefix><text>:{<key>}` (the braces are the key's hash tag, so that
    /// a Redis Cluster keeps all of a key's counts in one slot).
    pub fn redis_key(&self, prefix: &str, key: &str) -> String {
        let mut out = String::with_capacity(prefix.len() + self.text.len() + key.len() + 3);
        out.push_str(prefix);
        out.push_str(&self.text);
        out.push_str(":{");
        out.push_str(key);
        out.push('}');
        out
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Identity").field(&&*self.text).finish()
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A policy's own identity, as text (its [`Identity::of`]).
impl Policy {
    /// The version of [`Policy::tag`]'s format: [`Identity::VERSION`].
    pub const TAG_VERSION: u32 = Identity::VERSION;

    /// The policy's stable identity as text, [`Identity::of`]'s:
    /// `v1:<algorithm>:<limit>:<window in ns>`, then `:<buckets><i|c>` for
    /// a sliding window (interpolated or conservative), `:<burst>` for GCRA
    /// or `:<epsilon>` for the exponential histogram. Two policies that
    /// decide differently never share a tag, and a policy keeps its tag
    /// across restarts, reloads and instances: stores key their counts by
    /// it (memory keys, Redis keys) and metrics name limits by it.
    pub fn tag(&self) -> String {
        let mut out = String::with_capacity(48);
        // Writing into a `String` cannot fail.
        let _ = self.write_tag(&mut out);
        out
    }

    /// Writes [`Policy::tag`] into `out`, without allocating
    /// ([`Identity::write`]).
    ///
    /// # Errors
    ///
    /// Only those of `out`.
    pub fn write_tag<W: Write>(&self, out: &mut W) -> fmt::Result {
        Identity::write(self, out)
    }
}

/// A text that cannot be an [`Identity`], with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdentityError {
    /// The text as given.
    pub text: String,
    /// Why it cannot be one.
    pub reason: &'static str,
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid identity `{}`: {}", self.text, self.reason)
    }
}

impl core::error::Error for IdentityError {}

/// `:<buckets><i|c>`, `:<burst>` or `:<epsilon>`, as the algorithm has.
fn write_parameters<W: Write>(algorithm: Algorithm, out: &mut W) -> fmt::Result {
    match algorithm {
        Algorithm::SlidingWindow { buckets, weighting } => {
            let w = if weighting == Weighting::Conservative { 'c' } else { 'i' };
            write!(out, ":{buckets}{w}")
        }
        Algorithm::Gcra { burst } => write!(out, ":{burst}"),
        Algorithm::ExponentialHistogram { epsilon } => write!(out, ":{epsilon}"),
        Algorithm::FixedWindow | Algorithm::SlidingLog => Ok(()),
    }
}

/// FNV-1a (64-bit), fed bytes or written to.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn byte(mut self, b: u8) -> Self {
        self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        self
    }

    fn bytes(self, bytes: &[u8]) -> Self {
        bytes.iter().fold(self, |fnv, &b| fnv.byte(b))
    }

    /// `v` in decimal, as `Display` writes it.
    fn decimal(self, mut v: u64) -> Self {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            if let Some(d) = digits.get_mut(start) {
                // A digit: `v % 10` is below 10.
                *d = b'0' + (v % 10) as u8;
            }
            v /= 10;
            if v == 0 || start == 0 {
                break;
            }
        }
        self.bytes(digits.get(start..).unwrap_or_default())
    }
}

impl Write for Fnv {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0 = Fnv(self.0).bytes(s.as_bytes()).0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    fn policies() -> alloc::vec::Vec<Policy> {
        let w = Duration::from_secs(60);
        let mut out = alloc::vec::Vec::new();
        for algorithm in [
            Algorithm::SlidingWindow {
                buckets: 8,
                weighting: Weighting::Conservative,
            },
            Algorithm::SlidingWindow {
                buckets: 2,
                weighting: Weighting::Interpolated,
            },
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::Gcra { burst: 3 },
            Algorithm::ExponentialHistogram { epsilon: 0.01 },
        ] {
            for (limit, window) in [(10, w), (11, w), (10, w * 2)] {
                out.push(Policy::new(limit, window, algorithm).unwrap());
            }
        }
        out
    }

    /// FNV-1a of `text`, from its definition.
    fn fnv(text: &str) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        h
    }

    #[test]
    fn text_parses_to_the_same_identity() {
        for policy in policies() {
            for identity in [Identity::of(&policy), Identity::of_count(&policy, 2)] {
                let parsed = Identity::parse(identity.as_str()).unwrap();
                assert_eq!(parsed, identity);
                assert_eq!(parsed.digest(), identity.digest());
                assert_eq!(parsed.version(), Some(Identity::VERSION));
                assert_eq!(parsed.to_string(), identity.as_str());
            }
        }
    }

    #[test]
    fn the_digest_is_fnv_of_the_text_and_stable() {
        for policy in policies() {
            let identity = Identity::of(&policy);
            assert_eq!(identity.as_str(), policy.tag());
            assert_eq!(identity.digest(), fnv(identity.as_str()));
            assert_eq!(Identity::digest_of(&policy), identity.digest());
        }
        for limit in [1, 9, 10, 99, 100, u64::MAX >> 1] {
            let policy = Policy::new(limit, Duration::from_nanos(1), Algorithm::Gcra { burst: u64::MAX }).unwrap();
            assert_eq!(Identity::digest_of(&policy), fnv(&policy.tag()), "{}", policy.tag());
        }
        // Fixed for good: counts are found by it in every process.
        let policy = Policy::new(100, Duration::from_secs(60), Algorithm::FixedWindow).unwrap();
        assert_eq!(Identity::of(&policy).as_str(), "v1:fixed_window:100:60000000000");
        assert_eq!(Identity::digest_of(&policy), 0xe470_ff5c_6cfd_b0b4);
    }

    #[test]
    fn identities_tell_policies_apart() {
        let all: alloc::vec::Vec<Identity> = policies().iter().map(Identity::of).collect();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
                assert_ne!(a.digest(), b.digest(), "{a} and {b}");
            }
        }
    }

    #[test]
    fn the_redis_key_is_the_text_and_the_key_in_braces() {
        let ring = Algorithm::SlidingWindow {
            buckets: 8,
            weighting: Weighting::Conservative,
        };
        let policy = Policy::new(100, Duration::from_secs(60), ring).unwrap();
        let identity = Identity::of(&policy);
        assert_eq!(
            identity.redis_key("slidegate:", "user:42"),
            "slidegate:v1:sliding_window:100:60000000000:8c:{user:42}"
        );
        let parsed = Identity::parse(identity.as_str()).unwrap();
        assert_eq!(parsed.redis_key("p:", "k"), identity.redis_key("p:", "k"));
    }

    #[test]
    fn counts_of_a_rule_keep_the_limit_out_but_gcras() {
        let w = Duration::from_secs(60);
        let ring = Algorithm::SlidingWindow {
            buckets: 8,
            weighting: Weighting::Conservative,
        };
        let (a, b) = (Policy::new(10, w, ring).unwrap(), Policy::new(20, w, ring).unwrap());
        assert_eq!(
            Identity::of_count(&a, 0).as_str(),
            "v1:sliding_window:count:60000000000:8c#0"
        );
        assert_eq!(Identity::of_count(&a, 0), Identity::of_count(&b, 0));
        assert_ne!(Identity::of_count(&a, 0), Identity::of_count(&a, 1));
        let gcra = Policy::new(10, w, Algorithm::Gcra { burst: 2 }).unwrap();
        assert_eq!(Identity::of_count(&gcra, 1).as_str(), "v1:gcra:10:60000000000:2#1");
    }

    #[test]
    fn bad_texts_are_refused_and_names_have_no_version() {
        assert!(Identity::parse("").is_err());
        let braces = Identity::parse("v1:a{b}").unwrap_err();
        assert_eq!(
            braces.to_string(),
            "invalid identity `v1:a{b}`: it must not contain `{` or `}`"
        );
        let name = Identity::parse("rule-7").unwrap();
        assert_eq!((name.as_str(), name.version()), ("rule-7", None));
        assert_eq!(Identity::parse("v:x").unwrap().version(), None);
        assert_eq!(Identity::parse("v2:x").unwrap().version(), Some(2));
    }
}
