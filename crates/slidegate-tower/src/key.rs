//! Which client a request comes from: the key its limits are counted under.

use arrayvec::ArrayString;
use http::Request;
use http::header::{FORWARDED, HeaderName};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// The key a request is counted under.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RequestKey {
    /// One budget for every request.
    Global,
    /// A client address; IPv6 addresses are cut to their network prefix
    /// (see [`PeerIp`]), IPv4 addresses are whole.
    Ip(IpAddr),
    /// Any other text: an API key, a tenant, a user.
    Text(Box<str>),
}

impl slidegate_memory::Key for RequestKey {
    const HEAP: bool = true;

    fn heap_bytes(&self) -> usize {
        match self {
            RequestKey::Text(text) => text.len(),
            RequestKey::Global | RequestKey::Ip(_) => 0,
        }
    }
}

impl RequestKey {
    /// The key as a store holds it: `global`, `ip:<address>` or
    /// `key:<text>`, so that keys of different kinds never meet (the text
    /// `global` is `key:global`). Written into a buffer on the stack: no
    /// allocation unless a text key is longer than 56 bytes.
    pub fn render(&self) -> KeyText {
        let mut out = KeyText::empty();
        match self {
            RequestKey::Global => out.push_str("global"),
            RequestKey::Ip(IpAddr::V4(v4)) => {
                // The common case, without `core::fmt`: at most 18 ASCII
                // bytes, which always fit inline.
                out.push_str("ip:");
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        out.push_byte(b'.');
                    }
                    if octet >= 100 {
                        out.push_byte(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        out.push_byte(b'0' + octet / 10 % 10);
                    }
                    out.push_byte(b'0' + octet % 10);
                }
            }
            RequestKey::Ip(ip) => {
                out.push_str("ip:");
                // An address is at most 45 characters: it always fits.
                let _ = std::fmt::Write::write_fmt(&mut out, format_args!("{ip}"));
            }
            RequestKey::Text(text) => {
                out.push_str("key:");
                out.push_str(text);
            }
        }
        out
    }
}

/// Bytes of a [`KeyText`] held inline.
const INLINE: usize = 60;

/// A [`RequestKey`] rendered as the text a store takes
/// ([`RequestKey::render`]): inline up to 60 bytes (any address, a text key of up to 56), on
/// the heap beyond.
#[derive(Clone)]
pub struct KeyText {
    inline: ArrayString<INLINE>,
    heap: Option<String>,
}

impl KeyText {
    fn empty() -> Self {
        KeyText {
            inline: ArrayString::new(),
            heap: None,
        }
    }

    fn push_str(&mut self, s: &str) {
        if let Some(heap) = &mut self.heap {
            heap.push_str(s);
        } else if self.inline.try_push_str(s).is_err() {
            let mut heap = String::with_capacity(self.inline.len() + s.len());
            heap.push_str(&self.inline);
            heap.push_str(s);
            self.heap = Some(heap);
        }
    }

    /// Pushes one ASCII byte (a digit or a dot).
    fn push_byte(&mut self, b: u8) {
        let c = char::from(b);
        if self.heap.is_some() || self.inline.try_push(c).is_err() {
            self.push_str(c.encode_utf8(&mut [0; 4]));
        }
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        self.heap.as_deref().unwrap_or(&self.inline)
    }
}

impl std::fmt::Write for KeyText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

impl std::fmt::Debug for KeyText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// Finds the key of a request, or `None` when the request carries none.
pub trait KeyExtractor<B>: Send + Sync + 'static {
    /// The key of `request`.
    fn extract(&self, request: &Request<B>) -> Option<RequestKey>;
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<RequestKey> + Send + Sync + 'static,
{
    fn extract(&self, request: &Request<B>) -> Option<RequestKey> {
        self(request)
    }
}

/// Every request under one key.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalKey;

impl<B> KeyExtractor<B> for GlobalKey {
    fn extract(&self, _request: &Request<B>) -> Option<RequestKey> {
        Some(RequestKey::Global)
    }
}

