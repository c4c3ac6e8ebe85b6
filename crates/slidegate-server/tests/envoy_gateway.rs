//! The configs Envoy Gateway sends to its rate limit service, from its
//! translator's test data (`tests/data/envoy-gateway/`): every one loads,
//! and the descriptors Envoy builds from the routes of the same case land
//! on the rule each was generated for, with the limit the case's policy
//! (the translator's input, `in/ratelimit-config/NAME.yaml` upstream) set.
//!
//! For each case, written out below:
//!
//! - every `rate_limits` entry of its routes, with the descriptor it gives
//!   when its conditions hold and the limit that descriptor gets;
//! - requests made through one route, each with every descriptor Envoy
//!   sends for it (all or nothing per entry: a header absent, an address
//!   outside the range, a value that does not match, and none is sent)
//!   and the limit each gets;
//! - requests that count together (one counter) or apart.
//!
//! The data folder is listed, so a case added to it must be written out
//! here too.

use slidegate_server::config::{Config, Unit};

mod common;
use common::TempDir;
use common::envoy_actions::{self, Action, Entries, Request};
use common::envoy_gateway;

const FL: &str = "first-listener";
const SL: &str = "second-listener";
const P1: &str = "test-namespace/test-policy-1";
const P2: &str = "test-namespace/test-policy-2";

/// What a descriptor gets from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gets {
    /// A rule with this one limit: requests per unit, and the unit.
    Limit(u64, Unit),
    /// The same, in shadow mode.
    Shadow(u64, Unit),
    /// No limit: no rule, or a rule without one.
    Nothing,
}

use Gets::{Limit, Shadow};
use Unit::{Hour, Month, Second, Year};

/// One descriptor sent: its domain, its entries and what it gets. The
/// entries are written `key=value > key=value`, a part `key` alone for
/// `key=key`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    domain: String,
    entries: Entries,
    gets: Gets,
}

fn sent(domain: &str, entries: &str, gets: Gets) -> Sent {
    let entries = entries
        .split(" > ")
        .map(|part| match part.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (part.to_owned(), part.to_owned()),
        })
        .collect();
    Sent {
        domain: domain.to_owned(),
        entries,
        gets,
    }
}

/// A request made through the case's route `route` (its place in the
/// routes file) and every descriptor sent for it.
struct Case {
    route: usize,
    request: Request,
    sent: Vec<Sent>,
}

fn on(route: usize, request: Request, sent: &[Sent]) -> Case {
    Case {
        route,
        request,
        sent: sent.to_vec(),
    }
}

/// Two requests, each through a route, whose descriptors count together
/// (`true`) or apart.
type Counters = ((usize, Request), (usize, Request), bool);

/// What a case of the data must show.
struct Expected {
    /// Every `rate_limits` entry of the routes, route after route, domain
    /// after domain (sorted), in order, when its conditions hold.
    entries: Vec<Sent>,
    requests: Vec<Case>,
    counters: Vec<Counters>,
}

fn user(id: &str) -> Request {
    Request::get().header("x-user-id", id)
}

fn client(address: &str) -> Request {
    Request::get().from(address)
}

