//! The Envoy rate limit service protocol, API v3, and the rate limit quota
//! service's (RLQS): messages, the gRPC servers and clients, and the proto3
//! JSON mapping.
//!
//! The types are generated at build time (`build.rs`) from the `.proto` files
//! under `proto/`, which follow envoyproxy/data-plane-api's packages, names
//! and field numbers:
//!
//! - [`prost`] messages and enums; an enum field is an `i32` on the message,
//!   with typed accessors (e.g. [`rls::RateLimitResponse::overall_code`]);
//! - the tonic server, [`rls::rate_limit_service_server::RateLimitServiceServer`]
//!   wrapping an implementation of
//!   [`rls::rate_limit_service_server::RateLimitService`], and the client,
//!   [`rls::rate_limit_service_client::RateLimitServiceClient`], generated
//!   without `connect` so that it works over any `GrpcService` (a
//!   `tonic::transport::Channel`, for one);
//! - `serde` impls following the proto3 JSON mapping (pbjson), as
//!   envoyproxy/ratelimit's `POST /json` speaks it: lowerCamelCase names on
//!   output and both lowerCamelCase and the proto names on input, enums as
//!   their names (integers accepted on input), 64-bit integers as strings,
//!   durations as `"1.500s"`, default values left out. Unknown fields are an
//!   error when decoding, as with protobuf's own JSON parsers by default.
//!
//! The well-known types (`google.protobuf.*`) are [`pbjson_types`]'s:
//! `google.protobuf.UInt64Value` is [`pbjson_types::UInt64Value`] (a message
//! with a `value: u64`, so an optional field is
//! `Option<pbjson_types::UInt64Value>`), `google.protobuf.Duration` is
//! [`pbjson_types::Duration`], and so on.
//!
//! The xDS client's types are here too: the aggregated discovery service
//! ([`discovery`]: `DiscoveryRequest`, `DiscoveryResponse`, its client and
//! server), `envoy.config.core.v3.Node`, [`google::rpc::Status`], and
//! envoyproxy/ratelimit's `RateLimitConfig` ([`rls_conf`], vendored from
//! its `api/ratelimit/config/ratelimit/v3/rls_conf.proto`).
//!
//! The rate limit quota service, which Envoy's `rate_limit_quota` filter
//! streams to, is [`quota`]: `RateLimitQuotaUsageReports` in,
//! `RateLimitQuotaResponse` out, over the bidirectional stream
//! [`quota::rate_limit_quota_service_server::RateLimitQuotaService::stream_rate_limit_quotas`]
//! (its client too). The strategies it assigns, `RateLimitStrategy` and
//! `TokenBucket`, are in [`types`] (`envoy.type.v3`), beside `RateLimitUnit`.
//!
//! The modules nest by protobuf package ([`envoy`], [`google`],
//! [`ratelimit`]), so that the generated code's cross-package paths
//! resolve; [`rls`], [`descriptor`], [`discovery`], [`rls_conf`], [`quota`]
//! and [`types`] are the short names.

// The generated code is allowed every lint, the crate's panic lints among
// them: it is prost's, pbjson's and tonic's, not ours to restructure.

pub use envoy::extensions::common::ratelimit::v3 as descriptor;
pub use envoy::service::discovery::v3 as discovery;
pub use envoy::service::rate_limit_quota::v3 as quota;
pub use envoy::service::ratelimit::v3 as rls;
pub use envoy::r#type::v3 as types;
pub use ratelimit::config::ratelimit::v3 as rls_conf;