/// The peer's address, as the server saw the connection: a `SocketAddr`
/// in the request's extensions, axum's `ConnectInfo<SocketAddr>` (with
/// the default `axum` feature; serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`), or tonic's
/// `TcpConnectInfo` (with the `tonic` feature; tonic's
/// `Server::builder()` records it for every TCP connection, so a layer
/// given to `Server::builder().layer(..)` keys gRPC calls by their peer
/// with nothing more to write). Behind a TLS listener tonic records a
/// `TlsConnectInfo` instead: key by it with a closure and
/// [`PeerIp::key_of`].
///
/// IPv6 clients usually hold a whole /64 (or more), so an address is cut
/// to its first `v6_prefix` bits (64 by default): limiting single IPv6
/// addresses limits nobody. IPv4-mapped IPv6 addresses count as IPv4.
///
/// ```
/// # use slidegate_tower::{KeyExtractor, PeerIp, RequestKey};
/// # #[cfg(feature = "tonic")] {
/// use tonic::transport::server::TcpConnectInfo;
///
/// let mut request = http::Request::new(());
/// let info = TcpConnectInfo { local_addr: None, remote_addr: Some("[2001:db8:1:2::7]:50051".parse().unwrap()) };
/// request.extensions_mut().insert(info);
/// assert_eq!(PeerIp::new().extract(&request), Some(RequestKey::Ip("2001:db8:1:2::".parse().unwrap())));
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct PeerIp {
    v6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        PeerIp { v6_prefix: 64 }
    }
}

impl PeerIp {
    /// Peer addresses, IPv6 grouped by /64.
    pub fn new() -> Self {
        Self::default()
    }

    /// Groups IPv6 addresses by their first `bits` bits (at most 128).
    pub fn v6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits.min(128);
        self
    }

    /// The key of an address: IPv4 whole, IPv6 cut to the prefix.
    pub fn key_of(&self, ip: IpAddr) -> RequestKey {
        RequestKey::Ip(group(ip, self.v6_prefix))
    }
}

impl<B> KeyExtractor<B> for PeerIp {
    fn extract(&self, request: &Request<B>) -> Option<RequestKey> {
        peer(request).map(|ip| self.key_of(ip))
    }
}

/// The address of an IPv6 network of `bits` bits, or the IPv4 address.
fn group(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        },
    }
}

/// The peer address of the connection, if the server recorded it: a
/// `SocketAddr`, axum's `ConnectInfo` or tonic's `TcpConnectInfo`, in that
/// order.
fn peer<B>(request: &Request<B>) -> Option<IpAddr> {
    let extensions = request.extensions();
    if let Some(addr) = extensions.get::<SocketAddr>() {
        return Some(addr.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(addr.ip());
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
    {
        return Some(addr.ip());
    }
    None
}

/// A network in CIDR form, such as `10.0.0.0/8` or `2001:db8::/32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    bits: u8,
}

/// A network that does not parse, with the text given.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetworkError {
    /// The text.
    pub value: String,
}

impl std::fmt::Display for NetworkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid network `{}`: expected an address or address/prefix-length, such as 10.0.0.0/8",
            self.value
        )
    }
}

impl std::error::Error for NetworkError {}

impl std::str::FromStr for Network {
    type Err = NetworkError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || NetworkError { value: s.to_owned() };
        let (addr, bits) = match s.split_once('/') {
            Some((addr, bits)) => (addr, Some(bits)),
            None => (s, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| err())?;
        let most = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            Some(b) => b.trim().parse::<u8>().ok().filter(|&b| b <= most).ok_or_else(err)?,
            None => most,
        };
        Ok(Network { addr, bits })
    }
}

impl Network {
    /// Whether `ip` is in this network (IPv4-mapped IPv6 addresses count
    /// as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = group(ip, 128);
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.bits)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The client's address behind trusted proxies: when the peer is one of
/// the trusted networks, the addresses it forwards (`Forwarded: for=`, or
/// else `X-Forwarded-For`) are read from the right, and the first one that
/// is not a trusted proxy is the client. A peer that is not trusted is the
/// client itself, whatever headers it sends: anyone can forge them, and the
/// leftmost address is the one a client writes. Addresses are grouped like
/// [`PeerIp`]'s.
#[derive(Clone, Debug)]
pub struct ForwardedFor {
    trusted: Arc<[Network]>,
    peer: PeerIp,
}

