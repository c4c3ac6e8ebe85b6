//! How one quota bucket's limit is shared between the Envoys that report
//! it: a pure ledger of what each stream was sent and may still be using,
//! in integers, on a clock in nanoseconds passed in by the caller.
//!
//! # The bound
//!
//! A rule allows `L` requests in any window of length `W`. Its tokens are
//! split once into a *burst pool* `P_B` (`L / 25`; at least 32 when
//! `L ≥ 128`, a quarter of `L` below; at least 1) and a *rate pool*
//! `P_R = L − P_B` (tokens per window). Every Envoy stream gets a token
//! bucket of `b` tokens (`P_B / 16`, at least 2, at most `P_B`) filled at
//! `g / W` tokens a second (its rate grant `g`).
//!
//! Envoy keeps a token bucket whose `max_tokens` and `tokens_per_fill`
//! are sent again unchanged (it carries its tokens over), but starts any
//! other one full: a new one, and also a changed one whenever the old one
//! had a whole token left (its `initial_tokens` is passed as the
//! `init_fill` flag of `AtomicTokenBucketImpl`). So every token bucket sent
//! that is not the last one again is an *instance* that may start with
//! `b` tokens. Two holds are kept:
//!
//! - a rate grant `g` sent at `t` is held until `t + H`, where
//!   `H = TTL + grace`: Envoy drops an assignment when its TTL passes (or
//!   earlier, for the next one), and the grace covers the time it takes to
//!   arrive;
//! - an instance's `b` starting tokens are held until `W` after its last
//!   sending stops being held.
//!
//! A grant never makes the held rates add up to more than `P_R`, nor the
//! held starting tokens to more than `P_B`. In any window of length `W` an
//! Envoy admits at most the starting tokens of the instances it used in
//! that window plus its rate over the window; every such instance is
//! still held at the window's end and every rate was held while it was
//! used, so the Envoys together admit at most `P_B + P_R = L`.
//!
//! # The shares
//!
//! At each report a stream states its demand (requests a window, from its
//! counts; unknown on a first report). Its grant is its max-min fair share
//! of `P_R` among the streams reporting the bucket (a stream wanting less
//! than an equal share keeps what it wants plus an eighth; the rest share
//! what is left), and never more than what the other streams' holds leave
//! free. The last token bucket is sent again unchanged while it is within
//! an eighth of that share and fits, so that steady demand costs no new
//! instance. What a stream gives up is free for the others once its hold
//! expires: that delay is the price of the bound.

use smallvec::SmallVec;

/// One stream of one replica: unique across every replica sharing a
/// ledger (the replica's random id, the stream's number in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId {
    /// The replica's id, drawn at start.
    pub replica: u64,
    /// The stream's number within the replica.
    pub stream: u64,
}

/// A rule's tokens, split into the burst and rate pools (see the module
/// docs), and its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pools {
    /// The rule's limit `L`.
    pub limit: u64,
    /// Its window `W`, in ns (at least 1).
    pub window_ns: u64,
    /// `P_B`: the starting tokens of every live instance together.
    pub burst: u64,
    /// `P_R`: the rate grants together, in tokens a window.
    pub rate: u64,
}

impl Pools {
    /// The pools of `limit` requests per `window_ns`.
    pub fn new(limit: u64, window_ns: u64) -> Pools {
        let burst = if limit == 0 {
            0
        } else {
            (limit / 25).max(32.min(limit / 4)).max(1)
        };
        Pools {
            limit,
            window_ns: window_ns.max(1),
            burst,
            rate: limit - burst,
        }
    }

    /// The tokens a new token bucket holds: a sixteenth of the burst pool,
    /// at least 2 (one token would lose what fills while a request is
    /// awaited), at most the pool.
    pub fn bucket_tokens(&self) -> u64 {
        (self.burst / 16).max(2).min(self.burst)
    }
}

