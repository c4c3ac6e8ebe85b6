//! The xDS client's figures: snapshots applied and refused, and whether
//! the stream to the control plane is open. Every series is made at start,
//! so that each shows 0 before its first event.

use super::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpdateLabels {
    result: &'static str,
}

/// `slidegate_xds_updates_total{result}` and `slidegate_xds_connected`.
pub(super) struct XdsMetrics {
    applied: Counter,
    rejected: Counter,
    connected: Gauge,
}

impl XdsMetrics {
    pub(super) fn new(registry: &mut Registry) -> Self {
        let updates = Family::<UpdateLabels, Counter>::default();
        registry.register(
            "xds_updates",
            "Config snapshots from the xDS control plane, by result: applied (ACKed) or rejected (NACKed) (0 without an xDS config source)",
            updates.clone(),
        );
        // One statement each: `get_or_create` holds the family's lock until
        // its guard drops.
        let applied = updates.get_or_create(&UpdateLabels { result: "applied" }).clone();
        let rejected = updates.get_or_create(&UpdateLabels { result: "rejected" }).clone();
        let connected = Gauge::default();
        registry.register(
            "xds_connected",
            "1 while the stream to the xDS control plane is open, else 0",
            connected.clone(),
        );
        XdsMetrics {
            applied,
            rejected,
            connected,
        }
    }
}

impl Metrics {
    /// Counts a snapshot from the xDS control plane, applied or not.
    pub(crate) fn xds_update(&self, applied: bool) {
        if applied {
            self.xds.applied.inc();
        } else {
            self.xds.rejected.inc();
        }
    }

    /// The stream to the xDS control plane opened or closed.
    pub(crate) fn xds_connected(&self, connected: bool) {
        self.xds.connected.set(i64::from(connected));
    }
}