impl ForwardedFor {
    /// Trusts the proxies in `trusted`.
    pub fn new(trusted: impl IntoIterator<Item = Network>) -> Self {
        ForwardedFor {
            trusted: trusted.into_iter().collect(),
            peer: PeerIp::default(),
        }
    }

    /// Groups IPv6 clients by their first `bits` bits (64 by default).
    pub fn v6_prefix(mut self, bits: u8) -> Self {
        self.peer = self.peer.v6_prefix(bits);
        self
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(ip))
    }

    /// The client address given the peer and the forwarding headers.
    fn client(&self, peer: IpAddr, headers: &http::HeaderMap) -> Option<IpAddr> {
        if !self.trusts(peer) {
            return Some(peer);
        }
        let hops = forwarded_hops(headers);
        // Right to left, past the trusted proxies. An entry that is not an
        // address (`unknown`, an obfuscated name) stops the walk: what lies
        // left of it cannot be checked.
        let mut client = peer;
        for hop in hops.iter().rev() {
            match hop {
                Some(ip) if self.trusts(*ip) => client = *ip,
                Some(ip) => return Some(*ip),
                None => return None,
            }
        }
        Some(client)
    }
}

impl<B> KeyExtractor<B> for ForwardedFor {
    fn extract(&self, request: &Request<B>) -> Option<RequestKey> {
        let ip = self.client(peer(request)?, request.headers())?;
        Some(self.peer.key_of(ip))
    }
}

/// The forwarded-for addresses, left to right: `Forwarded` if present
/// (RFC 7239), else `X-Forwarded-For`. `None` for an entry that is not an
/// address.
fn forwarded_hops(headers: &http::HeaderMap) -> Vec<Option<IpAddr>> {
    let forwarded: Vec<&http::HeaderValue> = headers.get_all(FORWARDED).iter().collect();
    if !forwarded.is_empty() {
        return forwarded
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("").split(','))
            .filter_map(|element| {
                element
                    .split(';')
                    .filter_map(|pair| pair.split_once('='))
                    .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
                    .map(|(_, value)| parse_node(value.trim().trim_matches('"')))
            })
            .collect();
    }
    headers
        .get_all(HeaderName::from_static("x-forwarded-for"))
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("").split(','))
        .map(|s| parse_node(s.trim()))
        .collect()
}

/// An address, with an optional port: `1.2.3.4`, `1.2.3.4:80`, `[2001:db8::1]`,
/// `[2001:db8::1]:443` or a bare IPv6 address.
fn parse_node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    s.strip_prefix('[')
        .and_then(|rest| rest.split_once(']'))
        .and_then(|(ip, _)| ip.parse().ok())
}

/// The value of a request header (an API key, a tenant id). A missing or
/// empty header gives no key.
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// The value of header `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey { name }
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    fn extract(&self, request: &Request<B>) -> Option<RequestKey> {
        let value = request.headers().get(&self.name)?;
        let text = String::from_utf8_lossy(value.as_bytes());
        (!text.is_empty()).then(|| RequestKey::Text(text.into()))
    }
}