/// How long things are held, in ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The `assignment_time_to_live` sent with every assignment (whole
    /// seconds: Envoy reads only the seconds).
    pub ttl_ns: u64,
    /// Added to the TTL for holds: the most an assignment may take to
    /// reach its Envoy.
    pub grace_ns: u64,
    /// A stream's demand counts for this long after its last report.
    pub active_ns: u64,
}

impl Timing {
    /// The default: a 10 s TTL (two of Envoy's 5 s reports), 1 s of
    /// grace, demand counted for 11 s.
    pub const DEFAULT: Timing = Timing {
        ttl_ns: 10_000_000_000,
        grace_ns: 1_000_000_000,
        active_ns: 11_000_000_000,
    };

    /// A TTL of `ttl` (whole seconds are what Envoy reads), 1 s of grace,
    /// demand counted for as long as a grant is held.
    pub fn with_ttl(ttl: std::time::Duration) -> Timing {
        let ttl_ns = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
        let grace_ns = Timing::DEFAULT.grace_ns;
        Timing {
            ttl_ns,
            grace_ns,
            active_ns: ttl_ns.saturating_add(grace_ns),
        }
    }

    /// `H`: how long a grant is held after it is sent.
    pub fn hold_ns(&self) -> u64 {
        self.ttl_ns.saturating_add(self.grace_ns)
    }
}

/// What one stream is sent for one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Nothing is free: `DENY_ALL`.
    Deny,
    /// A token bucket of `max_tokens` filled at `per_window` tokens a
    /// window.
    Bucket {
        /// Its burst `b`.
        max_tokens: u64,
        /// Its rate grant `g`, tokens per window.
        per_window: u64,
    },
}

/// A held amount and until when (ns, exclusive).
type Hold = (u64, u64);

/// One stream's standing on one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    id: StreamId,
    /// What it wants, in tokens a window (`u64::MAX`: unknown, as much as
    /// it can get).
    want: u64,
    /// Its demand counts until then (0: it is gone).
    active_until: u64,
    /// The rate grants still held.
    rates: SmallVec<[Hold; 3]>,
    /// The starting tokens still held, the last instance's last.
    bursts: SmallVec<[Hold; 2]>,
    /// The last token bucket sent, if it may still be in force.
    last: Option<Sent>,
}

/// A token bucket as sent: its tokens, its grant, the window it was
/// granted under, and when it was last sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sent {
    tokens: u64,
    rate: u64,
    window_ns: u64,
    at: u64,
}

impl Holder {
    fn held_rate(&self, now: u64) -> u64 {
        held(&self.rates, now)
    }

    fn expire(&mut self, now: u64) {
        self.rates.retain(|(_, until)| *until > now);
        self.bursts.retain(|(_, until)| *until > now);
    }

    fn is_idle(&self, now: u64) -> bool {
        self.active_until <= now && self.rates.is_empty() && self.bursts.is_empty()
    }
}

/// The largest hold still live: what a stream may still be using.
fn held(holds: &[Hold], now: u64) -> u64 {
    holds
        .iter()
        .filter(|(_, until)| *until > now)
        .map(|(amount, _)| *amount)
        .max()
        .unwrap_or(0)
}

/// The most streams one bucket's ledger tracks, live or holding: a
/// newcomer past it is denied until one's holds expire.
pub const MAX_HOLDERS: usize = 256;

