//! What a limit is: how many, per how long, by which algorithm.

use crate::div::Divisor;
use alloc::format;
use alloc::string::{String, ToString};
use core::fmt;
use core::str::FromStr;
use core::time::Duration;

/// How `sliding_window` weighs its oldest bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Weighting {
    /// The oldest bucket is weighted by the part of it still inside the
    /// window, assuming its events were spread evenly (seed 000, Cloudflare).
    /// The estimate is off by at most the oldest bucket's count; an adversary
    /// can get up to `2·limit − 1` admitted in one window.
    Interpolated,
    /// The oldest bucket is counted whole: never admits more than `limit` in
    /// any window of length `(n − 1)·b`, and may refuse up to one bucket's
    /// count early. The default.
    #[default]
    Conservative,
}

impl Weighting {
    /// The name used in the CLI, YAML and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Weighting::Interpolated => "interpolated",
            Weighting::Conservative => "conservative",
        }
    }
}

impl fmt::Display for Weighting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Weighting {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s {
            "interpolated" => Ok(Weighting::Interpolated),
            "conservative" => Ok(Weighting::Conservative),
            _ => Err(ParseError {
                what: "weighting",
                value: s.to_string(),
                expected: "interpolated, conservative",
            }),
        }
    }
}

/// The algorithm of a [`Policy`] and its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    /// A ring of `buckets` (n ≥ 2) sub-buckets of width `b = ⌈W / (n − 1)⌉`
    /// with a running total (seed 000); `buckets: 2` is the classic
    /// two-bucket estimate (seeds 003 and 004).
    SlidingWindow {
        /// Number of sub-buckets `n` in the ring, at least 2 and at most
        /// [`Policy::MAX_BUCKETS`].
        buckets: u32,
        /// How the oldest bucket is weighted.
        weighting: Weighting,
    },
    /// One counter per fixed window; resets at each multiple of the window.
    FixedWindow,
    /// The exact log of admitted requests over `(now − W, now]` (seed 002).
    SlidingLog,
    /// The generic cell rate algorithm: one request every `W / limit`, with
    /// up to `burst` admitted at once.
    Gcra {
        /// How many requests may pass at once, at least 1.
        burst: u64,
    },
    /// An exponential histogram (DGIM) over time whose estimate of the
    /// window's count has a relative error of at most `epsilon`.
    ExponentialHistogram {
        /// The relative error bound, in `[0.000001, 1)`.
        epsilon: f64,
    },
}

impl Algorithm {
    /// Every algorithm name, as used in the CLI, YAML and JSON.
    pub const NAMES: [&'static str; 5] = [
        "sliding_window",
        "fixed_window",
        "sliding_log",
        "gcra",
        "exponential_histogram",
    ];

    /// The interpolated two-bucket sliding window (Cloudflare's).
    pub const TWO_BUCKETS: Algorithm = Algorithm::SlidingWindow {
        buckets: 2,
        weighting: Weighting::Interpolated,
    };

    /// The algorithm of a limit that names none: `sliding_window` with
    /// [`AlgorithmSpec::DEFAULT_BUCKETS`] (8) buckets, conservative.
    pub const DEFAULT: Algorithm = Algorithm::SlidingWindow {
        buckets: AlgorithmSpec::DEFAULT_BUCKETS,
        weighting: Weighting::Conservative,
    };

    /// The name used in the CLI, YAML and JSON.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::ExponentialHistogram { .. } => "exponential_histogram",
        }
    }

    /// The names of the parameters this algorithm takes, as in
    /// [`AlgorithmSpec`]: `buckets` and `weighting` for `sliding_window`,
    /// `burst` for `gcra`, `epsilon` for `exponential_histogram`, none for
    /// the others.
    pub fn parameters(&self) -> &'static [&'static str] {
        parameters_of(self.name())
    }

    /// Whether the parameters are in range: `buckets` in
    /// `2..=`[`Policy::MAX_BUCKETS`], `burst` at least 1, `epsilon` in
    /// `[0.000001, 1)`.
    fn check(&self) -> Result<(), PolicyError> {
        match *self {
            Algorithm::SlidingWindow { buckets, .. } if !(2..=Policy::MAX_BUCKETS).contains(&buckets) => Err(
                PolicyError::new("buckets", buckets.to_string(), "must be between 2 and 65536"),
            ),
            Algorithm::Gcra { burst: 0 } => Err(PolicyError::new("burst", "0", "must be at least 1")),
            Algorithm::ExponentialHistogram { epsilon } if !(1e-6..1.0).contains(&epsilon) => Err(PolicyError::new(
                "epsilon",
                epsilon.to_string(),
                "must be at least 0.000001 and below 1",
            )),
            _ => Ok(()),
        }
    }
}