/// What to do with a request that yields no key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MissingKey {
    /// Let it through unlimited.
    Allow,
    /// Refuse it (`429`, as if over the limit, with no `Retry-After`).
    Refuse,
    /// Count it under this key.
    Fallback(RequestKey),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(peer: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder();
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut request = builder.body(()).unwrap();
        request.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
        request
    }

    fn ip(s: &str) -> RequestKey {
        RequestKey::Ip(s.parse().unwrap())
    }

    #[test]
    fn ipv6_peers_are_grouped_by_prefix() {
        let peer = PeerIp::new();
        assert_eq!(
            peer.extract(&request("[2001:db8:1:2:3:4:5:6]:1", &[])),
            Some(ip("2001:db8:1:2::"))
        );
        assert_eq!(
            PeerIp::new()
                .v6_prefix(48)
                .extract(&request("[2001:db8:1:2:3:4:5:6]:1", &[])),
            Some(ip("2001:db8:1::"))
        );
        assert_eq!(
            PeerIp::new().v6_prefix(128).extract(&request("[2001:db8::6]:1", &[])),
            Some(ip("2001:db8::6"))
        );
        assert_eq!(
            peer.extract(&request("[::ffff:192.0.2.7]:1", &[])),
            Some(ip("192.0.2.7"))
        );
        assert_eq!(peer.extract(&request("192.0.2.7:1", &[])), Some(ip("192.0.2.7")));
        assert_eq!(peer.extract(&Request::new(())), None);
    }

    #[test]
    fn networks_parse_and_contain() {
        let net: Network = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains("10.9.8.7".parse().unwrap()));
        assert!(net.contains("::ffff:10.1.1.1".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        let net: Network = "2001:db8::/32".parse().unwrap();
        assert!(net.contains("2001:db8:ffff::1".parse().unwrap()));
        assert!(!net.contains("2001:db9::1".parse().unwrap()));
        let one: Network = "192.0.2.1".parse().unwrap();
        assert!(one.contains("192.0.2.1".parse().unwrap()) && !one.contains("192.0.2.2".parse().unwrap()));
        for bad in ["10.0.0.0/33", "nope", "10.0.0.0/x", "::/129", ""] {
            let err = bad.parse::<Network>().unwrap_err();
            assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
        }
    }

    #[test]
    fn forwarded_addresses_count_only_behind_trusted_proxies() {
        let xff = ForwardedFor::new(["10.0.0.0/8".parse().unwrap()]);
        // An untrusted peer's headers are ignored: it is the client.
        let forged = request("203.0.113.9:5", &[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(xff.extract(&forged), Some(ip("203.0.113.9")));
        // Behind a trusted proxy: the rightmost address that is not trusted,
        // not the leftmost one the client wrote.
        let chain = request("10.0.0.2:5", &[("x-forwarded-for", "6.6.6.6, 198.51.100.4, 10.0.0.3")]);
        assert_eq!(xff.extract(&chain), Some(ip("198.51.100.4")));
        // Several header lines are one list.
        let split = request(
            "10.0.0.2:5",
            &[("x-forwarded-for", "6.6.6.6"), ("x-forwarded-for", "198.51.100.5")],
        );
        assert_eq!(xff.extract(&split), Some(ip("198.51.100.5")));
        // RFC 7239 wins over X-Forwarded-For, with ports and brackets.
        let rfc = request(
            "10.0.0.2:5",
            &[
                (
                    "forwarded",
                    "for=6.6.6.6, for=\"[2001:db8:7::1]:443\";proto=https, for=10.0.0.9",
                ),
                ("x-forwarded-for", "1.1.1.1"),
            ],
        );
        assert_eq!(xff.extract(&rfc), Some(ip("2001:db8:7::")));
        // Only trusted hops: the leftmost trusted one is the client.
        let inner = request("10.0.0.2:5", &[("x-forwarded-for", "10.0.0.7")]);
        assert_eq!(xff.extract(&inner), Some(ip("10.0.0.7")));
        // A hop that is not an address stops the walk: no key.
        let unknown = request("10.0.0.2:5", &[("x-forwarded-for", "6.6.6.6, unknown")]);
        assert_eq!(xff.extract(&unknown), None);
        // A trusted peer that forwards nothing is the client.
        assert_eq!(xff.extract(&request("10.0.0.2:5", &[])), Some(ip("10.0.0.2")));
    }

    /// A request as tonic's server hands it to a layer: the peer only in
    /// its `TcpConnectInfo`.
    #[cfg(feature = "tonic")]
    fn tonic_request(peer: Option<&str>, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder();
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut request = builder.body(()).unwrap();
        request
            .extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: Some("127.0.0.1:50051".parse().unwrap()),
                remote_addr: peer.map(|p| p.parse().unwrap()),
            });
        request
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn tonic_peers_are_keyed_like_any_other() {
        let peer = PeerIp::new();
        assert_eq!(
            peer.extract(&tonic_request(Some("192.0.2.7:1"), &[])),
            Some(ip("192.0.2.7"))
        );
        // IPv6 grouped by /64, or by the prefix asked for.
        let v6 = tonic_request(Some("[2001:db8:1:2:3:4:5:6]:1"), &[]);
        assert_eq!(peer.extract(&v6), Some(ip("2001:db8:1:2::")));
        assert_eq!(PeerIp::new().v6_prefix(48).extract(&v6), Some(ip("2001:db8:1::")));
        // A connection without a peer address gives no key.
        assert_eq!(peer.extract(&tonic_request(None, &[])), None);
        // A `SocketAddr` put there by the server's own code wins.
        let mut both = tonic_request(Some("192.0.2.7:1"), &[]);
        both.extensions_mut()
            .insert("198.51.100.1:2".parse::<SocketAddr>().unwrap());
        assert_eq!(peer.extract(&both), Some(ip("198.51.100.1")));
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn tonic_peers_forward_only_through_trusted_proxies() {
        let xff = ForwardedFor::new(["10.0.0.0/8".parse().unwrap()]);
        let forged = tonic_request(Some("203.0.113.9:5"), &[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(xff.extract(&forged), Some(ip("203.0.113.9")));
        let chain = tonic_request(
            Some("10.0.0.2:5"),
            &[("x-forwarded-for", "6.6.6.6, 198.51.100.4, 10.0.0.3")],
        );
        assert_eq!(xff.extract(&chain), Some(ip("198.51.100.4")));
        let rfc = tonic_request(Some("10.0.0.2:5"), &[("forwarded", "for=\"[2001:db8:7::1]:443\"")]);
        assert_eq!(xff.extract(&rfc), Some(ip("2001:db8:7::")));
        assert_eq!(
            xff.extract(&tonic_request(None, &[("x-forwarded-for", "1.1.1.1")])),
            None
        );
    }

    #[test]
    fn keys_render_with_a_prefix_per_kind() {
        let check = |key: RequestKey, expect: &str| assert_eq!(key.render().as_str(), expect);
        check(RequestKey::Global, "global");
        check(RequestKey::Text("global".into()), "key:global");
        check(ip("192.0.2.7"), "ip:192.0.2.7");
        check(ip("0.10.100.255"), "ip:0.10.100.255");
        check(ip("2001:db8:1:2::"), "ip:2001:db8:1:2::");
        check(
            ip("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"),
            "ip:ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        );
        check(RequestKey::Text("ip:192.0.2.7".into()), "key:ip:192.0.2.7");
        let long = "é".repeat(100);
        check(RequestKey::Text(long.as_str().into()), &format!("key:{long}"));
        let edge = "x".repeat(INLINE - 4);
        check(RequestKey::Text(edge.as_str().into()), &format!("key:{edge}"));
        assert!(RequestKey::Text(edge.as_str().into()).render().heap.is_none());
    }

    #[test]
    fn header_and_global_and_closure_keys() {
        let api = HeaderKey::new(HeaderName::from_static("x-api-key"));
        assert_eq!(
            api.extract(&request("192.0.2.1:1", &[("x-api-key", "k-1")])),
            Some(RequestKey::Text("k-1".into()))
        );
        assert_eq!(api.extract(&request("192.0.2.1:1", &[("x-api-key", "")])), None);
        assert_eq!(api.extract(&request("192.0.2.1:1", &[])), None);
        assert_eq!(GlobalKey.extract(&Request::new(())), Some(RequestKey::Global));
        let by_path = |r: &Request<()>| Some(RequestKey::Text(r.uri().path().into()));
        let r = Request::builder().uri("/a/b").body(()).unwrap();
        assert_eq!(by_path.extract(&r), Some(RequestKey::Text("/a/b".into())));
    }
}