/// One bucket's ledger: every stream that holds a share of it or reports
/// it. Cheap to clone; kept in memory, or encoded in Redis for replicas
/// that share it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    holders: Vec<Holder>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// Whether nothing is held or reported.
    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }

    /// How many streams it tracks.
    pub fn len(&self) -> usize {
        self.holders.len()
    }

    /// The rate grants held at `now`, together (never more than the rate
    /// pool of the rule they were granted under).
    pub fn held_rate(&self, now: u64) -> u64 {
        self.holders
            .iter()
            .map(|h| h.held_rate(now))
            .fold(0, u64::saturating_add)
    }

    /// The bursts held at `now`, together.
    pub fn held_burst(&self, now: u64) -> u64 {
        self.holders
            .iter()
            .flat_map(|h| h.bursts.iter())
            .filter(|(_, until)| *until > now)
            .map(|(amount, _)| *amount)
            .fold(0, u64::saturating_add)
    }

    /// Drops what expired by `now`, and the streams left with nothing.
    pub fn expire(&mut self, now: u64) {
        for holder in &mut self.holders {
            holder.expire(now);
        }
        self.holders.retain(|h| !h.is_idle(now));
    }

    /// The stream `id` reported the bucket at `now`, wanting `want`
    /// tokens a window: what it is sent, recorded as held.
    pub fn grant(&mut self, id: StreamId, want: u64, now: u64, pools: &Pools, timing: &Timing) -> Grant {
        self.expire(now);
        let hold = timing.hold_ns();
        let index = match self.holders.iter().position(|h| h.id == id) {
            Some(index) => index,
            None if self.holders.len() >= MAX_HOLDERS => return Grant::Deny,
            None => {
                // Most buckets have one stream: no room for four.
                self.holders.reserve_exact(1);
                self.holders.push(Holder {
                    id,
                    want,
                    active_until: 0,
                    rates: SmallVec::new(),
                    bursts: SmallVec::new(),
                    last: None,
                });
                self.holders.len() - 1
            }
        };
        let target = {
            let Some(me) = self.holders.get_mut(index) else {
                return Grant::Deny;
            };
            me.want = want;
            me.active_until = now.saturating_add(timing.active_ns);
            fair_share(&self.holders, index, pools.rate, now)
        };
        let others: u64 = self
            .holders
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != index)
            .map(|(_, h)| h.held_rate(now))
            .fold(0, u64::saturating_add);
        let free = pools.rate.saturating_sub(others);
        let allowed = target.min(free);
        // The token bucket Envoy may still have: the last one sent, less
        // than a TTL ago.
        let current = self
            .holders
            .get(index)
            .and_then(|me| me.last)
            .filter(|sent| now.saturating_sub(sent.at) < timing.ttl_ns && sent.window_ns == pools.window_ns);
        let fits = |sent: &Sent| sent.rate <= free && sent.tokens <= pools.burst;
        let near = |sent: &Sent| sent.rate.abs_diff(allowed) <= sent.rate / 8;
        let spare = pools.burst.saturating_sub(self.held_burst(now));
        let tokens = pools.bucket_tokens().min(spare);
        let send = match current {
            Some(sent) if fits(&sent) && near(&sent) => Some((sent, true)),
            _ if allowed == 0 => None,
            _ if tokens >= 1 => {
                let previous = self.holders.get(index).and_then(|me| me.last);
                let rate = distinct_rate(tokens, allowed, pools.window_ns, previous);
                (rate > 0).then_some((
                    Sent {
                        tokens,
                        rate,
                        window_ns: pools.window_ns,
                        at: now,
                    },
                    false,
                ))
            }
            // No tokens to start another: the last one again, if it fits.
            Some(sent) if fits(&sent) => Some((sent, true)),
            _ => None,
        };
        let Some(me) = self.holders.get_mut(index) else {
            return Grant::Deny;
        };
        let Some((sent, again)) = send else {
            me.last = None;
            return Grant::Deny;
        };
        me.rates.push((sent.rate, now.saturating_add(hold)));
        let burst_until = now.saturating_add(hold).saturating_add(pools.window_ns);
        match (again, me.bursts.last_mut()) {
            (true, Some(last)) => last.1 = last.1.max(burst_until),
            _ => me.bursts.push((sent.tokens, burst_until)),
        }
        me.last = Some(Sent { at: now, ..sent });
        // Only the largest of the holds that end last matters.
        compact(&mut me.rates);
        Grant::Bucket {
            max_tokens: sent.tokens,
            per_window: sent.rate,
        }
    }

    /// When the last thing it holds or reports ends: after it, the
    /// ledger is empty (what Redis expires it at).
    pub fn horizon(&self, now: u64) -> u64 {
        self.holders
            .iter()
            .flat_map(|h| {
                let holds = h.rates.iter().chain(h.bursts.iter()).map(|(_, until)| *until);
                holds.chain(std::iter::once(h.active_until))
            })
            .fold(now, u64::max)
    }

    /// The ledger as text, for Redis: a holder per `;`, each
    /// `replica,stream,want,active_until,tokens,rate,window,sent/rates/bursts`
    /// (the last token bucket sent; all 0 for none), a hold
    /// `amount:until`, space-separated.
    pub fn encode(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        for (i, h) in self.holders.iter().enumerate() {
            if i > 0 {
                out.push(';');
            }
            let last = h.last.unwrap_or(Sent {
                tokens: 0,
                rate: 0,
                window_ns: 0,
                at: 0,
            });
            let _ = write!(
                out,
                "{},{},{},{},{},{},{},{}/",
                h.id.replica, h.id.stream, h.want, h.active_until, last.tokens, last.rate, last.window_ns, last.at
            );
            let holds = |out: &mut String, holds: &[Hold]| {
                for (j, (amount, until)) in holds.iter().enumerate() {
                    let sep = if j > 0 { " " } else { "" };
                    let _ = write!(out, "{sep}{amount}:{until}");
                }
            };
            holds(&mut out, &h.rates);
            out.push('/');
            holds(&mut out, &h.bursts);
        }
        out
    }

    /// A ledger from [`Ledger::encode`]'s text; `None` if it is not one.
    pub fn decode(text: &str) -> Option<Ledger> {
        fn holds<A: smallvec::Array<Item = Hold>>(text: &str) -> Option<SmallVec<A>> {
            text.split(' ')
                .filter(|h| !h.is_empty())
                .map(|h| {
                    let (amount, until) = h.split_once(':')?;
                    Some((amount.parse().ok()?, until.parse().ok()?))
                })
                .collect()
        }
        let mut holders = Vec::new();
        for holder in text.split(';').filter(|h| !h.is_empty()) {
            let mut parts = holder.split('/');
            let head = parts.next()?;
            let rates = holds(parts.next()?)?;
            let bursts = holds(parts.next()?)?;
            let numbers: Vec<u64> = head.split(',').map(str::parse).collect::<Result<_, _>>().ok()?;
            let [replica, stream, want, active_until, tokens, rate, window_ns, at] = numbers.as_slice() else {
                return None;
            };
            if parts.next().is_some() || holders.len() >= MAX_HOLDERS {
                return None;
            }
            holders.push(Holder {
                id: StreamId {
                    replica: *replica,
                    stream: *stream,
                },
                want: *want,
                active_until: *active_until,
                rates,
                bursts,
                last: (*tokens > 0).then_some(Sent {
                    tokens: *tokens,
                    rate: *rate,
                    window_ns: *window_ns,
                    at: *at,
                }),
            });
        }
        Some(Ledger { holders })
    }

    /// The stream `id` will not report the bucket again (it ended, or
    /// the bucket was abandoned): its demand stops counting, its holds
    /// stay until they expire, and a later grant is a new instance.
    pub fn leave(&mut self, id: StreamId) {
        if let Some(holder) = self.holders.iter_mut().find(|h| h.id == id) {
            holder.active_until = 0;
            holder.last = None;
        }
    }
}