/// The parameters of the algorithm called `name`; none for an unknown name.
fn parameters_of(name: &str) -> &'static [&'static str] {
    match name {
        "sliding_window" => &["buckets", "weighting"],
        "gcra" => &["burst"],
        "exponential_histogram" => &["epsilon"],
        _ => &[],
    }
}

/// An algorithm as a user names it: a name and the parameters given, each
/// optional. The one reader of algorithms for the CLI, the YAML config and
/// the JSON API, and so the one home of the defaults: no name is
/// [`Algorithm::DEFAULT`]; a parameter not given is the algorithm's default
/// ([`AlgorithmSpec::DEFAULT_BUCKETS`] conservative buckets, a `gcra` burst
/// of the limit, [`AlgorithmSpec::DEFAULT_EPSILON`]).
///
/// ```
/// use slidegate_core::{Algorithm, AlgorithmSpec, Weighting};
///
/// let gcra = AlgorithmSpec { name: Some("gcra"), burst: Some(3), ..AlgorithmSpec::default() };
/// assert_eq!(gcra.algorithm(100), Ok(Algorithm::Gcra { burst: 3 }));
/// let named = AlgorithmSpec::named("sliding_window").algorithm(100).unwrap();
/// assert_eq!(named, Algorithm::DEFAULT);
/// let wrong = AlgorithmSpec { burst: Some(3), ..AlgorithmSpec::named("sliding_log") };
/// assert_eq!(
///     wrong.algorithm(100).unwrap_err().to_string(),
///     "`burst` applies only to algorithm gcra, not sliding_log"
/// );
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AlgorithmSpec<'a> {
    /// One of [`Algorithm::NAMES`]; `None` for [`Algorithm::DEFAULT`].
    pub name: Option<&'a str>,
    /// `sliding_window`: the number of sub-buckets.
    pub buckets: Option<u32>,
    /// `sliding_window`: how the oldest bucket is weighted.
    pub weighting: Option<Weighting>,
    /// `gcra`: how many requests may pass at once.
    pub burst: Option<u64>,
    /// `exponential_histogram`: the relative error bound.
    pub epsilon: Option<f64>,
}

impl<'a> AlgorithmSpec<'a> {
    /// The number of buckets of a `sliding_window` that does not say.
    pub const DEFAULT_BUCKETS: u32 = 8;

    /// The relative error bound of an `exponential_histogram` that does not
    /// say.
    pub const DEFAULT_EPSILON: f64 = 0.01;

    /// The algorithm called `name`, without parameters.
    pub fn named(name: &'a str) -> Self {
        AlgorithmSpec {
            name: Some(name),
            ..AlgorithmSpec::default()
        }
    }

