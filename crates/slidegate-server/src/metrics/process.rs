//! The Prometheus client libraries' standard process metrics
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …),
//! read from `/proc` at each scrape. Linux only: elsewhere there are none.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The process's figures, read at each scrape.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

/// The process's figures as `/proc` gives them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct ProcessStats {
    /// User and system CPU time, in seconds.
    pub(crate) cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub(crate) resident_bytes: u64,
    /// Virtual memory, in bytes.
    pub(crate) virtual_bytes: u64,
    /// Open file descriptors.
    pub(crate) open_fds: u64,
    /// The soft limit on open file descriptors.
    pub(crate) max_fds: Option<u64>,
    /// When the process started, in seconds since the Unix epoch.
    pub(crate) start_time_seconds: f64,
}

/// Clock ticks per second of `/proc`'s times (`USER_HZ`, 100 on Linux
/// whatever the kernel's own tick rate).
const TICKS: f64 = 100.0;

impl ProcessStats {
    /// The figures of this process, `None` where `/proc` cannot be read
    /// (not Linux, or no `/proc` mounted).
    pub(crate) fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count() as u64);
        ProcessStats::parse(&stat, &status, &boot, &limits, open_fds)
    }

    /// The figures from the texts of `/proc/self/stat`, `/proc/self/status`,
    /// `/proc/stat` and `/proc/self/limits`.
    #[allow(clippy::cast_precision_loss)]
    fn parse(stat: &str, status: &str, boot: &str, limits: &str, open_fds: u64) -> Option<ProcessStats> {
        // The command name, in parentheses, may hold spaces: the fields
        // start after its last `)`, at field 3 (`state`).
        let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
        let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
        let (utime, stime, start) = (field(14)?, field(15)?, field(22)?);
        let kib = |name: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(name))?;
            line.get(name.len()..)?.split_whitespace().next()?.parse::<u64>().ok()
        };
        let btime: u64 = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        let max_fds = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok());
        Some(ProcessStats {
            cpu_seconds: (utime + stime) as f64 / TICKS,
            resident_bytes: kib("VmRSS:").unwrap_or(0).saturating_mul(1024),
            virtual_bytes: kib("VmSize:").unwrap_or(0).saturating_mul(1024),
            open_fds,
            max_fds,
            start_time_seconds: btime as f64 + start as f64 / TICKS,
        })
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(stats) = ProcessStats::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(stats.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let mut gauges = vec![
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                gauge(stats.resident_bytes),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                gauge(stats.virtual_bytes),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                gauge(stats.open_fds),
            ),
        ];
        if let Some(max) = stats.max_fds {
            gauges.push(("process_max_fds", "Maximum number of open file descriptors", gauge(max)));
        }
        for (name, help, value) in gauges {
            let metric = ConstGauge::new(value);
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
        }
        let start = ConstGauge::new(stats.start_time_seconds);
        start.encode(encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            None,
            start.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_texts() {
        let stat = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0 20 0 9 0 1000 123456 789";
        let status = "Name:\ta\nVmSize:\t  2048 kB\nVmRSS:\t   512 kB\n";
        let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 5\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        let stats = ProcessStats::parse(stat, status, boot, limits, 7).unwrap();
        assert_eq!(
            stats,
            ProcessStats {
                cpu_seconds: 4.0,
                resident_bytes: 512 * 1024,
                virtual_bytes: 2048 * 1024,
                open_fds: 7,
                max_fds: Some(1024),
                start_time_seconds: 1_700_000_010.0,
            }
        );
        assert!(ProcessStats::parse("garbage", status, boot, limits, 0).is_none());
        // This process's own, on Linux.
        if cfg!(target_os = "linux") {
            let own = ProcessStats::read().unwrap();
            assert!(own.resident_bytes > 0 && own.open_fds > 0, "{own:?}");
        }
    }
}
