//! Generates the Envoy rate limit service (v3) and rate limit quota service
//! (RLQS) types and the xDS client's (the aggregated discovery service,
//! envoyproxy/ratelimit's `RateLimitConfig`) from `proto/`: prost messages,
//! the tonic servers and clients, and proto3-JSON serde impls (pbjson).
//!
//! `protoc` comes from `protoc-bin-vendored`, handed to prost-build through
//! `Config::protoc_executable` (no `PROTOC` variable, no system protoc).

use std::error::Error;
use std::path::PathBuf;

/// The `.proto` files, relative to `proto/`.
const PROTOS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "envoy/type/v3/ratelimit_unit.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
    "envoy/type/v3/ratelimit_strategy.proto",
    "envoy/type/v3/token_bucket.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/service/discovery/v3/discovery.proto",
    "google/rpc/status.proto",
    "ratelimit/config/ratelimit/v3/rls_conf.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let proto_root = manifest_dir.join("proto");
    let protos: Vec<PathBuf> = PROTOS.iter().map(|p| proto_root.join(p)).collect();
    // google/protobuf/*.proto, shipped with the vendored protoc.
    let wkt_include = protoc_bin_vendored::include_path()?;
    let includes = [proto_root.clone(), wkt_include];

    println!("cargo:rerun-if-changed=build.rs");
    for proto in &protos {
        println!("cargo:rerun-if-changed={}", proto.display());
    }

    let descriptor_path = out_dir.join("envoy_descriptor.bin");

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // The client takes any `GrpcService` (tests hand it a
        // `tonic::transport::Channel`): no `connect`, so the library needs no
        // transport feature.
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .file_descriptor_set_path(&descriptor_path)
        // Well-known types from pbjson-types: prost messages with proto3-JSON
        // serde impls (Duration as "1.5s", UInt64Value as a string, ...).
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_with_config(config, &protos, &includes)?;

    let descriptor_set = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_set)?
        .build(&[".envoy", ".google.rpc", ".ratelimit"])?;

    Ok(())
}