    /// The parameters given, by name, in the order of the fields.
    fn given(&self) -> impl Iterator<Item = &'static str> {
        [
            ("buckets", self.buckets.is_some()),
            ("weighting", self.weighting.is_some()),
            ("burst", self.burst.is_some()),
            ("epsilon", self.epsilon.is_some()),
        ]
        .into_iter()
        .filter_map(|(parameter, given)| given.then_some(parameter))
    }

    /// The spec without the parameters its algorithm does not take, for a
    /// command line whose flags serve several algorithms at once. An
    /// unknown name is kept, for [`AlgorithmSpec::algorithm`] to refuse.
    pub fn only_applicable(self) -> Self {
        let name = self.name.unwrap_or(Algorithm::DEFAULT.name());
        if !Algorithm::NAMES.contains(&name) {
            return self;
        }
        let takes = |parameter| parameters_of(name).contains(&parameter);
        AlgorithmSpec {
            name: self.name,
            buckets: self.buckets.filter(|_| takes("buckets")),
            weighting: self.weighting.filter(|_| takes("weighting")),
            burst: self.burst.filter(|_| takes("burst")),
            epsilon: self.epsilon.filter(|_| takes("epsilon")),
        }
    }

    /// The algorithm, with the defaults for what is not given; `limit` is
    /// the limit of the policy, the default `gcra` burst (at least 1).
    ///
    /// # Errors
    ///
    /// A [`SpecError`] naming the parameter at fault: an unknown name, a
    /// parameter the algorithm does not take (`burst` for
    /// `sliding_window`), or a value out of range (as [`Policy::new`]
    /// would refuse it).
    pub fn algorithm(&self, limit: u64) -> Result<Algorithm, SpecError> {
        let algorithm = match self.name {
            None => Algorithm::DEFAULT,
            Some("sliding_window") => Algorithm::SlidingWindow {
                buckets: Self::DEFAULT_BUCKETS,
                weighting: Weighting::default(),
            },
            Some("fixed_window") => Algorithm::FixedWindow,
            Some("sliding_log") => Algorithm::SlidingLog,
            Some("gcra") => Algorithm::Gcra { burst: limit.max(1) },
            Some("exponential_histogram") => Algorithm::ExponentialHistogram {
                epsilon: Self::DEFAULT_EPSILON,
            },
            Some(other) => {
                return Err(SpecError::UnknownName(ParseError {
                    what: "algorithm",
                    value: other.to_string(),
                    expected: "sliding_window, fixed_window, sliding_log, gcra, exponential_histogram",
                }));
            }
        };
        if let Some(parameter) = self.given().find(|p| !algorithm.parameters().contains(p)) {
            let belongs_to = Algorithm::NAMES
                .into_iter()
                .find(|name| parameters_of(name).contains(&parameter))
                .unwrap_or_default();
            return Err(SpecError::NotApplicable {
                parameter,
                belongs_to,
                algorithm: algorithm.name(),
            });
        }
        let algorithm = match algorithm {
            Algorithm::SlidingWindow { buckets, weighting } => Algorithm::SlidingWindow {
                buckets: self.buckets.unwrap_or(buckets),
                weighting: self.weighting.unwrap_or(weighting),
            },
            Algorithm::Gcra { burst } => Algorithm::Gcra {
                burst: self.burst.unwrap_or(burst),
            },
            Algorithm::ExponentialHistogram { epsilon } => Algorithm::ExponentialHistogram {
                epsilon: self.epsilon.unwrap_or(epsilon),
            },
            other => other,
        };
        algorithm.check().map_err(SpecError::Invalid)?;
        Ok(algorithm)
    }
}

/// Why an [`AlgorithmSpec`] names no valid algorithm.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpecError {
    /// The name is not one of [`Algorithm::NAMES`].
    UnknownName(ParseError),
    /// A parameter was given to an algorithm that does not take it.
    NotApplicable {
        /// The parameter: `buckets`, `weighting`, `burst` or `epsilon`.
        parameter: &'static str,
        /// The algorithm that takes it.
        belongs_to: &'static str,
        /// The algorithm named.
        algorithm: &'static str,
    },
    /// A parameter's value is out of range.
    Invalid(PolicyError),
}

impl SpecError {
    /// The parameter at fault: `algorithm` (the name), `buckets`,
    /// `weighting`, `burst` or `epsilon`.
    pub fn parameter(&self) -> &'static str {
        match self {
            SpecError::UnknownName(_) => "algorithm",
            SpecError::NotApplicable { parameter, .. } => parameter,
            SpecError::Invalid(e) => e.field,
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecError::UnknownName(e) => e.fmt(f),
            SpecError::NotApplicable {
                parameter,
                belongs_to,
                algorithm,
            } => write!(
                f,
                "`{parameter}` applies only to algorithm {belongs_to}, not {algorithm}"
            ),
            SpecError::Invalid(e) => e.fmt(f),
        }
    }
}

/// The message is the cause's own, so [`source`](core::error::Error::source)
/// is `None`.
impl core::error::Error for SpecError {}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Algorithm::SlidingWindow { buckets, weighting } => {
                write!(f, "sliding_window(buckets={buckets}, weighting={weighting})")
            }
            Algorithm::Gcra { burst } => write!(f, "gcra(burst={burst})"),
            Algorithm::ExponentialHistogram { epsilon } => write!(f, "exponential_histogram(epsilon={epsilon})"),
            other => f.write_str(other.name()),
        }
    }
}