/// What the case `name` must show, read off its policy.
fn expected(name: &str) -> Expected {
    let none: &[Sent] = &[];
    let together = |a: (usize, Request), b: (usize, Request)| (a, b, true);
    let apart = |a: (usize, Request), b: (usize, Request)| (a, b, false);
    match name {
        // A limit per value of x-user-id; without the header, no limit.
        "distinct-match" => Expected {
            entries: vec![sent(FL, "first-route > rule-0-match-0=<x-user-id>", Limit(5, Second))],
            requests: vec![
                on(
                    0,
                    user("alice"),
                    &[sent(FL, "first-route > rule-0-match-0=alice", Limit(5, Second))],
                ),
                on(0, Request::get(), none),
            ],
            counters: vec![apart((0, user("alice")), (0, user("bob")))],
        },
        // A limit per client address inside 192.168.0.0/16.
        "distinct-remote-address-match" => Expected {
            entries: vec![sent(
                FL,
                "first-route > masked_remote_address=192.168.0.0/16 > remote_address=192.168.0.0",
                Limit(5, Second),
            )],
            requests: vec![
                on(
                    0,
                    client("192.168.1.7"),
                    &[sent(
                        FL,
                        "first-route > masked_remote_address=192.168.0.0/16 > remote_address=192.168.1.7",
                        Limit(5, Second),
                    )],
                ),
                on(0, client("10.0.0.1"), none),
                on(0, client("192.169.0.1"), none),
            ],
            counters: vec![apart((0, client("192.168.1.7")), (0, client("192.168.2.8")))],
        },
        // No match at all: one limit for every request of the route.
        "empty-header-matches" => Expected {
            entries: vec![sent(FL, "first-route > rule-0-match--1", Limit(5, Second))],
            requests: vec![
                on(
                    0,
                    Request::get(),
                    &[sent(FL, "first-route > rule-0-match--1", Limit(5, Second))],
                ),
                on(
                    0,
                    Request::new("POST", "/x").from("192.168.9.9"),
                    &[sent(FL, "first-route > rule-0-match--1", Limit(5, Second))],
                ),
            ],
            counters: vec![together(
                (0, Request::get()),
                (0, Request::new("POST", "/x").from("192.168.9.9")),
            )],
        },
        // x-user-id must be both `one` and `two`: no request meets that
        // (Envoy matches a repeated header on its values joined by `,`),
        // so Envoy never sends the descriptor; the rule is in shadow mode.
        "global-shadow-mode" => Expected {
            entries: vec![sent(
                FL,
                "first-route > rule-0-match-0 > rule-0-match-1 > rule-0-match-2 > masked_remote_address=0.0.0.0/0",
                Shadow(5, Second),
            )],
            requests: vec![
                on(0, user("one").header("x-org-id", "three"), none),
                on(
                    0,
                    user("one").header("x-user-id", "two").header("x-org-id", "three"),
                    none,
                ),
            ],
            counters: vec![],
        },
        // A shared rule: its policy's domain, a limit per x-user-id.
        "global-shared-distinct-match" => Expected {
            entries: vec![sent(
                P1,
                "test-namespace/test-policy-1/rule/0 > rule-0-match-0=<x-user-id>",
                Limit(5, Second),
            )],
            requests: vec![
                on(
                    0,
                    user("alice"),
                    &[sent(
                        P1,
                        "test-namespace/test-policy-1/rule/0 > rule-0-match-0=alice",
                        Limit(5, Second),
                    )],
                ),
                on(0, Request::get(), none),
            ],
            counters: vec![apart((0, user("alice")), (0, user("bob")))],
        },
        // Routes 0 and 1 share policy 1's rule (5/s, x-user-id: one),
        // route 2 has policy 2's (10/s, two), route 3 its own (10/s,
        // three) in the listener's domain.
        "global-shared-multiple-shared-policies" => Expected {
            entries: vec![
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/0 > rule-0-match-0",
                    Limit(5, Second),
                ),
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/0 > rule-0-match-0",
                    Limit(5, Second),
                ),
                sent(
                    P2,
                    "test-namespace/test-policy-2/rule/0 > rule-0-match-0",
                    Limit(10, Second),
                ),
                sent(FL, "fourth-route > rule-0-match-0", Limit(10, Second)),
            ],
            requests: vec![
                on(
                    0,
                    user("one"),
                    &[sent(
                        P1,
                        "test-namespace/test-policy-1/rule/0 > rule-0-match-0",
                        Limit(5, Second),
                    )],
                ),
                on(0, user("two"), none),
                on(
                    2,
                    user("two"),
                    &[sent(
                        P2,
                        "test-namespace/test-policy-2/rule/0 > rule-0-match-0",
                        Limit(10, Second),
                    )],
                ),
                on(
                    3,
                    user("three"),
                    &[sent(FL, "fourth-route > rule-0-match-0", Limit(10, Second))],
                ),
                on(3, user("one"), none),
            ],
            counters: vec![together((0, user("one")), (1, user("one")))],
        },
        // As global-shadow-mode, not in shadow mode.
        "header-and-cidr-matches" => Expected {
            entries: vec![sent(
                FL,
                "first-route > rule-0-match-0 > rule-0-match-1 > rule-0-match-2 > masked_remote_address=0.0.0.0/0",
                Limit(5, Second),
            )],
            requests: vec![
                on(0, user("one").header("x-org-id", "three"), none),
                on(0, user("two").header("x-org-id", "three"), none),
            ],
            counters: vec![],
        },
        // One limit for all of 192.168.0.0/16 together.
        "masked-remote-address-match" => Expected {
            entries: vec![sent(
                FL,
                "first-route > masked_remote_address=192.168.0.0/16",
                Limit(5, Second),
            )],
            requests: vec![
                on(
                    0,
                    client("192.168.3.4"),
                    &[sent(
                        FL,
                        "first-route > masked_remote_address=192.168.0.0/16",
                        Limit(5, Second),
                    )],
                ),
                on(0, client("10.0.0.1"), none),
            ],
            counters: vec![together((0, client("192.168.3.4")), (0, client("192.168.200.1")))],
        },
        // Rule 0: GET or PUT, one counter, 5/s; rule 1: POST, 50/s.
        "method-match" => Expected {
            entries: vec![
                sent(FL, "first-route > rule-0-method", Limit(5, Second)),
                sent(FL, "first-route > rule-0-method", Limit(5, Second)),
                sent(FL, "first-route > rule-1-method", Limit(50, Second)),
            ],
            requests: vec![
                on(
                    0,
                    Request::new("GET", "/"),
                    &[sent(FL, "first-route > rule-0-method", Limit(5, Second))],
                ),
                on(
                    0,
                    Request::new("PUT", "/"),
                    &[sent(FL, "first-route > rule-0-method", Limit(5, Second))],
                ),
                on(
                    0,
                    Request::new("POST", "/"),
                    &[sent(FL, "first-route > rule-1-method", Limit(50, Second))],
                ),
                on(0, Request::new("DELETE", "/"), none),
            ],
            counters: vec![
                together((0, Request::new("GET", "/")), (0, Request::new("PUT", "/"))),
                apart((0, Request::new("GET", "/")), (0, Request::new("POST", "/"))),
            ],
        },
        "month-year-rule" => Expected {
            entries: vec![
                sent(FL, "first-route > rule-0-match-0", Limit(5, Month)),
                sent(FL, "second-route > rule-0-match-0", Limit(1, Year)),
            ],
            requests: vec![
                on(
                    0,
                    user("one"),
                    &[sent(FL, "first-route > rule-0-match-0", Limit(5, Month))],
                ),
                on(0, user("two"), none),
                on(
                    1,
                    user("two"),
                    &[sent(FL, "second-route > rule-0-match-0", Limit(1, Year))],
                ),
            ],
            counters: vec![],
        },
        // Both x-user-id values again (never met), x-org-id, GET or
        // POST, the path, any IPv4 client.
        "multiple-all-match" => Expected {
            entries: vec![
                sent(
                    FL,
                    "first-route > rule-0-match-0 > rule-0-match-1 > rule-0-match-2 > rule-0-method > rule-0-path > \
                     masked_remote_address=0.0.0.0/0",
                    Limit(5, Second),
                ),
                sent(
                    FL,
                    "first-route > rule-0-match-0 > rule-0-match-1 > rule-0-match-2 > rule-0-method > rule-0-path > \
                     masked_remote_address=0.0.0.0/0",
                    Limit(5, Second),
                ),
            ],
            requests: vec![on(
                0,
                Request::new("GET", "foo/bar/baz")
                    .header("x-user-id", "one")
                    .header("x-org-id", "three"),
                none,
            )],
            counters: vec![],
        },
        // Route 0 has policy 1's shared rule, route 1 its own.
        "multiple-domains" => Expected {
            entries: vec![
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/0 > rule-0-match-0",
                    Limit(5, Second),
                ),
                sent(FL, "second-route > rule-0-match-0", Limit(5, Second)),
            ],
            requests: vec![
                on(
                    0,
                    user("one"),
                    &[sent(
                        P1,
                        "test-namespace/test-policy-1/rule/0 > rule-0-match-0",
                        Limit(5, Second),
                    )],
                ),
                on(
                    1,
                    user("one"),
                    &[sent(FL, "second-route > rule-0-match-0", Limit(5, Second))],
                ),
                on(1, Request::get(), none),
            ],
            counters: vec![],
        },
        // Three shared rules of one policy, each a limit per x-user-id.
        "multiple-global-shared-distinct-match" => Expected {
            entries: vec![
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/0 > rule-0-match-0=<x-user-id>",
                    Limit(5, Second),
                ),
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/1 > rule-1-match-0=<x-user-id>",
                    Limit(5, Second),
                ),
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/2 > rule-2-match-0=<x-user-id>",
                    Limit(5, Second),
                ),
            ],
            requests: vec![
                on(
                    0,
                    user("alice"),
                    &[
                        sent(
                            P1,
                            "test-namespace/test-policy-1/rule/0 > rule-0-match-0=alice",
                            Limit(5, Second),
                        ),
                        sent(
                            P1,
                            "test-namespace/test-policy-1/rule/1 > rule-1-match-0=alice",
                            Limit(5, Second),
                        ),
                        sent(
                            P1,
                            "test-namespace/test-policy-1/rule/2 > rule-2-match-0=alice",
                            Limit(5, Second),
                        ),
                    ],
                ),
                on(0, Request::get(), none),
            ],
            counters: vec![apart((0, user("alice")), (0, user("bob")))],
        },
        // The same route name on two listeners: each its own domain.
        "multiple-listeners-distinct-match" => Expected {
            entries: vec![
                sent(FL, "first-route > rule-0-match-0=<x-user-id>", Limit(5, Second)),
                sent(SL, "first-route > rule-0-match-0=<x-user-id>", Limit(5, Second)),
            ],
            requests: vec![
                on(
                    0,
                    user("alice"),
                    &[sent(FL, "first-route > rule-0-match-0=alice", Limit(5, Second))],
                ),
                on(
                    1,
                    user("alice"),
                    &[sent(SL, "first-route > rule-0-match-0=alice", Limit(5, Second))],
                ),
            ],
            counters: vec![apart((0, user("alice")), (1, user("alice")))],
        },
        // One shared rule on two listeners: one counter per user for both.
        "multiple-listeners-same-shared-distinct-match" => Expected {
            entries: vec![
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/0 > rule-0-match-0=<x-user-id>",
                    Limit(5, Second),
                ),
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/0 > rule-0-match-0=<x-user-id>",
                    Limit(5, Second),
                ),
            ],
            requests: vec![
                on(
                    1,
                    user("alice"),
                    &[sent(
                        P1,
                        "test-namespace/test-policy-1/rule/0 > rule-0-match-0=alice",
                        Limit(5, Second),
                    )],
                ),
                on(1, Request::get(), none),
            ],
            counters: vec![
                together((0, user("alice")), (1, user("alice"))),
                apart((0, user("alice")), (1, user("bob"))),
            ],
        },
        // The first listener's rule is not shared, the second's is.
        "multiple-listeners-shared-distinct-match" => Expected {
            entries: vec![
                sent(FL, "first-route > rule-0-match-0=<x-user-id>", Limit(5, Second)),
                sent(
                    P2,
                    "test-namespace/test-policy-2/rule/0 > rule-0-match-0=<x-user-id>",
                    Limit(5, Second),
                ),
            ],
            requests: vec![
                on(
                    0,
                    user("alice"),
                    &[sent(FL, "first-route > rule-0-match-0=alice", Limit(5, Second))],
                ),
                on(
                    1,
                    user("alice"),
                    &[sent(
                        P2,
                        "test-namespace/test-policy-2/rule/0 > rule-0-match-0=alice",
                        Limit(5, Second),
                    )],
                ),
            ],
            counters: vec![],
        },
        // One address, two routes, two limits.
        "multiple-masked-remote-address-match-with-same-cidr" => Expected {
            entries: vec![
                sent(
                    FL,
                    "first-route > masked_remote_address=192.168.0.10/32",
                    Limit(15, Hour),
                ),
                sent(
                    FL,
                    "second-route > masked_remote_address=192.168.0.10/32",
                    Limit(300, Hour),
                ),
            ],
            requests: vec![
                on(
                    0,
                    client("192.168.0.10"),
                    &[sent(
                        FL,
                        "first-route > masked_remote_address=192.168.0.10/32",
                        Limit(15, Hour),
                    )],
                ),
                on(0, client("192.168.0.11"), none),
                on(
                    1,
                    client("192.168.0.10"),
                    &[sent(
                        FL,
                        "second-route > masked_remote_address=192.168.0.10/32",
                        Limit(300, Hour),
                    )],
                ),
            ],
            counters: vec![],
        },
        // x-user-id both `one` and `two` again: never met.
        "multiple-matches" => Expected {
            entries: vec![sent(
                FL,
                "first-route > rule-0-match-0 > rule-0-match-1",
                Limit(5, Second),
            )],
            requests: vec![
                on(0, user("one"), none),
                on(0, user("two"), none),
                on(0, user("one").header("x-user-id", "two"), none),
            ],
            counters: vec![],
        },
        "multiple-routes" => Expected {
            entries: vec![
                sent(FL, "first-route > rule-0-match-0", Limit(5, Second)),
                sent(FL, "second-route > rule-0-match-0", Limit(10, Second)),
            ],
            requests: vec![
                on(
                    0,
                    user("one"),
                    &[sent(FL, "first-route > rule-0-match-0", Limit(5, Second))],
                ),
                on(0, user("two"), none),
                on(
                    1,
                    user("two"),
                    &[sent(FL, "second-route > rule-0-match-0", Limit(10, Second))],
                ),
                on(1, user("one"), none),
            ],
            counters: vec![],
        },
        // Rule 1's limit is the largest a policy may give (2^32 - 1).
        "multiple-rules" => Expected {
            entries: vec![
                sent(FL, "first-route > rule-0-match-0", Limit(5, Second)),
                sent(FL, "first-route > rule-1-match-0", Limit(4_294_967_295, Second)),
            ],
            requests: vec![
                on(
                    0,
                    user("one"),
                    &[sent(FL, "first-route > rule-0-match-0", Limit(5, Second))],
                ),
                on(
                    0,
                    user("two"),
                    &[sent(FL, "first-route > rule-1-match-0", Limit(4_294_967_295, Second))],
                ),
                on(0, user("three"), none),
            ],
            counters: vec![],
        },
        // Rules 0 and 2 are shared (policy 1's domain, numbered 0 and 1
        // there), rules 1 and 3 are not (the listener's, numbered 0 and 1).
        "multiple-shared-and-unshared" => Expected {
            entries: vec![
                sent(FL, "first-route > rule-0-match-0", Limit(5, Second)),
                sent(FL, "first-route > rule-1-match-0", Limit(5, Second)),
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/0 > rule-0-match-0",
                    Limit(5, Second),
                ),
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/2 > rule-1-match-0",
                    Limit(5, Second),
                ),
            ],
            requests: vec![
                on(
                    0,
                    user("one"),
                    &[sent(
                        P1,
                        "test-namespace/test-policy-1/rule/0 > rule-0-match-0",
                        Limit(5, Second),
                    )],
                ),
                on(
                    0,
                    user("two"),
                    &[sent(FL, "first-route > rule-0-match-0", Limit(5, Second))],
                ),
                on(
                    0,
                    user("three"),
                    &[sent(
                        P1,
                        "test-namespace/test-policy-1/rule/2 > rule-1-match-0",
                        Limit(5, Second),
                    )],
                ),
                on(
                    0,
                    user("four"),
                    &[sent(FL, "first-route > rule-1-match-0", Limit(5, Second))],
                ),
                on(0, user("five"), none),
            ],
            counters: vec![],
        },
        // Rules 0 (1/s) and 1 (2/s) shared, rule 2 (3/s) not.
        "multiple-shared-ratelimit-rules" => Expected {
            entries: vec![
                sent(FL, "first-route > rule-0-match-0", Limit(3, Second)),
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/0 > rule-0-match-0",
                    Limit(1, Second),
                ),
                sent(
                    P1,
                    "test-namespace/test-policy-1/rule/1 > rule-1-match-0",
                    Limit(2, Second),
                ),
            ],
            requests: vec![
                on(
                    0,
                    user("one"),
                    &[sent(
                        P1,
                        "test-namespace/test-policy-1/rule/0 > rule-0-match-0",
                        Limit(1, Second),
                    )],
                ),
                on(
                    0,
                    user("two"),
                    &[sent(
                        P1,
                        "test-namespace/test-policy-1/rule/1 > rule-1-match-0",
                        Limit(2, Second),
                    )],
                ),
                on(
                    0,
                    user("three"),
                    &[sent(FL, "first-route > rule-0-match-0", Limit(3, Second))],
                ),
            ],
            counters: vec![],
        },
        // Rule 0: the path exactly, rule 1: the path by regular expression.
        "path-match" => Expected {
            entries: vec![
                sent(FL, "first-route > rule-0-path", Limit(5, Second)),
                sent(FL, "first-route > rule-1-path", Limit(5, Second)),
            ],
            requests: vec![
                on(
                    0,
                    Request::new("GET", "foo/bar"),
                    &[
                        sent(FL, "first-route > rule-0-path", Limit(5, Second)),
                        sent(FL, "first-route > rule-1-path", Limit(5, Second)),
                    ],
                ),
                on(0, Request::new("GET", "foo/baz"), none),
            ],
            counters: vec![],
        },
        // x-user-id: one and ?user=alice, both.
        "query-parameters-match" => Expected {
            entries: vec![sent(
                FL,
                "first-route > rule-0-match-0 > rule-0-match-1",
                Limit(5, Second),
            )],
            requests: vec![
                on(
                    0,
                    Request::new("GET", "/?user=alice").header("x-user-id", "one"),
                    &[sent(
                        FL,
                        "first-route > rule-0-match-0 > rule-0-match-1",
                        Limit(5, Second),
                    )],
                ),
                on(
                    0,
                    Request::new("GET", "/?page=2&user=alice").header("x-user-id", "one"),
                    &[sent(
                        FL,
                        "first-route > rule-0-match-0 > rule-0-match-1",
                        Limit(5, Second),
                    )],
                ),
                on(0, Request::new("GET", "/?user=bob").header("x-user-id", "one"), none),
                on(0, Request::new("GET", "/").header("x-user-id", "one"), none),
                on(0, Request::new("GET", "/?user=alice"), none),
            ],
            counters: vec![],
        },
        // Every client but those of 192.168.0.0/24, together.
        "ratelimit-sourceip-invert" => Expected {
            entries: vec![sent(
                FL,
                "first-route > masked_remote_address=invert:192.168.0.0/24",
                Limit(5, Second),
            )],
            requests: vec![
                on(
                    0,
                    client("10.0.0.1"),
                    &[sent(
                        FL,
                        "first-route > masked_remote_address=invert:192.168.0.0/24",
                        Limit(5, Second),
                    )],
                ),
                on(0, client("192.168.0.77"), none),
                on(
                    0,
                    client("192.168.1.77"),
                    &[sent(
                        FL,
                        "first-route > masked_remote_address=invert:192.168.0.0/24",
                        Limit(5, Second),
                    )],
                ),
            ],
            counters: vec![together((0, client("10.0.0.1")), (0, client("172.16.0.1")))],
        },
        "value-match" => Expected {
            entries: vec![sent(FL, "first-route > rule-0-match-0", Limit(5, Second))],
            requests: vec![
                on(
                    0,
                    user("one"),
                    &[sent(FL, "first-route > rule-0-match-0", Limit(5, Second))],
                ),
                on(0, user("two"), none),
                on(0, Request::get(), none),
            ],
            counters: vec![],
        },
        other => panic!("the case {other} of the data is not written out in tests/envoy_gateway.rs"),
    }
}

