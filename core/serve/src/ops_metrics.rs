//! Metrics every long-running program serves: its build, how far its host's clock is off
//! from the database server's, and Prometheus' standard `process_*`.
//!
//! The process figures are read from `/proc/self` at each scrape; where there is no `/proc`
//! (not Linux) they are simply absent, never an error.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Gauge, IntGauge, IntGaugeVec, Opts, Registry};

/// Registers `disbatch_build_info`, `disbatch_clock_offset_seconds` and the `process_*`
/// families in `registry`.
pub fn register(registry: &Registry) -> prometheus::Result<()> {
    let info = IntGaugeVec::new(
        Opts::new(
            "disbatch_build_info",
            "Always 1; its labels name this program's version and git commit",
        ),
        &["version", "git_sha"],
    )?;
    registry.register(Box::new(info.clone()))?;
    info.get_metric_with_label_values(&[disbatch_model::VERSION, disbatch_model::GIT_SHA])?
        .set(1);
    registry.register(Box::new(ClockCollector::new()?))?;
    registry.register(Box::new(ProcessCollector::new()?))
}

/// `disbatch_clock_offset_seconds`, read from `fleet_time` at each scrape; absent until the
/// process has read the server's clock.
struct ClockCollector {
    offset: Gauge,
}

impl ClockCollector {
    fn new() -> prometheus::Result<Self> {
        Ok(ClockCollector {
            offset: Gauge::with_opts(Opts::new(
                "disbatch_clock_offset_seconds",
                "How far this host's clock is ahead of the database server's clock (negative: behind), as last measured; every time another host judges is taken from the server's clock, so this is reported, not used",
            ))?,
        })
    }
}

impl Collector for ClockCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.offset.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(ms) = disbatch_model::fleet_time::offset_ms() else {
            return Vec::new();
        };
        self.offset.set(ms as f64 / 1000.0);
        self.offset.collect()
    }
}

/// Prometheus' standard process families, with the names and meanings its client libraries
/// use, so dashboards made for any exporter work unchanged.
struct ProcessCollector {
    cpu: Counter,
    resident: IntGauge,
    virtual_bytes: IntGauge,
    open_fds: IntGauge,
    max_fds: IntGauge,
    start_time: Gauge,
    descs: Vec<Desc>,
}

impl ProcessCollector {
    fn new() -> prometheus::Result<Self> {
        let cpu = Counter::with_opts(Opts::new(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds",
        ))?;
        let resident = IntGauge::with_opts(Opts::new(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
        ))?;
        let virtual_bytes = IntGauge::with_opts(Opts::new(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
        ))?;
        let open_fds = IntGauge::with_opts(Opts::new(
            "process_open_fds",
            "Number of open file descriptors",
        ))?;
        let max_fds = IntGauge::with_opts(Opts::new(
            "process_max_fds",
            "Maximum number of open file descriptors (the soft limit)",
        ))?;
        let start_time = Gauge::with_opts(Opts::new(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
        ))?;
        let descs = [
            cpu.desc(),
            resident.desc(),
            virtual_bytes.desc(),
            open_fds.desc(),
            max_fds.desc(),
            start_time.desc(),
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        Ok(ProcessCollector {
            cpu,
            resident,
            virtual_bytes,
            open_fds,
            max_fds,
            start_time,
            descs,
        })
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(stat) = read_stat() else {
            return Vec::new();
        };
        let mut families = Vec::new();
        // A counter only grows: it is moved up to the kernel's figure, which never falls.
        let cpu = stat.cpu_seconds - self.cpu.get();
        if cpu > 0.0 {
            self.cpu.inc_by(cpu);
        }
        families.extend(self.cpu.collect());
        self.resident.set(saturating(stat.resident_bytes));
        families.extend(self.resident.collect());
        self.virtual_bytes.set(saturating(stat.virtual_bytes));
        families.extend(self.virtual_bytes.collect());
        if let Some(start) = stat.start_seconds {
            self.start_time.set(start);
            families.extend(self.start_time.collect());
        }
        if let Some(n) = open_fds() {
            self.open_fds.set(saturating(n));
            families.extend(self.open_fds.collect());
        }
        if let Ok((soft, _)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            self.max_fds.set(saturating(soft));
            families.extend(self.max_fds.collect());
        }
        families
    }
}

/// What `/proc/self/stat` says, in the units Prometheus uses.
#[derive(Debug, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    /// None when the boot time cannot be read.
    start_seconds: Option<f64>,
}

fn read_stat() -> Option<Stat> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    let ticks = sysconf(nix::unistd::SysconfVar::CLK_TCK)?;
    let page = sysconf(nix::unistd::SysconfVar::PAGE_SIZE)?;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| boot_time(&s));
    parse_stat(&text, ticks, page, boot)
}

fn sysconf(var: nix::unistd::SysconfVar) -> Option<u64> {
    nix::unistd::sysconf(var)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .filter(|v| *v > 0)
}

/// Parses `/proc/self/stat` (see proc(5)): the command name, in parentheses, may hold spaces
/// and parentheses itself, so fields are counted from the last `)`.
fn parse_stat(text: &str, ticks: u64, page: u64, boot: Option<u64>) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is fields[0]: utime is field 14, stime 15, starttime 22, vsize 23, rss 24.
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    let ticks_f = ticks as f64;
    let cpu_ticks = field(14)?.saturating_add(field(15)?);
    Some(Stat {
        cpu_seconds: cpu_ticks as f64 / ticks_f,
        resident_bytes: field(24)?.saturating_mul(page),
        virtual_bytes: field(23)?,
        start_seconds: boot.map(|b| b as f64 + field(22).unwrap_or(0) as f64 / ticks_f),
    })
}

/// The `btime` line of `/proc/stat`: boot time in seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

fn open_fds() -> Option<u64> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    // The directory's own descriptor is counted, as Prometheus' own collectors count it.
    Some(entries.count() as u64)
}

fn saturating(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 9 0 \
                    1000 123456789 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let s = parse_stat(line, 100, 4096, Some(1_700_000_000)).expect("parsed");
        assert_eq!(
            s,
            Stat {
                cpu_seconds: 3.0,
                resident_bytes: 300 * 4096,
                virtual_bytes: 123_456_789,
                start_seconds: Some(1_700_000_010.0),
            }
        );
        assert_eq!(parse_stat("garbage", 100, 4096, None), None);
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn the_registry_renders_build_info_and_this_process() {
        let registry = Registry::new();
        register(&registry).expect("register");
        let mut out = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut out,
        )
        .expect("encode");
        let text = String::from_utf8(out).expect("utf-8");
        let info = format!(
            "disbatch_build_info{{git_sha=\"{}\",version=\"{}\"}} 1",
            disbatch_model::GIT_SHA,
            disbatch_model::VERSION
        );
        assert!(text.lines().any(|l| l == info), "{info} in\n{text}");
        if cfg!(target_os = "linux") {
            for family in [
                "process_cpu_seconds_total",
                "process_resident_memory_bytes",
                "process_open_fds",
                "process_max_fds",
                "process_start_time_seconds",
            ] {
                assert!(
                    text.contains(&format!("# TYPE {family} ")),
                    "{family} in\n{text}"
                );
            }
        }
    }
}
