//! The `dyn` companion of [`Store`], for consumers that pick a store at
//! run time.

use crate::{Decisions, Quota, Store, StoreError, StoreStats};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A boxed future, as [`DynStore`] returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Store`] with boxed futures, so that it can be a trait object; every
/// store is one. `Arc<dyn DynStore>` is a [`Store`] again, and keeps the
/// in-memory store's decisions free of boxing through
/// [`Store::decide_now`].
pub trait DynStore: Send + Sync {
    /// [`Store::decide`], boxed.
    fn decide_boxed<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
        out: &'a mut Decisions,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// [`Store::decide_now`].
    fn decide_now_dyn(
        &self,
        key: &str,
        quotas: &[Quota],
        cost: u64,
        out: &mut Decisions,
    ) -> Option<Result<(), StoreError>>;

    /// [`Store::charge`], boxed.
    fn charge_boxed<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// [`Store::reset`], boxed.
    fn reset_boxed<'a>(&'a self, key: &'a str, quotas: &'a [Quota]) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// [`Store::stats`].
    fn stats_dyn(&self) -> StoreStats;

    /// [`Store::supports`].
    fn supports_dyn(&self, quota: &Quota) -> Result<(), StoreError>;

    /// [`Store::flush`], boxed.
    fn flush_boxed(&self) -> BoxFuture<'_, Result<(), StoreError>>;
}

impl<S: Store> DynStore for S {
    fn decide_boxed<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
        out: &'a mut Decisions,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.decide(key, quotas, cost, out))
    }

    fn decide_now_dyn(
        &self,
        key: &str,
        quotas: &[Quota],
        cost: u64,
        out: &mut Decisions,
    ) -> Option<Result<(), StoreError>> {
        self.decide_now(key, quotas, cost, out)
    }

    fn charge_boxed<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.charge(key, quotas, cost))
    }

    fn reset_boxed<'a>(&'a self, key: &'a str, quotas: &'a [Quota]) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.reset(key, quotas))
    }

    fn stats_dyn(&self) -> StoreStats {
        self.stats()
    }

    fn supports_dyn(&self, quota: &Quota) -> Result<(), StoreError> {
        self.supports(quota)
    }

    fn flush_boxed(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.flush())
    }
}

/// The future of a `dyn` store's call: ready at once when the store
/// decided without IO, boxed otherwise.
pub enum StoreFuture<'a, T> {
    /// Decided already; `None` once taken.
    Ready(Option<T>),
    /// To be awaited.
    Boxed(BoxFuture<'a, T>),
}

impl<T: Unpin> Future for StoreFuture<'_, T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        // Both variants are Unpin: the boxed future is pinned in its box.
        match self.get_mut() {
            StoreFuture::Ready(value) => match value.take() {
                Some(value) => Poll::Ready(value),
                // Polled after completion: a caller's bug; never resolve
                // rather than panic.
                None => Poll::Pending,
            },
            StoreFuture::Boxed(future) => future.as_mut().poll(cx),
        }
    }
}

impl<T: DynStore + ?Sized> Store for Arc<T> {
    fn decide<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
        out: &'a mut Decisions,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        match T::decide_now_dyn(self, key, quotas, cost, out) {
            Some(done) => StoreFuture::Ready(Some(done)),
            None => StoreFuture::Boxed(T::decide_boxed(self, key, quotas, cost, out)),
        }
    }

    fn charge<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        T::charge_boxed(self, key, quotas, cost)
    }

    fn reset<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a {
        T::reset_boxed(self, key, quotas)
    }

    fn stats(&self) -> StoreStats {
        T::stats_dyn(self)
    }

    fn decide_now(
        &self,
        key: &str,
        quotas: &[Quota],
        cost: u64,
        out: &mut Decisions,
    ) -> Option<Result<(), StoreError>> {
        T::decide_now_dyn(self, key, quotas, cost, out)
    }

    fn supports(&self, quota: &Quota) -> Result<(), StoreError> {
        T::supports_dyn(self, quota)
    }

    fn flush(&self) -> impl Future<Output = Result<(), StoreError>> + Send + '_ {
        T::flush_boxed(self)
    }
}
