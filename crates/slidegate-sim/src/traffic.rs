//! Traffic models: deterministic, time-sorted request streams from a seed.

use crate::SimError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use slidegate_core::{Algorithm, Policy};
use std::fmt;
use std::str::FromStr;

/// The most requests one generated stream may hold; a model whose expected
/// size is larger is refused with [`SimError::TooManyRequests`] before
/// anything is generated.
pub const MAX_REQUESTS: u64 = 10_000_000;

/// The most clients the `clients` model accepts.
pub const MAX_CLIENTS: u32 = 1_000_000;

/// How many independent clients `poisson` and `bursty` simulate.
pub const FEW_CLIENTS: u32 = 4;

/// The Pareto shape of the `clients` model's per-client rates.
pub const PARETO_ALPHA: f64 = 1.2;

/// One request: who sent it, when, and how many units it costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Request {
    /// Nanoseconds since the start of the simulation.
    pub time_ns: u64,
    /// The client (the rate-limit key); each client has its own limit.
    pub client: u32,
    /// Units the request costs; the models always send 1.
    pub cost: u64,
}

/// A traffic model.
///
/// Rates are relative to the policy: `L/W` is the limit per window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Traffic {
    /// [`FEW_CLIENTS`] clients, each with Poisson arrivals at `1.2·L/W`: a
    /// steady load a little over the limit.
    Poisson,
    /// [`FEW_CLIENTS`] clients, each on/off: on periods of exponential
    /// length (mean `W/4`) with Poisson arrivals at `5·L/W`, then silent off
    /// periods of exponential length (mean `W/2`).
    Bursty,
    /// One client running the end-of-bucket attack on the interpolated
    /// sliding window: `L` requests in the last 1/1000 of a bucket of width
    /// `b` (the policy's bucket for `sliding_window`, the window otherwise),
    /// nothing until that bucket is the oldest in the ring (`n − 1` buckets
    /// later), then `4·L` requests evenly over that bucket, then silence for
    /// a full window; repeated for the whole duration. The interpolated
    /// window admits about `2·L − 1` in some window; the conservative one at
    /// most `L`.
    Adversary,
    /// `clients` clients with heavy-tailed rates: Pareto(α =
    /// [`PARETO_ALPHA`]) times `0.25·L/W` (capped at `10·L/W`), so that about
    /// a fifth of the clients send more than their limit and more sit near
    /// it; each client is Poisson at its rate.
    Clients,
    /// `clients` clients as in [`Traffic::Clients`] but with rates of
    /// Pareto(α = [`PARETO_ALPHA`]) times [`MANY_SOURCES_SCALE`]`·L/W`
    /// (capped at `10·L/W`): many sources, few near their limit (about
    /// 0.3 % above `0.8·L/W`), resembling the traffic of Cloudflare's
    /// published measurement.
    ManySources,
}

/// The rate scale of [`Traffic::ManySources`], relative to `L/W`.
pub const MANY_SOURCES_SCALE: f64 = 0.005;

impl Traffic {
    /// Every model, in the order of [`Traffic::NAMES`].
    pub const ALL: [Traffic; 5] = [
        Traffic::Poisson,
        Traffic::Bursty,
        Traffic::Adversary,
        Traffic::Clients,
        Traffic::ManySources,
    ];

    /// Every model's name, as used in the CLI and in [`crate::Row`].
    pub const NAMES: [&'static str; 5] = ["poisson", "bursty", "adversary", "clients", "many-sources"];

    /// The model's name.
    pub fn name(self) -> &'static str {
        match self {
            Traffic::Poisson => "poisson",
            Traffic::Bursty => "bursty",
            Traffic::Adversary => "adversary",
            Traffic::Clients => "clients",
            Traffic::ManySources => "many-sources",
        }
    }

    /// A number that keeps the models' random streams apart.
    fn tag(self) -> u64 {
        match self {
            Traffic::Poisson => 1,
            Traffic::Bursty => 2,
            Traffic::Adversary => 3,
            Traffic::Clients => 4,
            Traffic::ManySources => 5,
        }
    }
}