/// `rate`, or one token less when the token bucket it makes would look
/// the same to Envoy as `previous` (its `max_tokens` and `tokens_per_fill`;
/// Envoy compares no fill interval seconds) though its fill interval
/// differs (a reload changed the window): Envoy would keep the old one,
/// at the old rate.
fn distinct_rate(tokens: u64, rate: u64, window_ns: u64, previous: Option<Sent>) -> u64 {
    let Some(previous) = previous else {
        return rate;
    };
    let (max, per_fill, fill) = token_bucket(tokens, rate, window_ns);
    let (old_max, old_per_fill, old_fill) = token_bucket(previous.tokens, previous.rate, previous.window_ns);
    if max == old_max && per_fill == old_per_fill && fill != old_fill {
        rate.saturating_sub(1)
    } else {
        rate
    }
}

/// Drops a rate hold that another both outlasts and outweighs.
fn compact(holds: &mut SmallVec<[Hold; 3]>) {
    let all = holds.clone();
    holds.retain(|(amount, until)| {
        !all.iter()
            .any(|(a, u)| (*a >= *amount && *u > *until) || (*a > *amount && *u >= *until))
    });
}

/// The max-min fair share of `capacity` for the holder at `index` among
/// the holders whose demand counts at `now` (the one at `index` always
/// does): wants in increasing order each get theirs while it is below an
/// equal share of what is left; the rest split what is left evenly.
fn fair_share(holders: &[Holder], index: usize, capacity: u64, now: u64) -> u64 {
    let mut wants: SmallVec<[(u64, bool); 16]> = holders
        .iter()
        .enumerate()
        .filter(|(i, h)| *i == index || h.active_until > now)
        .map(|(i, h)| (h.want, i == index))
        .collect();
    wants.sort_unstable();
    let mut left = capacity;
    let mut count = wants.len() as u64;
    for (want, mine) in wants {
        let equal = left / count.max(1);
        if want <= equal {
            if mine {
                return want;
            }
            left -= want;
            count -= 1;
        } else {
            // Every want from here on is larger: each gets an equal share.
            return equal;
        }
    }
    0
}

