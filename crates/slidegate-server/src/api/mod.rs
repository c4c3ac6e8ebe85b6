//! The front ends: gRPC ([`grpc`], the routes a connection serves and
//! tonic's service; [`rlqs`], the quota service's streams) and HTTP ([`http`](mod@http), routes and problem
//! documents; `envoy_metrics`, the metrics listener's), and the wire
//! conversions between their messages and the
//! service's request and answer. They decide through
//! [`crate::service`] and never reach the network layer.

pub(crate) mod envoy_metrics;
pub mod grpc;
pub(crate) mod grpc_routes;
pub mod http;
pub(crate) mod problem;
pub mod rlqs;
pub mod wire;