impl fmt::Display for Traffic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Traffic {
    type Err = SimError;

    fn from_str(s: &str) -> Result<Self, SimError> {
        Traffic::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| SimError::UnknownTraffic { value: s.to_string() })
    }
}

/// Generates `traffic` for `policy` over `[0, duration_ns)`.
///
/// The result is sorted by time (then client) and is the same for the same
/// arguments on every platform. Every model depends on the policy's limit
/// and window only, except [`Traffic::Adversary`], which also depends on
/// the algorithm (its bucket width and ring). `clients` is used by
/// [`Traffic::Clients`] and [`Traffic::ManySources`] only.
///
/// # Errors
///
/// [`SimError::NoClients`] / [`SimError::TooManyClients`] for a `clients`
/// count outside `1..=MAX_CLIENTS` with the `clients` model, and
/// [`SimError::TooManyRequests`] when the stream would hold more than
/// [`MAX_REQUESTS`] requests.
pub fn generate(
    traffic: Traffic,
    policy: &Policy,
    duration_ns: u64,
    clients: u32,
    seed: u64,
) -> Result<Vec<Request>, SimError> {
    let limit = policy.limit() as f64;
    let window = policy.window_ns() as f64;
    let duration = duration_ns as f64;
    // Requests per nanosecond at the limit.
    let at_limit = limit / window;
    let rng = |client: u32| StdRng::seed_from_u64(mix(seed, traffic.tag(), u64::from(client)));
    let too_many = |expected: f64| SimError::TooManyRequests {
        traffic,
        expected,
        max: MAX_REQUESTS,
    };
    let check = |expected: f64| {
        if expected > MAX_REQUESTS as f64 {
            Err(too_many(expected))
        } else {
            Ok(())
        }
    };
    let mut out = Vec::new();
    match traffic {
        Traffic::Poisson => {
            let rate = 1.2 * at_limit;
            check(f64::from(FEW_CLIENTS) * rate * duration)?;
            for client in 0..FEW_CLIENTS {
                poisson(&mut rng(client), client, rate, 0.0, duration, &mut out).map_err(too_many)?;
            }
        }
        Traffic::Bursty => {
            // On a third of the time at 5× the limit.
            let rate = 5.0 * at_limit;
            check(f64::from(FEW_CLIENTS) * rate * duration / 3.0)?;
            for client in 0..FEW_CLIENTS {
                bursty(&mut rng(client), client, rate, window, duration, &mut out).map_err(too_many)?;
            }
        }
        Traffic::Adversary => adversary(policy, duration_ns, &mut out)?,
        Traffic::Clients | Traffic::ManySources => {
            if clients == 0 {
                return Err(SimError::NoClients);
            }
            if clients > MAX_CLIENTS {
                return Err(SimError::TooManyClients {
                    clients,
                    max: MAX_CLIENTS,
                });
            }
            let scale = if traffic == Traffic::Clients {
                0.25
            } else {
                MANY_SOURCES_SCALE
            };
            let rates = client_rates(&mut rng(u32::MAX), clients, scale * at_limit, 10.0 * at_limit);
            check(rates.iter().sum::<f64>() * duration)?;
            for (client, &rate) in (0..clients).zip(&rates) {
                poisson(&mut rng(client), client, rate, 0.0, duration, &mut out).map_err(too_many)?;
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// What a generated stream depends on besides the scenario: the limit and
/// the window, and for the adversary the bucket width and ring length.
pub(crate) type Key = (u64, u64, u128, u128);

/// The [`Key`] of `traffic` for `policy`: two policies with the same key get
/// the same stream from [`generate`].
pub(crate) fn key(traffic: Traffic, policy: &Policy) -> Key {
    let (b, ring) = if traffic == Traffic::Adversary {
        bucket_and_ring(policy)
    } else {
        (0, 0)
    };
    (policy.limit(), policy.window_ns(), b, ring)
}

/// The adversary's bucket width `b` and `n − 1`, the number of buckets
/// between the burst and its bucket being the oldest: the policy's ring for
/// `sliding_window`, one window of width `W` for the others.
fn bucket_and_ring(policy: &Policy) -> (u128, u128) {
    match policy.algorithm() {
        Algorithm::SlidingWindow { buckets, .. } => (u128::from(policy.step_ns()), u128::from(buckets) - 1),
        _ => (u128::from(policy.window_ns()), 1),
    }
}

/// Per-client rates (requests per ns) of the `clients` and `many-sources`
/// models: Pareto times `scale`, at most `cap`.
fn client_rates(rng: &mut StdRng, clients: u32, scale: f64, cap: f64) -> Vec<f64> {
    (0..clients)
        .map(|_| (scale * pareto(rng, PARETO_ALPHA)).min(cap))
        .collect()
}

/// SplitMix64 of the seed, the model and the client: independent streams.
fn mix(seed: u64, tag: u64, client: u64) -> u64 {
    let mut z = seed ^ tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ client.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// An exponential sample of mean `mean`, by inverse CDF.
fn exponential(rng: &mut StdRng, mean: f64) -> f64 {
    let u: f64 = rng.random();
    // 1 − u is in (0, 1]: the logarithm is finite.
    -(1.0 - u).ln() * mean
}

/// A Pareto sample with scale 1 and shape `alpha`, by inverse CDF.
fn pareto(rng: &mut StdRng, alpha: f64) -> f64 {
    let u: f64 = rng.random();
    (1.0 - u).powf(-1.0 / alpha)
}

/// Pushes one request, refusing to grow past [`MAX_REQUESTS`] (the expected
/// count was checked; this bounds an unlucky draw). The error is the count
/// reached.
fn push(out: &mut Vec<Request>, time: f64, client: u32) -> Result<(), f64> {
    if out.len() as u64 >= MAX_REQUESTS {
        return Err(out.len() as f64);
    }
    // Saturating float-to-int conversion; times are below the duration.
    out.push(Request {
        time_ns: time as u64,
        client,
        cost: 1,
    });
    Ok(())
}

/// Poisson arrivals at `rate` per ns over `[start, end)`.
fn poisson(rng: &mut StdRng, client: u32, rate: f64, start: f64, end: f64, out: &mut Vec<Request>) -> Result<(), f64> {
    if rate.is_nan() || rate <= 0.0 {
        return Ok(());
    }
    let mean = 1.0 / rate;
    let mut t = start + exponential(rng, mean);
    while t < end {
        push(out, t, client)?;
        t += exponential(rng, mean);
    }
    Ok(())
}

/// On/off: exponential on periods (mean `W/4`) at `rate`, exponential off
/// periods (mean `W/2`) silent.
fn bursty(rng: &mut StdRng, client: u32, rate: f64, window: f64, end: f64, out: &mut Vec<Request>) -> Result<(), f64> {
    let mut t = 0.0;
    while t < end {
        let on = exponential(rng, window / 4.0);
        poisson(rng, client, rate, t, (t + on).min(end), out)?;
        t += on + exponential(rng, window / 2.0);
    }
    Ok(())
}

/// The end-of-bucket attack (see [`Traffic::Adversary`]), client 0.
fn adversary(policy: &Policy, duration_ns: u64, out: &mut Vec<Request>) -> Result<(), SimError> {
    let limit = u128::from(policy.limit());
    let (b, ring) = bucket_and_ring(policy);
    let duration = u128::from(duration_ns);
    // Burst in bucket k, follow-up in bucket k + ring, silence for a full
    // window (ring buckets): the next burst is in bucket k + 2·ring + 1.
    let cycle = b * (2 * ring + 1);
    let cycles = duration.div_ceil(cycle);
    let expected = (cycles as f64) * 5.0 * limit as f64;
    if expected > MAX_REQUESTS as f64 {
        return Err(SimError::TooManyRequests {
            traffic: Traffic::Adversary,
            expected,
            max: MAX_REQUESTS,
        });
    }
    let span = (b / 1000).max(1);
    let follow = 4 * limit;
    let mut emit = |t: u128| {
        if t < duration {
            // t < duration ≤ u64::MAX.
            out.push(Request {
                time_ns: t as u64,
                client: 0,
                cost: 1,
            });
        }
    };
    for c in 0..cycles {
        let k = c * (2 * ring + 1);
        // `limit` requests evenly over the last `span` ns of bucket k.
        let end = (k + 1) * b;
        for i in 0..limit {
            emit(end - span + i * span / limit);
        }
        // `4·limit` requests evenly over bucket k + ring.
        let start = (k + ring) * b;
        for i in 0..follow {
            emit(start + i * b / follow);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_core::Weighting;
    use std::time::Duration;

    fn policy(algorithm: Algorithm) -> Policy {
        Policy::new(100, Duration::from_secs(60), algorithm).unwrap()
    }

    const TEN_MINUTES: u64 = 600_000_000_000;

    #[test]
    fn many_sources_puts_few_near_their_limit() {
        let p = policy(Algorithm::TWO_BUCKETS);
        let reqs = generate(Traffic::ManySources, &p, TEN_MINUTES, 20_000, 3).unwrap();
        let mut per_client = vec![0u64; 20_000];
        for r in &reqs {
            per_client[r.client as usize] += 1;
        }
        // Ten windows: a client at 0.8·L/W sends about 800.
        let near = per_client.iter().filter(|&&n| n >= 800).count();
        assert!(near > 0, "nobody near the limit");
        assert!(near * 100 < 20_000, "{near} of 20000 near the limit");
        // The mean rate is about scale · α/(α − 1) = 0.03 L/W: 30 per client.
        let mean = reqs.len() as f64 / 20_000.0;
        assert!((20.0..40.0).contains(&mean), "mean {mean}");
        // The `clients` model, for contrast, puts far more near the limit.
        let dense = generate(Traffic::Clients, &p, TEN_MINUTES / 10, 20_000, 3).unwrap();
        let mut dense_per_client = vec![0u64; 20_000];
        for r in &dense {
            dense_per_client[r.client as usize] += 1;
        }
        // One window: a client at 0.8·L/W sends about 80.
        assert!(dense_per_client.iter().filter(|&&n| n >= 80).count() > 10 * near);
    }

    #[test]
    fn deterministic_sorted_and_in_range() {
        let p = policy(Algorithm::TWO_BUCKETS);
        for traffic in Traffic::ALL {
            let a = generate(traffic, &p, TEN_MINUTES, 50, 7).unwrap();
            assert!(!a.is_empty(), "{traffic}");
            assert!(a.is_sorted(), "{traffic}");
            assert!(a.iter().all(|r| r.time_ns < TEN_MINUTES && r.cost == 1), "{traffic}");
            assert_eq!(a, generate(traffic, &p, TEN_MINUTES, 50, 7).unwrap(), "{traffic}");
            if traffic != Traffic::Adversary {
                assert_ne!(a, generate(traffic, &p, TEN_MINUTES, 50, 8).unwrap(), "{traffic}");
            }
        }
    }

    #[test]
    fn rates_are_about_right() {
        let p = policy(Algorithm::SlidingLog);
        // 4 clients × 1.2 × 100 per minute × 10 minutes = 4800.
        let n = generate(Traffic::Poisson, &p, TEN_MINUTES, 1, 1).unwrap().len();
        assert!((4400..5200).contains(&n), "{n}");
        // 4 clients × 500 per minute × 10 minutes / 3 ≈ 6667, with wide
        // variance from the on/off periods.
        let n = generate(Traffic::Bursty, &p, TEN_MINUTES, 1, 1).unwrap().len();
        assert!((3000..11000).contains(&n), "{n}");
    }

    #[test]
    fn a_noticeable_share_of_clients_is_near_or_over_the_limit() {
        let at_limit = 100.0 / 60e9;
        let rates = client_rates(&mut StdRng::seed_from_u64(1), 10_000, 0.25 * at_limit, 10.0 * at_limit);
        let share = |x: f64| rates.iter().filter(|&&r| r >= x * at_limit).count() as f64 / 1e4;
        assert!((0.15..0.25).contains(&share(1.0)), "{}", share(1.0));
        assert!((0.2..0.3).contains(&share(0.8)), "{}", share(0.8));
        assert!(share(0.25) == 1.0);
        // many-sources: about 0.3 % at 0.8·L/W or more.
        let sparse = client_rates(
            &mut StdRng::seed_from_u64(1),
            100_000,
            MANY_SOURCES_SCALE * at_limit,
            10.0 * at_limit,
        );
        let sparse_share = sparse.iter().filter(|&&r| r >= 0.8 * at_limit).count() as f64 / 1e5;
        assert!((0.001..0.005).contains(&sparse_share), "{sparse_share}");
    }

    #[test]
    fn adversary_shape() {
        let sw = |buckets| {
            policy(Algorithm::SlidingWindow {
                buckets,
                weighting: Weighting::Interpolated,
            })
        };
        let p = sw(8);
        let b = p.step_ns();
        let reqs = generate(Traffic::Adversary, &p, TEN_MINUTES, 1, 1).unwrap();
        // Cycle: 15 buckets of ~8.57 s, 5 cycles in 10 minutes.
        assert_eq!(reqs.len(), 5 * 500);
        let burst = &reqs[..100];
        assert!(burst.iter().all(|r| r.time_ns >= b - b / 1000 && r.time_ns < b));
        let follow = &reqs[100..500];
        assert!(follow.iter().all(|r| r.time_ns >= 7 * b && r.time_ns < 8 * b));
        assert_eq!(reqs[500].time_ns, 16 * b - b / 1000);
        // Other algorithms use the window as the bucket: burst at the end of
        // window 0, follow-up in window 1, next burst at the end of window 3.
        let reqs = generate(Traffic::Adversary, &policy(Algorithm::FixedWindow), TEN_MINUTES, 1, 1).unwrap();
        assert!(
            reqs[..100]
                .iter()
                .all(|r| r.time_ns >= 59_940_000_000 && r.time_ns < 60_000_000_000)
        );
        assert!(
            reqs[100..500]
                .iter()
                .all(|r| r.time_ns >= 60_000_000_000 && r.time_ns < 120_000_000_000)
        );
        assert_eq!(reqs[500].time_ns, 240_000_000_000 - 60_000_000);
    }

    #[test]
    fn oversized_streams_are_refused_up_front() {
        let p = Policy::new(u64::MAX, Duration::from_nanos(1), Algorithm::TWO_BUCKETS).unwrap();
        for traffic in Traffic::ALL {
            let err = generate(traffic, &p, u64::MAX, MAX_CLIENTS, 1).unwrap_err();
            assert!(matches!(err, SimError::TooManyRequests { .. }), "{traffic}: {err}");
        }
        let p = policy(Algorithm::TWO_BUCKETS);
        assert_eq!(generate(Traffic::Clients, &p, 1, 0, 1), Err(SimError::NoClients));
        assert!(matches!(
            generate(Traffic::Clients, &p, 1, u32::MAX, 1),
            Err(SimError::TooManyClients { .. })
        ));
        // Tiny and empty runs are fine.
        for traffic in Traffic::ALL {
            assert!(generate(traffic, &p, 0, 1, 1).unwrap().is_empty());
        }
    }

    #[test]
    fn names_round_trip() {
        for (t, name) in Traffic::ALL.into_iter().zip(Traffic::NAMES) {
            assert_eq!(t.name(), name);
            assert_eq!(name.parse::<Traffic>().unwrap(), t);
        }
        assert_eq!(
            "flood".parse::<Traffic>().unwrap_err().to_string(),
            "unknown traffic model `flood`, expected one of: poisson, bursty, adversary, clients, many-sources"
        );
    }
}