/// What a stream wants, in tokens a window, from one usage report:
/// its requests (allowed and denied) over the `elapsed_secs` they came
/// in, scaled to the window, plus an eighth and one token of headroom so
/// that a stream can show it wants more. `None` elapsed or 0 s (Envoy's
/// first report of a bucket) is unknown: `u64::MAX`.
pub fn want(allowed: u64, denied: u64, elapsed_secs: u64, window_ns: u64) -> u64 {
    if elapsed_secs == 0 {
        return u64::MAX;
    }
    let requests = u128::from(allowed.saturating_add(denied));
    let per_window = requests * u128::from(window_ns) / (u128::from(elapsed_secs) * 1_000_000_000);
    let per_window = u64::try_from(per_window).unwrap_or(u64::MAX);
    per_window.saturating_add(per_window / 8).saturating_add(1)
}

/// Envoy's token bucket for a grant: `max_tokens`, `tokens_per_fill` and
/// `fill_interval` in whole seconds (Envoy reads only the seconds), the
/// fill interval the window rounded up to a whole second, at least 1,
/// and the tokens rounded down: never faster than `per_window` a window.
/// Values past `u32::MAX` are clamped (lower, so still within the bound).
pub fn token_bucket(max_tokens: u64, per_window: u64, window_ns: u64) -> (u32, u32, u64) {
    const SECOND: u64 = 1_000_000_000;
    let window_ns = window_ns.max(1);
    let fill_secs = window_ns.div_ceil(SECOND).max(1);
    let per_fill = u128::from(per_window) * u128::from(fill_secs) * u128::from(SECOND) / u128::from(window_ns);
    let clamp = |n: u128| u32::try_from(n).unwrap_or(u32::MAX);
    (clamp(u128::from(max_tokens)), clamp(per_fill), fill_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn id(n: u64) -> StreamId {
        StreamId { replica: 1, stream: n }
    }

    #[test]
    fn pools_split_a_twenty_fifth_for_bursts() {
        assert_eq!(
            Pools::new(1000, 60 * S),
            Pools {
                limit: 1000,
                window_ns: 60 * S,
                burst: 40,
                rate: 960
            }
        );
        assert_eq!(Pools::new(10, S).burst, 2);
        assert_eq!(Pools::new(100, S).burst, 25);
        assert_eq!(Pools::new(1000, S).bucket_tokens(), 2);
        assert_eq!(Pools::new(100_000, S).bucket_tokens(), 250);
        assert_eq!(Pools::new(4, S).bucket_tokens(), 1);
        assert_eq!(Pools::new(1, S).burst, 1);
        assert_eq!(Pools::new(1, S).rate, 0);
        assert_eq!(Pools::new(0, S).rate, 0);
    }

    #[test]
    fn a_stream_alone_gets_the_rate_pool() {
        let pools = Pools::new(1000, 60 * S);
        let mut ledger = Ledger::new();
        let grant = ledger.grant(id(1), u64::MAX, 0, &pools, &Timing::DEFAULT);
        assert_eq!(
            grant,
            Grant::Bucket {
                max_tokens: 2,
                per_window: 960
            }
        );
        assert_eq!(ledger.held_rate(0), 960);
        assert_eq!(ledger.held_burst(0), 2);
    }

    #[test]
    fn a_newcomer_waits_for_the_holds_to_expire() {
        let pools = Pools::new(1000, 60 * S);
        let timing = Timing::DEFAULT;
        let mut ledger = Ledger::new();
        ledger.grant(id(1), u64::MAX, 0, &pools, &timing);
        // Everything is held by the first: the second is denied.
        assert_eq!(ledger.grant(id(2), u64::MAX, S, &pools, &timing), Grant::Deny);
        // The first's next report lowers it to an equal share; its old
        // grant is held until 11 s.
        let lowered = ledger.grant(id(1), u64::MAX, 5 * S, &pools, &timing);
        assert_eq!(
            lowered,
            Grant::Bucket {
                max_tokens: 2,
                per_window: 480
            }
        );
        assert_eq!(ledger.grant(id(2), u64::MAX, 6 * S, &pools, &timing), Grant::Deny);
        let second = ledger.grant(id(2), u64::MAX, 11 * S, &pools, &timing);
        assert_eq!(
            second,
            Grant::Bucket {
                max_tokens: 2,
                per_window: 480
            }
        );
        assert!(ledger.held_rate(11 * S) <= pools.rate);
    }

    #[test]
    fn the_small_want_is_met_and_the_rest_goes_to_the_busy() {
        let pools = Pools::new(1000, 10 * S);
        let timing = Timing::DEFAULT;
        let mut ledger = Ledger::new();
        ledger.grant(id(1), 100, 0, &pools, &timing);
        let busy = ledger.grant(id(2), u64::MAX, 0, &pools, &timing);
        assert_eq!(
            busy,
            Grant::Bucket {
                max_tokens: 2,
                per_window: 860
            }
        );
    }

    #[test]
    fn fair_share_is_max_min() {
        let pools = Pools::new(1000, 10 * S);
        let timing = Timing::DEFAULT;
        let mut ledger = Ledger::new();
        for (n, want) in [(1, 50), (2, 400), (3, u64::MAX)] {
            ledger.grant(id(n), want, 0, &pools, &timing);
        }
        // 950: 50 first, then 450 each for the two larger, but 400 wants
        // less: the largest gets the 500 left.
        let index = ledger.holders.iter().position(|h| h.id == id(3)).unwrap_or(0);
        assert_eq!(fair_share(&ledger.holders, index, 950, 0), 500);
    }

    #[test]
    fn a_new_token_bucket_holds_its_tokens_and_the_same_one_again_does_not() {
        let pools = Pools::new(1000, 10 * S);
        let timing = Timing::DEFAULT;
        let mut ledger = Ledger::new();
        ledger.grant(id(1), u64::MAX, 0, &pools, &timing);
        ledger.leave(id(1));
        // A new instance: its 2 tokens held beside the first one's.
        ledger.grant(id(1), u64::MAX, 5 * S, &pools, &timing);
        assert_eq!(ledger.held_burst(5 * S), 4);
        // The same bucket again within a TTL: nothing more held.
        ledger.grant(id(1), u64::MAX, 10 * S, &pools, &timing);
        assert_eq!(ledger.held_burst(10 * S), 4);
        // The first instance's tokens end W after its hold: 0 + 11 + 10.
        assert_eq!(ledger.held_burst(21 * S), 2);
    }

    #[test]
    fn a_share_within_an_eighth_sends_the_same_bucket_again() {
        let pools = Pools::new(1000, 10 * S);
        let timing = Timing::DEFAULT;
        let mut ledger = Ledger::new();
        let first = ledger.grant(id(1), 500, 0, &pools, &timing);
        assert_eq!(
            first,
            Grant::Bucket {
                max_tokens: 2,
                per_window: 500
            }
        );
        assert_eq!(ledger.grant(id(1), 520, 5 * S, &pools, &timing), first);
        assert_eq!(ledger.held_burst(5 * S), 2);
        let more = ledger.grant(id(1), 700, 10 * S, &pools, &timing);
        assert_eq!(
            more,
            Grant::Bucket {
                max_tokens: 2,
                per_window: 700
            }
        );
        assert_eq!(ledger.held_burst(10 * S), 4);
    }

    #[test]
    fn a_new_window_never_sends_a_bucket_envoy_would_take_for_the_old_one() {
        let timing = Timing::DEFAULT;
        let mut ledger = Ledger::new();
        ledger.grant(id(1), 500, 0, &Pools::new(1000, 10 * S), &timing);
        // The same tokens and grant over 20 s: the same max_tokens and
        // tokens_per_fill, which Envoy would keep at the old rate.
        let after = ledger.grant(id(1), 500, 5 * S, &Pools::new(1000, 20 * S), &timing);
        assert_eq!(
            after,
            Grant::Bucket {
                max_tokens: 2,
                per_window: 499
            }
        );
    }

    #[test]
    fn a_ledger_reads_back_as_written() {
        let pools = Pools::new(1000, 10 * S);
        let timing = Timing::DEFAULT;
        let mut ledger = Ledger::new();
        ledger.grant(id(1), 100, 0, &pools, &timing);
        ledger.grant(id(2), u64::MAX, S, &pools, &timing);
        ledger.leave(id(2));
        let text = ledger.encode();
        assert_eq!(Ledger::decode(&text), Some(ledger.clone()));
        assert_eq!(Ledger::decode(""), Some(Ledger::new()));
        for bad in [
            "1,2,3/",
            "1,2,3,4,5,6,7,8/x:1/",
            "1,2,3,4,5,6,7,8///",
            "a,2,3,4,5,6,7,8//",
        ] {
            assert_eq!(Ledger::decode(bad), None, "{bad}");
        }
        assert_eq!(ledger.horizon(0), S + timing.hold_ns() + 10 * S);
    }

    #[test]
    fn wants_are_scaled_to_the_window() {
        assert_eq!(want(5, 0, 0, 60 * S), u64::MAX);
        // 50 requests in 5 s is 600 a minute, plus 75 and 1.
        assert_eq!(want(40, 10, 5, 60 * S), 676);
        assert_eq!(want(u64::MAX, u64::MAX, 1, u64::MAX), u64::MAX);
    }

    #[test]
    fn token_buckets_fill_over_the_window_in_whole_seconds() {
        assert_eq!(token_bucket(3, 950, 60 * S), (3, 950, 60));
        // Half a second: one second's fill of twice the tokens.
        assert_eq!(token_bucket(1, 10, S / 2), (1, 20, 1));
        // 1.5 s rounds the interval up, the tokens down.
        assert_eq!(token_bucket(1, 10, 3 * S / 2), (1, 13, 2));
        assert_eq!(token_bucket(u64::MAX, u64::MAX, 1), (u32::MAX, u32::MAX, 1));
    }
}