/// A validated limit: at most `limit` units per `window`, by `algorithm`.
///
/// Built only through [`Policy::new`], which refuses values that make no
/// sense and precomputes what the algorithms need (bucket width, emission
/// interval), so that a decision does no validation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    limit: u64,
    window_ns: u64,
    algorithm: Algorithm,
    /// `sliding_window`: the bucket width `b`; `fixed_window`: the window;
    /// `gcra`: the emission interval `T`; otherwise the window. With the
    /// number of buckets (1 unless `sliding_window`), a divisor that divides
    /// without a `div` instruction.
    step: Divisor,
    ring: Divisor,
    /// `exponential_histogram`: ε in millionths, rounded down.
    epsilon_ppm: u64,
}

impl Policy {
    /// The largest number of sub-buckets a `sliding_window` may have.
    pub const MAX_BUCKETS: u32 = 1 << 16;

    /// A policy of at most `limit` units per `window` by `algorithm`.
    ///
    /// # Errors
    ///
    /// A [`PolicyError`] naming the field and value when `limit` is 0, the
    /// window is zero or longer than `u64::MAX` nanoseconds (about 584
    /// years), `buckets` is outside `2..=65536`, `burst` is 0, or `epsilon`
    /// is not in `[0.000001, 1)`.
    pub fn new(limit: u64, window: Duration, algorithm: Algorithm) -> Result<Policy, PolicyError> {
        if limit == 0 {
            return Err(PolicyError::new("limit", "0", "must be at least 1"));
        }
        let window_ns = u64::try_from(window.as_nanos())
            .map_err(|_| PolicyError::new("window", format!("{window:?}"), "must be at most u64::MAX nanoseconds"))?;
        if window_ns == 0 {
            return Err(PolicyError::new(
                "window",
                format!("{window:?}"),
                "must be longer than zero",
            ));
        }
        algorithm.check()?;
        let mut epsilon_ppm = 0;
        let step_ns = match algorithm {
            Algorithm::SlidingWindow { buckets, .. } => window_ns.div_ceil(u64::from(buckets) - 1),
            Algorithm::FixedWindow | Algorithm::SlidingLog => window_ns,
            Algorithm::Gcra { .. } => window_ns.div_ceil(limit),
            Algorithm::ExponentialHistogram { epsilon } => {
                // Rounded down, so the bound holds for the epsilon asked for.
                epsilon_ppm = (epsilon * 1e6) as u64;
                window_ns
            }
        };
        Ok(Policy {
            limit,
            window_ns,
            algorithm,
            step: Divisor::new(step_ns),
            ring: Divisor::new(match algorithm {
                Algorithm::SlidingWindow { buckets, .. } => u64::from(buckets),
                _ => 1,
            }),
            epsilon_ppm,
        })
    }

    /// The most units admitted per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window as asked for.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns)
    }

    /// The window in nanoseconds, as asked for.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// The algorithm and its parameters.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The window the algorithm really enforces, in nanoseconds. For
    /// `sliding_window` it is `(n − 1)·b` with `b = ⌈W / (n − 1)⌉`, which is
    /// at most `n − 2` ns longer than the window asked for (so a
    /// conservative guarantee over it also holds over `W`); for the others it
    /// is `W`.
    pub fn effective_window_ns(&self) -> u64 {
        match self.algorithm {
            Algorithm::SlidingWindow { buckets, .. } => self.step.get().saturating_mul(u64::from(buckets) - 1),
            _ => self.window_ns,
        }
    }

    /// `sliding_window`: the width of one bucket in ns; `fixed_window`: the
    /// window; `gcra`: the emission interval `⌈W / limit⌉` in ns.
    pub fn step_ns(&self) -> u64 {
        self.step.get()
    }

    /// Division by [`Policy::step_ns`].
    pub(crate) fn step(&self) -> Divisor {
        self.step
    }

    /// Division by the number of buckets of a `sliding_window`.
    pub(crate) fn ring(&self) -> Divisor {
        self.ring
    }

    /// `exponential_histogram`: ε in millionths, rounded down.
    pub(crate) fn epsilon_ppm(&self) -> u64 {
        self.epsilon_ppm
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {:?} by {}", self.limit, self.window(), self.algorithm)
    }
}