/// Protobuf package `envoy`.
pub mod envoy {
    /// Protobuf package `envoy.service`.
    pub mod service {
        /// Protobuf package `envoy.service.discovery`.
        pub mod discovery {
            /// Protobuf package `envoy.service.discovery.v3`: the aggregated
            /// discovery service (state of the world only) and its request
            /// and response.
            #[allow(
                missing_docs,
                unreachable_pub,
                clippy::all,
                clippy::pedantic,
                clippy::restriction,
                rustdoc::all
            )]
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.service.discovery.v3.rs"));
                include!(concat!(env!("OUT_DIR"), "/envoy.service.discovery.v3.serde.rs"));
            }
        }

        /// Protobuf package `envoy.service.rate_limit_quota`.
        pub mod rate_limit_quota {
            /// Protobuf package `envoy.service.rate_limit_quota.v3`: the
            /// `RateLimitQuotaService` (RLQS), its usage reports and bucket
            /// actions.
            #[allow(
                missing_docs,
                unreachable_pub,
                clippy::all,
                clippy::pedantic,
                clippy::restriction,
                rustdoc::all
            )]
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.service.rate_limit_quota.v3.rs"));
                include!(concat!(env!("OUT_DIR"), "/envoy.service.rate_limit_quota.v3.serde.rs"));
            }
        }

        /// Protobuf package `envoy.service.ratelimit`.
        pub mod ratelimit {
            /// Protobuf package `envoy.service.ratelimit.v3`: the
            /// `RateLimitService` and its request and response.
            #[allow(
                missing_docs,
                unreachable_pub,
                clippy::all,
                clippy::pedantic,
                clippy::restriction,
                rustdoc::all
            )]
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.service.ratelimit.v3.rs"));
                include!(concat!(env!("OUT_DIR"), "/envoy.service.ratelimit.v3.serde.rs"));
            }
        }
    }

    /// Protobuf package `envoy.extensions`.
    pub mod extensions {
        /// Protobuf package `envoy.extensions.common`.
        pub mod common {
            /// Protobuf package `envoy.extensions.common.ratelimit`.
            pub mod ratelimit {
                /// Protobuf package `envoy.extensions.common.ratelimit.v3`:
                /// the rate limit descriptor.
                #[allow(
                    missing_docs,
                    unreachable_pub,
                    clippy::all,
                    clippy::pedantic,
                    clippy::restriction,
                    rustdoc::all
                )]
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.extensions.common.ratelimit.v3.rs"));
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/envoy.extensions.common.ratelimit.v3.serde.rs"
                    ));
                }
            }
        }
    }

    /// Protobuf package `envoy.type`.
    pub mod r#type {
        /// Protobuf package `envoy.type.v3`: the rate limit unit, and the
        /// RLQS strategies (`RateLimitStrategy`, `TokenBucket`).
        #[allow(
            missing_docs,
            unreachable_pub,
            clippy::all,
            clippy::pedantic,
            clippy::restriction,
            rustdoc::all
        )]
        pub mod v3 {
            include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.rs"));
            include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.serde.rs"));
        }
    }

    /// Protobuf package `envoy.config`.
    pub mod config {
        /// Protobuf package `envoy.config.core`.
        pub mod core {
            /// Protobuf package `envoy.config.core.v3`: `HeaderValue`, and the
            /// xDS client's `Node`.
            #[allow(
                missing_docs,
                unreachable_pub,
                clippy::all,
                clippy::pedantic,
                clippy::restriction,
                rustdoc::all
            )]
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.config.core.v3.rs"));
                include!(concat!(env!("OUT_DIR"), "/envoy.config.core.v3.serde.rs"));
            }
        }
    }
}

/// Protobuf package `google`.
pub mod google {
    /// Protobuf package `google.rpc`: the error of a NACK.
    #[allow(
        missing_docs,
        unreachable_pub,
        clippy::all,
        clippy::pedantic,
        clippy::restriction,
        rustdoc::all
    )]
    pub mod rpc {
        include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
        include!(concat!(env!("OUT_DIR"), "/google.rpc.serde.rs"));
    }
}