/// One route of a case: its name and its `rate_limits` entries by domain
/// (sorted), each entry's actions.
struct Route {
    name: String,
    by_domain: Vec<(String, Vec<Vec<Action>>)>,
}

fn routes(name: &str) -> Vec<Route> {
    envoy_gateway::case_routes(name)
        .iter()
        .map(|text| {
            let node = marked_yaml::parse_yaml(0, text).unwrap_or_else(|e| panic!("{name}.routes.yaml: {e}"));
            let json = envoy_actions::yaml_to_json(&node);
            let by_domain = json["rateLimitsByDomain"]
                .as_object()
                .unwrap_or_else(|| panic!("{name}.routes.yaml: no rateLimitsByDomain"))
                .iter()
                .map(|(domain, entries)| {
                    let entries = entries
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|entry| envoy_actions::actions(&entry["actions"]))
                        .collect();
                    (domain.clone(), entries)
                })
                .collect();
            Route {
                name: json["routeName"].as_str().unwrap_or_default().to_owned(),
                by_domain,
            }
        })
        .collect()
}

/// The case's configs, each in a file of its own as a rate limit
/// service's folder holds them, loaded together; no warning.
fn load(name: &str) -> Config {
    let dir = TempDir::new("envoy-gateway");
    for (i, yaml) in envoy_gateway::case_configs(name).iter().enumerate() {
        dir.write(&format!("{i}.yaml"), yaml);
    }
    let config = Config::load(std::slice::from_ref(&dir.0)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(config.warnings().is_empty(), "{name}: {:?}", config.warnings());
    config
}

fn borrowed(entries: &Entries) -> Vec<(&str, &str)> {
    entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// What `entries` get in `domain` of `config`.
fn gets(config: &Config, domain: &str, entries: &Entries) -> Gets {
    let domain = config.domain(domain).unwrap_or_else(|| panic!("no domain {domain}"));
    let Some(m) = domain.find(&borrowed(entries)) else {
        return Gets::Nothing;
    };
    match m.rule.limits.as_slice() {
        [] => Gets::Nothing,
        [limit] => {
            let unit = limit.unit.expect("a unit");
            if m.rule.shadow_mode {
                Shadow(limit.requests_per_unit, unit)
            } else {
                Limit(limit.requests_per_unit, unit)
            }
        }
        several => panic!("{entries:?}: {} limits", several.len()),
    }
}

/// Every descriptor Envoy sends for `request` through `route`, with what
/// it gets.
fn send(config: &Config, route: &Route, request: &Request) -> Vec<Sent> {
    let mut out = Vec::new();
    for (domain, entries) in &route.by_domain {
        for actions in entries {
            if let Some(entries) = envoy_actions::descriptor(actions, request) {
                let gets = gets(config, domain, &entries);
                out.push(Sent {
                    domain: domain.clone(),
                    entries,
                    gets,
                });
            }
        }
    }
    out
}

/// The counter keys of the descriptors sent for `request` through
/// `route`, each a limited one.
fn counters(config: &Config, route: &Route, request: &Request) -> Vec<String> {
    let mut keys = Vec::new();
    for (domain, entries) in &route.by_domain {
        for actions in entries {
            let Some(entries) = envoy_actions::descriptor(actions, request) else {
                continue;
            };
            let m = config
                .domain(domain)
                .and_then(|d| d.find(&borrowed(&entries)))
                .unwrap_or_else(|| panic!("{entries:?} matches nothing in {domain}"));
            assert!(!m.rule.limits.is_empty(), "{entries:?}: no limit");
            keys.push(m.counter_key(domain, &borrowed(&entries)));
        }
    }
    keys
}

#[test]
fn every_config_loads_alone_and_beside_its_case() {
    let configs = envoy_gateway::configs();
    assert!(configs.len() >= 26, "{} configs", configs.len());
    for (name, yaml) in &configs {
        let config = Config::parse(name, yaml).unwrap_or_else(|e| panic!("{e}"));
        assert!(config.warnings().is_empty(), "{name}: {:?}", config.warnings());
        // The `name` of the resource is its domain's.
        let domain = config.domains().next().unwrap();
        assert!(yaml.starts_with(&format!("name: {}\n", domain.name)), "{name}");
    }
    let mut domains = 0;
    for name in envoy_gateway::names() {
        let config = load(&name);
        assert_eq!(
            config.domains().count(),
            envoy_gateway::case_configs(&name).len(),
            "{name}"
        );
        domains += config.domains().count();
    }
    assert_eq!(domains, configs.len());
}

#[test]
fn each_descriptor_lands_on_the_rule_made_for_it() {
    let (mut cases, mut descriptors, mut requests) = (0, 0, 0);
    for name in envoy_gateway::names() {
        let config = load(&name);
        let routes = routes(&name);
        let expected = expected(&name);
        cases += 1;

        // Every entry of every route, its conditions met.
        let mut entries = Vec::new();
        for route in &routes {
            for (domain, list) in &route.by_domain {
                for actions in list {
                    let entry = envoy_actions::descriptor_when_met(actions);
                    let gets = gets(&config, domain, &entry);
                    entries.push(Sent {
                        domain: domain.clone(),
                        entries: entry,
                        gets,
                    });
                }
            }
        }
        assert_eq!(entries, expected.entries, "{name}: the routes' entries");
        descriptors += entries.len();

        for case in &expected.requests {
            let route = &routes[case.route];
            let got = send(&config, route, &case.request);
            assert_eq!(
                got, case.sent,
                "{name}: through {} (route {}): {:?}",
                route.name, case.route, case.request
            );
            descriptors += got.len();
            requests += 1;
        }

        for ((ra, a), (rb, b), together) in &expected.counters {
            let ka = counters(&config, &routes[*ra], a);
            let kb = counters(&config, &routes[*rb], b);
            assert!(!ka.is_empty() && ka.len() == kb.len(), "{name}: {ka:?} {kb:?}");
            assert_eq!(ka == kb, *together, "{name}: {a:?} and {b:?}: {ka:?} {kb:?}");
        }
    }
    eprintln!("{cases} cases of Envoy Gateway: {descriptors} descriptors checked, from {requests} requests");
}

/// The actions of an entry written in YAML.
fn parse_actions(yaml: &str) -> Vec<Action> {
    let node = marked_yaml::parse_yaml_with_options(0, yaml, marked_yaml::LoaderOptions::default().toplevel_sequence())
        .unwrap();
    envoy_actions::actions(&envoy_actions::yaml_to_json(&node))
}

/// The evaluation itself, on Envoy's documented cases, in the spelling of
/// Envoy's own configuration.
#[test]
fn actions_give_the_descriptors_envoy_documents() {
    let entries = |list: &[(&str, &str)]| -> Option<Entries> {
        Some(list.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
    };
    let run = |yaml: &str, request: &Request| envoy_actions::descriptor(&parse_actions(yaml), request);
    let alice = Request::get().header("X-User-Id", "alice").from("192.168.7.9");

    // A header read; absent, no descriptor, unless it may be skipped.
    let header = "- generic_key: { descriptor_value: api }\n- request_headers: { header_name: x-user-id, \
                  descriptor_key: user }\n";
    assert_eq!(
        run(header, &alice),
        entries(&[("generic_key", "api"), ("user", "alice")])
    );
    assert_eq!(run(header, &Request::get()), None);
    let skip = header.replace("user }", "user, skip_if_absent: true }");
    assert_eq!(run(&skip, &Request::get()), entries(&[("generic_key", "api")]));

    // A header matched, and its opposite; a repeated header is matched on
    // its values joined by `,`.
    let get = "- header_value_match:\n    descriptor_value: reads\n    headers: [{ name: ':method', string_match: { \
               exact: GET } }]\n";
    assert_eq!(run(get, &alice), entries(&[("header_match", "reads")]));
    assert_eq!(run(get, &Request::new("POST", "/")), None);
    let not_get = get.replace("reads\n", "reads\n    expect_match: false\n");
    assert_eq!(
        run(&not_get, &Request::new("POST", "/")),
        entries(&[("header_match", "reads")])
    );
    assert_eq!(run(&not_get, &alice), None);
    let both = "- header_value_match:\n    descriptor_key: both\n    descriptor_value: 'y'\n    headers: [{ name: \
                x-user-id, string_match: { exact: 'one,two' } }]\n";
    let one_two = Request::get().header("x-user-id", "one").header("x-user-id", "two");
    assert_eq!(run(both, &one_two), entries(&[("both", "y")]));
    let present =
        "- header_value_match: { descriptor_value: p, headers: [{ name: x-user-id, present_match: true }] }\n";
    assert_eq!(run(present, &alice), entries(&[("header_match", "p")]));
    assert_eq!(run(present, &Request::get()), None);

    // Addresses: as they are, masked, or matched against ranges.
    assert_eq!(
        run("- remote_address: {}\n", &alice),
        entries(&[("remote_address", "192.168.7.9")])
    );
    let masked = "- masked_remote_address: { v4_prefix_mask_len: 24, v6_prefix_mask_len: 64 }\n";
    assert_eq!(
        run(masked, &alice),
        entries(&[("masked_remote_address", "192.168.7.0/24")])
    );
    assert_eq!(
        run(masked, &Request::get().from("2001:db8:1:2:3:4:5:6")),
        entries(&[("masked_remote_address", "2001:db8:1:2::/64")])
    );
    assert_eq!(
        run("- masked_remote_address: {}\n", &alice),
        entries(&[("masked_remote_address", "192.168.7.9/32")])
    );
    let range = "- remote_address_match:\n    descriptor_value: '%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%'\n    \
                 address_matcher: { ranges: [{ address_prefix: 192.168.0.0, prefix_len: 16 }] }\n";
    assert_eq!(run(range, &alice), entries(&[("remote_address_match", "192.168.7.9")]));
    assert_eq!(run(range, &Request::get().from("10.0.0.1")), None);
    let outside = range.replace("ranges", "invert_match: true, ranges");
    assert_eq!(run(&outside, &alice), None);
    assert_eq!(
        run(&outside, &Request::get().from("10.0.0.1")),
        entries(&[("remote_address_match", "10.0.0.1")])
    );

    // Query parameters, matched or read.
    let query = "- query_parameter_value_match: { descriptor_value: q, query_parameters: [{ name: user, string_match: \
                 { prefix: al } }] }\n";
    assert_eq!(
        run(query, &Request::new("GET", "/?user=alice")),
        entries(&[("query_match", "q")])
    );
    assert_eq!(run(query, &Request::new("GET", "/?user=bob")), None);
    let read = "- query_parameters: { query_parameter_name: user, descriptor_key: u }\n";
    assert_eq!(
        run(read, &Request::new("GET", "/?a=1&user=al%20ice")),
        entries(&[("u", "al ice")])
    );
    assert_eq!(run(read, &Request::new("GET", "/?a=1")), None);
}

/// Go's printing of the same actions (Envoy Gateway's) reads as Envoy's
/// spelling does.
#[test]
fn both_spellings_read_alike() {
    let envoy = "- generic_key: { descriptor_key: route, descriptor_value: r }\n- header_value_match:\n    \
                 descriptor_key: k\n    descriptor_value: v\n    expect_match: false\n    headers: [{ name: x-a, \
                 string_match: { safe_regex: { regex: abc } } }]\n- remote_address_match:\n    descriptor_key: m\n    \
                 descriptor_value: n\n    address_matcher: { invert_match: true, ranges: [{ address_prefix: 10.0.0.0, \
                 prefix_len: 8 }] }\n";
    let go = "- ActionSpecifier:\n    GenericKey: { descriptor_key: route, descriptor_value: r }\n- ActionSpecifier:\n    \
              HeaderValueMatch:\n      descriptor_key: k\n      descriptor_value: v\n      expect_match: { value: \
              false }\n      headers:\n      - name: x-a\n        HeaderMatchSpecifier:\n          StringMatch:\n            \
              MatchPattern:\n              SafeRegex: { EngineType: null, regex: abc }\n- ActionSpecifier:\n    \
              RemoteAddressMatch:\n      descriptor_key: m\n      descriptor_value: n\n      address_matcher:\n        \
              invert_match: true\n        ranges: [{ address_prefix: 10.0.0.0, prefix_len: { value: 8 } }]\n";
    let actions = parse_actions(envoy);
    assert_eq!(actions.len(), 3);
    assert_eq!(actions, parse_actions(go));
}