/// A policy value that makes no sense, with the field and value named.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyError {
    /// The field: `limit`, `window`, `buckets`, `burst` or `epsilon`.
    pub field: &'static str,
    /// The offending value as given.
    pub value: String,
    /// What the value must be.
    pub reason: &'static str,
}

impl PolicyError {
    fn new(field: &'static str, value: impl Into<String>, reason: &'static str) -> Self {
        PolicyError {
            field,
            value: value.into(),
            reason,
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} `{}`: {}", self.field, self.value, self.reason)
    }
}

impl core::error::Error for PolicyError {}

/// An unknown name for an algorithm or a weighting.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParseError {
    /// What was being parsed: `algorithm` or `weighting`.
    pub what: &'static str,
    /// The unknown name.
    pub value: String,
    /// The names that are known.
    pub expected: &'static str,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown {} `{}`, expected one of: {}",
            self.what, self.value, self.expected
        )
    }
}

impl core::error::Error for ParseError {}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn err(limit: u64, window: Duration, algorithm: Algorithm) -> String {
        Policy::new(limit, window, algorithm).unwrap_err().to_string()
    }

    #[test]
    fn tags_are_stable_and_tell_policies_apart() {
        let p = |limit, algorithm| Policy::new(limit, Duration::from_secs(60), algorithm).unwrap().tag();
        let window = |buckets, weighting| Algorithm::SlidingWindow { buckets, weighting };
        assert_eq!(
            p(100, window(8, Weighting::Conservative)),
            "v1:sliding_window:100:60000000000:8c"
        );
        assert_eq!(
            p(100, window(8, Weighting::Interpolated)),
            "v1:sliding_window:100:60000000000:8i"
        );
        assert_eq!(p(5, Algorithm::Gcra { burst: 2 }), "v1:gcra:5:60000000000:2");
        assert_eq!(p(5, Algorithm::FixedWindow), "v1:fixed_window:5:60000000000");
        assert_eq!(p(5, Algorithm::SlidingLog), "v1:sliding_log:5:60000000000");
        assert_eq!(
            p(5, Algorithm::ExponentialHistogram { epsilon: 0.01 }),
            "v1:exponential_histogram:5:60000000000:0.01"
        );
        assert_ne!(p(5, Algorithm::SlidingLog), p(6, Algorithm::SlidingLog));
    }

    #[test]
    fn bad_values_name_field_and_value() {
        let w = Duration::from_secs(60);
        assert_eq!(
            err(0, w, Algorithm::SlidingLog),
            "invalid limit `0`: must be at least 1"
        );
        assert_eq!(
            err(1, Duration::ZERO, Algorithm::SlidingLog),
            "invalid window `0ns`: must be longer than zero"
        );
        assert!(err(1, Duration::MAX, Algorithm::SlidingLog).starts_with("invalid window `"));
        let one = Algorithm::SlidingWindow {
            buckets: 1,
            weighting: Weighting::Interpolated,
        };
        assert_eq!(err(1, w, one), "invalid buckets `1`: must be between 2 and 65536");
        let huge = Algorithm::SlidingWindow {
            buckets: 70_000,
            weighting: Weighting::Conservative,
        };
        assert_eq!(err(1, w, huge), "invalid buckets `70000`: must be between 2 and 65536");
        assert_eq!(
            err(1, w, Algorithm::Gcra { burst: 0 }),
            "invalid burst `0`: must be at least 1"
        );
        for bad in [0.0, 1.0, -0.5, f64::NAN, f64::INFINITY] {
            let e = err(1, w, Algorithm::ExponentialHistogram { epsilon: bad });
            assert!(e.starts_with("invalid epsilon `"), "{e}");
        }
    }

    #[test]
    fn derived_values() {
        let w = Duration::from_secs(60);
        let p = Policy::new(
            100,
            w,
            Algorithm::SlidingWindow {
                buckets: 61,
                weighting: Weighting::Interpolated,
            },
        )
        .unwrap();
        assert_eq!(p.step_ns(), 1_000_000_000);
        assert_eq!(p.effective_window_ns(), 60_000_000_000);
        // 60 s over 7 buckets does not divide: the bucket is rounded up.
        let p = Policy::new(
            100,
            w,
            Algorithm::SlidingWindow {
                buckets: 8,
                weighting: Weighting::Interpolated,
            },
        )
        .unwrap();
        assert_eq!(p.step_ns(), 8_571_428_572);
        assert_eq!(p.effective_window_ns(), 60_000_000_004);
        let p = Policy::new(3, Duration::from_nanos(10), Algorithm::Gcra { burst: 1 }).unwrap();
        assert_eq!(p.step_ns(), 4);
        let p = Policy::new(3, w, Algorithm::ExponentialHistogram { epsilon: 0.0100000001 }).unwrap();
        assert_eq!(p.epsilon_ppm(), 10_000);
    }

    #[test]
    fn names_round_trip() {
        for name in Algorithm::NAMES {
            assert_eq!(AlgorithmSpec::named(name).algorithm(7).unwrap().name(), name);
        }
        assert_eq!("conservative".parse::<Weighting>().unwrap(), Weighting::Conservative);
        assert!("both".parse::<Weighting>().unwrap_err().to_string().contains("`both`"));
    }

    /// The spec's algorithm for a limit of 10, or its error's parameter and
    /// message.
    fn spec(spec: AlgorithmSpec<'_>) -> Result<Algorithm, (&'static str, String)> {
        spec.algorithm(10).map_err(|e| (e.parameter(), e.to_string()))
    }

    #[test]
    fn spec_defaults() {
        assert_eq!(spec(AlgorithmSpec::default()), Ok(Algorithm::DEFAULT));
        let eight = Algorithm::SlidingWindow {
            buckets: 8,
            weighting: Weighting::Conservative,
        };
        assert_eq!(Algorithm::DEFAULT, eight);
        assert_eq!(spec(AlgorithmSpec::named("sliding_window")), Ok(eight));
        assert_eq!(spec(AlgorithmSpec::named("fixed_window")), Ok(Algorithm::FixedWindow));
        assert_eq!(spec(AlgorithmSpec::named("sliding_log")), Ok(Algorithm::SlidingLog));
        assert_eq!(spec(AlgorithmSpec::named("gcra")), Ok(Algorithm::Gcra { burst: 10 }));
        assert_eq!(
            spec(AlgorithmSpec::named("exponential_histogram")),
            Ok(Algorithm::ExponentialHistogram { epsilon: 0.01 })
        );
        // A limit of 0 has no policy; its algorithm is still valid.
        assert_eq!(
            AlgorithmSpec::named("gcra").algorithm(0),
            Ok(Algorithm::Gcra { burst: 1 })
        );
    }

    #[test]
    fn spec_parameters() {
        let window = AlgorithmSpec {
            buckets: Some(2),
            weighting: Some(Weighting::Interpolated),
            ..AlgorithmSpec::named("sliding_window")
        };
        assert_eq!(spec(window), Ok(Algorithm::TWO_BUCKETS));
        // Without a name, the parameters change the default.
        let unnamed = AlgorithmSpec {
            buckets: Some(16),
            ..AlgorithmSpec::default()
        };
        assert_eq!(
            spec(unnamed),
            Ok(Algorithm::SlidingWindow {
                buckets: 16,
                weighting: Weighting::Conservative
            })
        );
        let interpolated = AlgorithmSpec {
            weighting: Some(Weighting::Interpolated),
            ..AlgorithmSpec::default()
        };
        assert_eq!(
            spec(interpolated),
            Ok(Algorithm::SlidingWindow {
                buckets: 8,
                weighting: Weighting::Interpolated
            })
        );
        let gcra = AlgorithmSpec {
            burst: Some(3),
            ..AlgorithmSpec::named("gcra")
        };
        assert_eq!(spec(gcra), Ok(Algorithm::Gcra { burst: 3 }));
        let histogram = AlgorithmSpec {
            epsilon: Some(0.1),
            ..AlgorithmSpec::named("exponential_histogram")
        };
        assert_eq!(spec(histogram), Ok(Algorithm::ExponentialHistogram { epsilon: 0.1 }));
    }

    #[test]
    fn spec_refuses_a_parameter_of_another_algorithm() {
        let check = |spec_: AlgorithmSpec<'_>, parameter: &str, message: &str| {
            assert_eq!(
                spec(spec_),
                Err((parameter, message.to_string())) as Result<Algorithm, _>
            );
        };
        check(
            AlgorithmSpec {
                burst: Some(3),
                ..AlgorithmSpec::named("sliding_window")
            },
            "burst",
            "`burst` applies only to algorithm gcra, not sliding_window",
        );
        check(
            AlgorithmSpec {
                epsilon: Some(0.1),
                ..AlgorithmSpec::default()
            },
            "epsilon",
            "`epsilon` applies only to algorithm exponential_histogram, not sliding_window",
        );
        check(
            AlgorithmSpec {
                buckets: Some(4),
                ..AlgorithmSpec::named("gcra")
            },
            "buckets",
            "`buckets` applies only to algorithm sliding_window, not gcra",
        );
        check(
            AlgorithmSpec {
                weighting: Some(Weighting::Conservative),
                ..AlgorithmSpec::named("fixed_window")
            },
            "weighting",
            "`weighting` applies only to algorithm sliding_window, not fixed_window",
        );
        check(
            AlgorithmSpec {
                burst: Some(1),
                ..AlgorithmSpec::named("exponential_histogram")
            },
            "burst",
            "`burst` applies only to algorithm gcra, not exponential_histogram",
        );
        // An unknown name is refused before its parameters are looked at.
        check(
            AlgorithmSpec {
                burst: Some(1),
                ..AlgorithmSpec::named("leaky")
            },
            "algorithm",
            "unknown algorithm `leaky`, expected one of: sliding_window, fixed_window, sliding_log, gcra, exponential_histogram",
        );
    }

    #[test]
    fn spec_names_bad_values() {
        let bad = |spec_: AlgorithmSpec<'_>| spec(spec_).unwrap_err();
        let buckets = |n| AlgorithmSpec {
            buckets: Some(n),
            ..AlgorithmSpec::default()
        };
        assert_eq!(
            bad(buckets(1)),
            (
                "buckets",
                "invalid buckets `1`: must be between 2 and 65536".to_string()
            )
        );
        assert_eq!(bad(buckets(65_537)).0, "buckets");
        assert!(spec(buckets(Policy::MAX_BUCKETS)).is_ok());
        assert_eq!(
            bad(AlgorithmSpec {
                burst: Some(0),
                ..AlgorithmSpec::named("gcra")
            }),
            ("burst", "invalid burst `0`: must be at least 1".to_string())
        );
        for epsilon in [0.0, 1.0, -0.5, f64::NAN, f64::INFINITY] {
            let (parameter, message) = bad(AlgorithmSpec {
                epsilon: Some(epsilon),
                ..AlgorithmSpec::named("exponential_histogram")
            });
            assert_eq!(parameter, "epsilon");
            assert!(message.starts_with("invalid epsilon `"), "{message}");
        }
    }

    #[test]
    fn only_applicable_drops_the_parameters_of_other_algorithms() {
        let all = |name| AlgorithmSpec {
            name: Some(name),
            buckets: Some(1),
            weighting: Some(Weighting::Interpolated),
            burst: Some(2),
            epsilon: Some(0.5),
        };
        assert_eq!(
            all("gcra").only_applicable().algorithm(10),
            Ok(Algorithm::Gcra { burst: 2 })
        );
        assert_eq!(
            all("sliding_log").only_applicable().algorithm(10),
            Ok(Algorithm::SlidingLog)
        );
        assert_eq!(
            all("exponential_histogram").only_applicable().algorithm(10),
            Ok(Algorithm::ExponentialHistogram { epsilon: 0.5 })
        );
        // Its own parameters are still checked.
        assert_eq!(
            all("sliding_window")
                .only_applicable()
                .algorithm(10)
                .unwrap_err()
                .parameter(),
            "buckets"
        );
        assert_eq!(
            all("leaky").only_applicable().algorithm(10).unwrap_err().parameter(),
            "algorithm"
        );
    }
}