/// Protobuf package `ratelimit`.
pub mod ratelimit {
    /// Protobuf package `ratelimit.config`.
    pub mod config {
        /// Protobuf package `ratelimit.config.ratelimit`.
        pub mod ratelimit {
            /// Protobuf package `ratelimit.config.ratelimit.v3`:
            /// envoyproxy/ratelimit's config as its xDS resource,
            /// `RateLimitConfig`.
            #[allow(
                missing_docs,
                unreachable_pub,
                clippy::all,
                clippy::pedantic,
                clippy::restriction,
                rustdoc::all
            )]
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/ratelimit.config.ratelimit.v3.rs"));
                include!(concat!(env!("OUT_DIR"), "/ratelimit.config.ratelimit.v3.serde.rs"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::descriptor::RateLimitDescriptor;
    use super::descriptor::rate_limit_descriptor::{Entry, RateLimitOverride};
    use super::envoy::config::core::v3::HeaderValue;
    use super::envoy::r#type::v3::RateLimitUnit;
    use super::rls::rate_limit_response::rate_limit::Unit;
    use super::rls::rate_limit_response::{Code, DescriptorStatus, RateLimit};
    use super::rls::{RateLimitRequest, RateLimitResponse};
    use prost::Message;

    fn entry(key: &str, value: &str) -> Entry {
        Entry {
            key: key.to_owned(),
            value: value.to_owned(),
        }
    }

    #[test]
    fn json_request_in_lower_camel_case() {
        let body = r#"{"domain":"edge_proxy","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}],"hitsAddend":2}"#;
        let request: RateLimitRequest = serde_json::from_str(body).unwrap();
        assert_eq!(request.domain, "edge_proxy");
        assert_eq!(request.hits_addend, 2);
        assert_eq!(request.descriptors.len(), 1);
        let descriptor = &request.descriptors[0];
        assert_eq!(descriptor.entries, [entry("remote_address", "10.0.0.1")]);
        assert_eq!(descriptor.limit, None);
        assert_eq!(descriptor.hits_addend, None);
    }

    #[test]
    fn json_request_with_proto_field_names() {
        let body = r#"{"domain":"edge_proxy","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}],"hits_addend":"3"}],"hits_addend":2}"#;
        let request: RateLimitRequest = serde_json::from_str(body).unwrap();
        assert_eq!(request.domain, "edge_proxy");
        assert_eq!(request.hits_addend, 2);
        assert_eq!(
            request.descriptors[0].hits_addend,
            Some(pbjson_types::UInt64Value { value: 3 })
        );
    }

    #[test]
    fn json_descriptor_hits_addend_and_limit_override() {
        let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":"0","limit":{"requestsPerUnit":5,"unit":"MINUTE"}}]}"#;
        let request: RateLimitRequest = serde_json::from_str(body).unwrap();
        assert_eq!(request.hits_addend, 0);
        let descriptor = &request.descriptors[0];
        // Set to 0 is not unset: a check that consumes nothing.
        assert_eq!(descriptor.hits_addend, Some(pbjson_types::UInt64Value { value: 0 }));
        let limit = descriptor.limit.unwrap();
        assert_eq!(limit.requests_per_unit, 5);
        assert_eq!(limit.unit(), RateLimitUnit::Minute);

        // A JSON number is accepted for a 64-bit integer too, and an enum's
        // number for its name.
        let body = r#"{"entries":[],"hitsAddend":7,"limit":{"requests_per_unit":1,"unit":7}}"#;
        let descriptor: RateLimitDescriptor = serde_json::from_str(body).unwrap();
        assert_eq!(descriptor.hits_addend, Some(pbjson_types::UInt64Value { value: 7 }));
        assert_eq!(descriptor.limit.unwrap().unit(), RateLimitUnit::Week);

        // On output the 64-bit integer is a string, the enum its name.
        assert_eq!(
            serde_json::to_string(&descriptor).unwrap(),
            r#"{"limit":{"requestsPerUnit":1,"unit":"WEEK"},"hitsAddend":"7"}"#
        );
    }

    #[test]
    fn json_response() {
        let response = RateLimitResponse {
            overall_code: Code::OverLimit.into(),
            statuses: vec![DescriptorStatus {
                code: Code::OverLimit.into(),
                current_limit: Some(RateLimit {
                    name: "per_ip".to_owned(),
                    requests_per_unit: 10,
                    unit: Unit::Minute.into(),
                }),
                limit_remaining: 3,
                duration_until_reset: Some(pbjson_types::Duration {
                    seconds: 1,
                    nanos: 500_000_000,
                }),
                quota: None,
            }],
            response_headers_to_add: vec![HeaderValue {
                key: "x-ratelimit-limit".to_owned(),
                value: "10".to_owned(),
                raw_value: Vec::new(),
            }],
            ..RateLimitResponse::default()
        };
        let json = serde_json::to_string(&response).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","#,
                r#""currentLimit":{"name":"per_ip","requestsPerUnit":10,"unit":"MINUTE"},"#,
                r#""limitRemaining":3,"durationUntilReset":"1.500s"}],"#,
                r#""responseHeadersToAdd":[{"key":"x-ratelimit-limit","value":"10"}]}"#,
            )
        );
        // Valid proto3 JSON: it reads back to the same message.
        let back: RateLimitResponse = serde_json::from_str(&json).unwrap();
        assert_eq!(back, response);
        assert_eq!(back.overall_code(), Code::OverLimit);

        // Default values are left out: an OK response with a status that
        // matched no rule.
        let ok = RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses: vec![DescriptorStatus {
                code: Code::Ok.into(),
                ..DescriptorStatus::default()
            }],
            ..RateLimitResponse::default()
        };
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"overallCode":"OK","statuses":[{"code":"OK"}]}"#
        );
    }

    #[test]
    fn binary_field_numbers() {
        let request = RateLimitRequest {
            domain: "d".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![entry("k", "v")],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 5,
                    unit: RateLimitUnit::Minute.into(),
                }),
                hits_addend: Some(pbjson_types::UInt64Value { value: 0 }),
            }],
            hits_addend: 2,
        };
        let bytes = request.encode_to_vec();
        #[rustfmt::skip]
        let expected: &[u8] = &[
            0x0a, 0x01, b'd',             // 1 domain: length-delimited
            0x12, 0x10,                   // 2 descriptors: length-delimited
              0x0a, 0x06,                 //   1 entries
                0x0a, 0x01, b'k',         //     1 key
                0x12, 0x01, b'v',         //     2 value
              0x12, 0x04,                 //   2 limit
                0x08, 0x05,               //     1 requests_per_unit: varint
                0x10, 0x02,               //     2 unit: varint (MINUTE)
              0x1a, 0x00,                 //   3 hits_addend: set, value 0
            0x18, 0x02,                   // 3 hits_addend: varint
        ];
        assert_eq!(bytes, expected);
        let back = RateLimitRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(back, request);
        // An unset UInt64Value is absent from the wire, so presence survives.
        assert_eq!(
            back.descriptors[0].hits_addend,
            Some(pbjson_types::UInt64Value { value: 0 })
        );

        let response = RateLimitResponse {
            overall_code: Code::OverLimit.into(),
            statuses: vec![DescriptorStatus {
                code: Code::OverLimit.into(),
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: 1,
                    unit: Unit::Week.into(),
                }),
                limit_remaining: 0,
                duration_until_reset: Some(pbjson_types::Duration { seconds: 2, nanos: 0 }),
                quota: None,
            }],
            ..RateLimitResponse::default()
        };
        #[rustfmt::skip]
        let expected: &[u8] = &[
            0x08, 0x02,                   // 1 overall_code: OVER_LIMIT
            0x12, 0x0c,                   // 2 statuses
              0x08, 0x02,                 //   1 code
              0x12, 0x04,                 //   2 current_limit
                0x08, 0x01,               //     1 requests_per_unit
                0x10, 0x07,               //     2 unit: WEEK
              0x22, 0x02,                 //   4 duration_until_reset
                0x08, 0x02,               //     1 seconds
        ];
        assert_eq!(response.encode_to_vec(), expected);
    }

    /// The generated server and client talk over a real socket; the client
    /// (built without `connect`) takes a `tonic::transport::Channel`.
    #[tokio::test]
    async fn grpc_server_and_client() {
        use super::rls::rate_limit_service_client::RateLimitServiceClient;
        use super::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};

        struct OverIfHits;
        #[tonic::async_trait]
        impl RateLimitService for OverIfHits {
            async fn should_rate_limit(
                &self,
                request: tonic::Request<RateLimitRequest>,
            ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
                let request = request.into_inner();
                if request.domain.is_empty() {
                    return Err(tonic::Status::invalid_argument("empty domain"));
                }
                let code = if request.hits_addend > 1 {
                    Code::OverLimit
                } else {
                    Code::Ok
                };
                Ok(tonic::Response::new(RateLimitResponse {
                    overall_code: code.into(),
                    ..RateLimitResponse::default()
                }))
            }
        }

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RateLimitServiceServer::new(OverIfHits))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = RateLimitServiceClient::new(channel);
        let request = |hits_addend| RateLimitRequest {
            domain: "d".to_owned(),
            descriptors: Vec::new(),
            hits_addend,
        };
        let response = client.should_rate_limit(request(1)).await.unwrap().into_inner();
        assert_eq!(response.overall_code(), Code::Ok);
        let response = client.should_rate_limit(request(2)).await.unwrap().into_inner();
        assert_eq!(response.overall_code(), Code::OverLimit);
        let status = client.should_rate_limit(RateLimitRequest::default()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        server.abort();
    }

    #[test]
    fn quota_response_with_a_token_bucket_round_trips() {
        use super::quota::rate_limit_quota_response::BucketAction;
        use super::quota::rate_limit_quota_response::bucket_action::{BucketAction as Action, QuotaAssignmentAction};
        use super::quota::{BucketId, RateLimitQuotaResponse};
        use super::types::rate_limit_strategy::Strategy;
        use super::types::{RateLimitStrategy, TokenBucket};

        let response = RateLimitQuotaResponse {
            bucket_action: vec![BucketAction {
                bucket_id: Some(BucketId {
                    bucket: [("k".to_owned(), "v".to_owned())].into(),
                }),
                bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                    assignment_time_to_live: Some(pbjson_types::Duration { seconds: 10, nanos: 0 }),
                    rate_limit_strategy: Some(RateLimitStrategy {
                        strategy: Some(Strategy::TokenBucket(TokenBucket {
                            max_tokens: 5,
                            tokens_per_fill: Some(pbjson_types::UInt32Value { value: 2 }),
                            fill_interval: Some(pbjson_types::Duration { seconds: 1, nanos: 0 }),
                        })),
                    }),
                })),
            }],
        };
        let bytes = response.encode_to_vec();
        #[rustfmt::skip]
        let expected: &[u8] = &[
            0x0a, 0x1e,                   // 1 bucket_action
              0x0a, 0x08,                 //   1 bucket_id
                0x0a, 0x06,               //     1 bucket: one map entry
                  0x0a, 0x01, b'k',       //       key
                  0x12, 0x01, b'v',       //       value
              0x12, 0x12,                 //   2 quota_assignment_action
                0x12, 0x02, 0x08, 0x0a,   //     2 assignment_time_to_live: 10 s
                0x1a, 0x0c,               //     3 rate_limit_strategy
                  0x1a, 0x0a,             //       3 token_bucket
                    0x08, 0x05,           //         1 max_tokens
                    0x12, 0x02, 0x08, 0x02, //       2 tokens_per_fill: 2
                    0x1a, 0x02, 0x08, 0x01, //       3 fill_interval: 1 s
        ];
        assert_eq!(bytes, expected);
        assert_eq!(RateLimitQuotaResponse::decode(bytes.as_slice()).unwrap(), response);
    }

    #[test]
    fn quota_usage_reports_field_numbers() {
        use super::quota::RateLimitQuotaUsageReports;
        use super::quota::rate_limit_quota_usage_reports::BucketQuotaUsage;
        use super::types::RateLimitStrategy;
        use super::types::rate_limit_strategy::{BlanketRule, RequestsPerTimeUnit, Strategy};

        #[rustfmt::skip]
        let bytes: &[u8] = &[
            0x0a, 0x01, b'd',             // 1 domain
            0x12, 0x08,                   // 2 bucket_quota_usages
              0x12, 0x02, 0x08, 0x05,     //   2 time_elapsed: 5 s
              0x18, 0x07,                 //   3 num_requests_allowed
              0x20, 0x03,                 //   4 num_requests_denied
        ];
        let reports = RateLimitQuotaUsageReports::decode(bytes).unwrap();
        assert_eq!(
            reports,
            RateLimitQuotaUsageReports {
                domain: "d".to_owned(),
                bucket_quota_usages: vec![BucketQuotaUsage {
                    bucket_id: None,
                    time_elapsed: Some(pbjson_types::Duration { seconds: 5, nanos: 0 }),
                    num_requests_allowed: 7,
                    num_requests_denied: 3,
                }],
            }
        );

        let deny = RateLimitStrategy {
            strategy: Some(Strategy::BlanketRule(BlanketRule::DenyAll.into())),
        };
        assert_eq!(deny.encode_to_vec(), [0x08, 0x01]);
        let per_unit = RateLimitStrategy {
            strategy: Some(Strategy::RequestsPerTimeUnit(RequestsPerTimeUnit {
                requests_per_time_unit: 9,
                time_unit: RateLimitUnit::Minute.into(),
            })),
        };
        assert_eq!(per_unit.encode_to_vec(), [0x12, 0x04, 0x08, 0x09, 0x10, 0x02]);
    }

    #[test]
    fn quota_service_name() {
        use super::quota::rate_limit_quota_service_server::{RateLimitQuotaService, RateLimitQuotaServiceServer};
        use tonic::server::NamedService;

        fn name<S: RateLimitQuotaService>() -> &'static str {
            <RateLimitQuotaServiceServer<S> as NamedService>::NAME
        }
        struct Never;
        #[tonic::async_trait]
        impl RateLimitQuotaService for Never {
            type StreamRateLimitQuotasStream =
                tokio_stream::Empty<Result<super::quota::RateLimitQuotaResponse, tonic::Status>>;
            async fn stream_rate_limit_quotas(
                &self,
                _: tonic::Request<tonic::Streaming<super::quota::RateLimitQuotaUsageReports>>,
            ) -> Result<tonic::Response<Self::StreamRateLimitQuotasStream>, tonic::Status> {
                Err(tonic::Status::unimplemented("test"))
            }
        }
        // The method's path is `/{NAME}/StreamRateLimitQuotas`.
        assert_eq!(
            name::<Never>(),
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
        );
    }

    #[test]
    fn json_unknown_fields_are_rejected() {
        // pbjson's default, like protobuf's own JSON parsers (Go's protojson
        // included): an unknown field is an error, at any depth.
        let err = serde_json::from_str::<RateLimitRequest>(r#"{"domain":"d","bogus":1}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `bogus`"), "{err}");
        let err = serde_json::from_str::<RateLimitRequest>(
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v","x":""}]}]}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("unknown field `x`"), "{err}");
        // An unknown enum name is an error as well.
        assert!(serde_json::from_str::<RateLimitDescriptor>(r#"{"limit":{"unit":"FORTNIGHT"}}"#).is_err());
    }
}
