//! Keys, and the bytes they hold on the heap.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// A key of a [`StateMap`](crate::internals::StateMap): hashable, comparable, and able to
/// say how many bytes it holds on the heap, so that the store's byte budget
/// counts them.
pub trait Key: std::hash::Hash + Eq + Send + Sync + 'static {
    /// Whether keys of this type hold heap memory at all.
    const HEAP: bool = false;

    /// Bytes this key holds on the heap (its capacity).
    fn heap_bytes(&self) -> usize {
        0
    }
}

macro_rules! inline_keys {
    ($($t:ty),*) => { $(impl Key for $t {})* };
}

inline_keys!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, char, bool, IpAddr, Ipv4Addr, Ipv6Addr
);

impl<const N: usize> Key for [u8; N] {}

impl<A: Key, B: Key> Key for (A, B) {
    const HEAP: bool = A::HEAP || B::HEAP;
    fn heap_bytes(&self) -> usize {
        self.0.heap_bytes() + self.1.heap_bytes()
    }
}

impl Key for String {
    const HEAP: bool = true;
    fn heap_bytes(&self) -> usize {
        self.capacity()
    }
}

impl Key for Vec<u8> {
    const HEAP: bool = true;
    fn heap_bytes(&self) -> usize {
        self.capacity()
    }
}

impl Key for Box<str> {
    const HEAP: bool = true;
    fn heap_bytes(&self) -> usize {
        self.len()
    }
}

impl Key for Box<[u8]> {
    const HEAP: bool = true;
    fn heap_bytes(&self) -> usize {
        self.len()
    }
}

/// Shared keys count their whole allocation (two reference counts and the
/// text), as if no other owner existed.
impl Key for Arc<str> {
    const HEAP: bool = true;
    fn heap_bytes(&self) -> usize {
        self.len() + 2 * size_of::<usize>()
    }
}
