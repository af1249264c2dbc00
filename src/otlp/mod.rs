//! `[otlp]`: the publication that `/metrics` serves, pushed to an OpenTelemetry collector as
//! OTLP metrics in the hardware semantic conventions (`hw.gpu.*`, `hw.*`; OpenTelemetry's
//! semantic-conventions main line, docs/hardware/gpu.md and common.md at commit
//! 384d66161cb18704c729645fa8136a148df9571c; status Development). What the conventions do
//! not define goes under `gpu_steward.*`, units in `unit`. docs/metrics.md has the table.
//!
//! - this file: the pure mapping of one publication to an `ExportMetricsServiceRequest` (the
//!   OpenTelemetry project's generated prost types, crate `opentelemetry-proto`);
//! - [`send`]: one export over http/protobuf (hyper) or gRPC (tonic), TLS by rustls;
//! - [`task`]: the actor that exports every interval, queues (bounded), retries and counts.
//!
//! Must not: call NVML (it reads publications only), block the poller, or log header values.

pub mod send;
pub mod task;

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Gauge, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::health::Status;
use crate::publication::Published;
use crate::snapshot::{GpuSnapshot, NvmlStatus};

pub use crate::config::otlp::{OtlpConfig, Protocol};

const MIB: u64 = 1024 * 1024;

/// Who the agent is: the resource of every export.
#[derive(Debug, Clone)]
pub struct Origin {
    /// `host.name`.
    pub host: String,
    /// `k8s.node.name`, when the agent runs in Kubernetes (`NODE_NAME`).
    pub k8s_node: Option<String>,
    /// Attributes from the configuration and `OTEL_RESOURCE_ATTRIBUTES` / `OTEL_SERVICE_NAME`.
    pub extra: Vec<(String, String)>,
    /// The start of every cumulative series: when the agent started.
    pub started: SystemTime,
}

fn kv(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The metrics of one export, built series by series.
struct Builder {
    metrics: Vec<Metric>,
    at: u64,
    start: u64,
}

/// How a metric is aggregated.
#[derive(Clone, Copy)]
enum Kind {
    Gauge,
    /// A cumulative sum: monotonic (Counter) or not (UpDownCounter).
    Sum {
        monotonic: bool,
    },
}

#[derive(Clone, Copy)]
enum Num {
    F(f64),
    I(i64),
}

impl Builder {
    fn point(&mut self, name: &str, unit: &str, kind: Kind, attrs: Vec<KeyValue>, v: Num) {
        let value = Some(match v {
            Num::F(f) => number_data_point::Value::AsDouble(f),
            Num::I(i) => number_data_point::Value::AsInt(i),
        });
        let start = match kind {
            Kind::Gauge => 0,
            Kind::Sum { .. } => self.start,
        };
        let point = NumberDataPoint {
            attributes: attrs,
            start_time_unix_nano: start,
            time_unix_nano: self.at,
            value,
            ..NumberDataPoint::default()
        };
        if let Some(m) = self.metrics.iter_mut().find(|m| m.name == name) {
            match &mut m.data {
                Some(metric::Data::Gauge(g)) => g.data_points.push(point),
                Some(metric::Data::Sum(s)) => s.data_points.push(point),
                _ => {}
            }
            return;
        }
        let data = match kind {
            Kind::Gauge => metric::Data::Gauge(Gauge {
                data_points: vec![point],
            }),
            Kind::Sum { monotonic } => metric::Data::Sum(Sum {
                data_points: vec![point],
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: monotonic,
            }),
        };
        self.metrics.push(Metric {
            name: name.to_string(),
            description: describe(name).to_string(),
            unit: unit.to_string(),
            data: Some(data),
            ..Metric::default()
        });
    }
}

/// Each metric's description (the convention's where it has one).
fn describe(name: &str) -> &'static str {
    match name {
        "hw.gpu.utilization" => "Fraction of time spent in a specific task.",
        "hw.gpu.memory.usage" => "GPU memory used.",
        "hw.gpu.memory.limit" => "Size of the GPU memory.",
        "hw.gpu.memory.utilization" => "Fraction of GPU memory used.",
        "hw.errors" => "Number of errors encountered by the GPU.",
        "hw.energy" => "Energy consumed by the component.",
        "hw.power" => "Instantaneous power consumed by the component.",
        "hw.status" => "Operational status: 1 (true) or 0 (false) for each of the possible states.",
        "gpu_steward.gpu.temperature" => "GPU die temperature.",
        "gpu_steward.gpu.memory.temperature" => "GPU memory (HBM) temperature.",
        "gpu_steward.gpu.power.limit" => "Power limit the driver enforces.",
        "gpu_steward.gpu.clock" => "Current clock frequency, by clock domain.",
        "gpu_steward.gpu.pcie.throughput" => "PCIe throughput, by direction.",
        "gpu_steward.gpu.xid.errors" => {
            "XID errors reported by the driver since the agent started."
        }
        "gpu_steward.gpu.memory.bandwidth.utilization" => {
            "Fraction of time the memory controller was busy (NVML memory utilization)."
        }
        _ => "",
    }
}

/// The `hw.state` of a verdict: pass is `ok`, warn `degraded`, fail `failed`.
pub fn state(status: Status) -> &'static str {
    match status {
        Status::Pass => "ok",
        Status::Warn => "degraded",
        Status::Fail => "failed",
    }
}

/// The states `hw.status` reports, each 1 for the current one and 0 for the others.
pub const STATES: [&str; 3] = ["ok", "degraded", "failed"];

/// The identifying attributes of a GPU (`hw.id` its UUID, or `gpu<index>` while NVML has
/// never answered it).
fn gpu_attrs(g: &GpuSnapshot, driver: Option<&str>, uuid: &str) -> Vec<KeyValue> {
    let id = if uuid.is_empty() {
        format!("gpu{}", g.index)
    } else {
        uuid.to_string()
    };
    let mut a = vec![
        kv("hw.id", id),
        kv("hw.type", "gpu"),
        kv("hw.vendor", "NVIDIA"),
        kv("hw.name", format!("GPU {}", g.index)),
    ];
    if let Some(i) = &g.identity {
        if !i.name.is_empty() {
            a.push(kv("hw.model", i.name.clone()));
        }
        if let Some(s) = i.serial.as_ref().filter(|s| !s.is_empty()) {
            a.push(kv("hw.serial_number", s.clone()));
        }
    }
    if let Some(d) = driver.filter(|d| !d.is_empty()) {
        a.push(kv("hw.driver_version", d));
    }
    a
}

fn with(mut base: Vec<KeyValue>, extra: &[(&str, &str)]) -> Vec<KeyValue> {
    base.extend(extra.iter().map(|(k, v)| kv(k, *v)));
    base
}

/// The request for one publication; `None` while NVML is not up (there is nothing to say
/// about the GPUs, and the agent's own state is on `/health`).
pub fn request(p: &Published, origin: &Origin) -> Option<ExportMetricsServiceRequest> {
    let s = &p.snapshot;
    if s.nvml != NvmlStatus::Up {
        return None;
    }
    let driver = s.driver.as_ref().map(|d| d.driver_version.as_str());
    let mut b = Builder {
        metrics: Vec::new(),
        at: nanos(s.taken_at),
        start: nanos(origin.started),
    };
    for g in &s.gpus {
        let health = p.health.gpu(g.index);
        let uuid = match g.uuid() {
            "" => health.map_or("", |h| h.uuid.as_str()),
            u => u,
        };
        let attrs = gpu_attrs(g, driver, uuid);
        if let Some(h) = health {
            let now = state(h.verdict.status);
            for st in STATES {
                b.point(
                    "hw.status",
                    "1",
                    Kind::Sum { monotonic: false },
                    with(attrs.clone(), &[("hw.state", st)]),
                    Num::I(i64::from(st == now)),
                );
            }
        }
        gpu_readings(&mut b, g, &attrs);
        mig_instances(&mut b, g, &attrs, driver);
    }
    if b.metrics.is_empty() {
        return None;
    }
    let mut resource = vec![
        kv("service.name", "gpu-steward"),
        kv("service.version", env!("CARGO_PKG_VERSION")),
        kv("host.name", origin.host.clone()),
    ];
    if let Some(n) = &origin.k8s_node {
        resource.push(kv("k8s.node.name", n.clone()));
    }
    for (k, v) in &origin.extra {
        match resource.iter_mut().find(|a| &a.key == k) {
            Some(a) => *a = kv(k, v.clone()),
            None => resource.push(kv(k, v.clone())),
        }
    }
    Some(ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: resource,
                ..Resource::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "gpu-steward".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                metrics: b.metrics,
                ..ScopeMetrics::default()
            }],
            ..ResourceMetrics::default()
        }],
    })
}

/// Data points in a request (what a dropped export loses).
pub fn points(r: &ExportMetricsServiceRequest) -> u64 {
    r.resource_metrics
        .iter()
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .map(|m| match &m.data {
            Some(metric::Data::Gauge(g)) => g.data_points.len() as u64,
            Some(metric::Data::Sum(s)) => s.data_points.len() as u64,
            _ => 0,
        })
        .sum()
}

fn ratio(percent: Option<u32>) -> Option<f64> {
    percent.map(|p| f64::from(p) / 100.0)
}

fn gpu_readings(b: &mut Builder, g: &GpuSnapshot, attrs: &[KeyValue]) {
    let r = &g.reading;
    let a = attrs.to_vec();
    for (task, v) in [
        ("general", r.gpu_util_percent),
        ("encoder", r.enc_util_percent),
        ("decoder", r.dec_util_percent),
    ] {
        if let Some(v) = ratio(v) {
            let at = with(a.clone(), &[("hw.gpu.task", task)]);
            b.point("hw.gpu.utilization", "1", Kind::Gauge, at, Num::F(v));
        }
    }
    if let Some(m) = r.memory {
        let updown = Kind::Sum { monotonic: false };
        b.point(
            "hw.gpu.memory.usage",
            "By",
            updown,
            a.clone(),
            Num::I(m.used as i64),
        );
        b.point(
            "hw.gpu.memory.limit",
            "By",
            updown,
            a.clone(),
            Num::I(m.total as i64),
        );
        if m.total > 0 {
            let used = m.used as f64 / m.total as f64;
            b.point(
                "hw.gpu.memory.utilization",
                "1",
                Kind::Gauge,
                a.clone(),
                Num::F(used),
            );
        }
    }
    if let Some(v) = ratio(r.mem_util_percent) {
        let name = "gpu_steward.gpu.memory.bandwidth.utilization";
        b.point(name, "1", Kind::Gauge, a.clone(), Num::F(v));
    }
    if let Some(mw) = r.power_mw {
        let w = f64::from(mw) / 1000.0;
        b.point("hw.power", "W", Kind::Gauge, a.clone(), Num::F(w));
    }
    if let Some(mj) = r.energy_mj {
        let j = mj as f64 / 1000.0;
        b.point(
            "hw.energy",
            "J",
            Kind::Sum { monotonic: true },
            a.clone(),
            Num::F(j),
        );
    }
    if let Some(mw) = r.enforced_power_limit_mw {
        let w = f64::from(mw) / 1000.0;
        b.point(
            "gpu_steward.gpu.power.limit",
            "W",
            Kind::Gauge,
            a.clone(),
            Num::F(w),
        );
    }
    let counter = Kind::Sum { monotonic: true };
    for (kind, v) in [
        ("corrected", r.ecc.corrected_volatile),
        ("uncorrected", r.ecc.uncorrected_volatile),
    ] {
        if let Some(v) = v {
            let at = with(a.clone(), &[("error.type", kind)]);
            b.point("hw.errors", "{error}", counter, at, Num::I(v as i64));
        }
    }
    if let Some(c) = r.temperature_c {
        let name = "gpu_steward.gpu.temperature";
        b.point(name, "Cel", Kind::Gauge, a.clone(), Num::F(f64::from(c)));
    }
    if let Some(c) = r.memory_temperature_c {
        let name = "gpu_steward.gpu.memory.temperature";
        b.point(name, "Cel", Kind::Gauge, a.clone(), Num::F(f64::from(c)));
    }
    for (domain, mhz) in [
        ("graphics", r.clocks_mhz.graphics),
        ("sm", r.clocks_mhz.sm),
        ("memory", r.clocks_mhz.memory),
        ("video", r.clocks_mhz.video),
    ] {
        if let Some(mhz) = mhz {
            let at = with(a.clone(), &[("gpu_steward.clock.domain", domain)]);
            let hz = f64::from(mhz) * 1e6;
            b.point("gpu_steward.gpu.clock", "Hz", Kind::Gauge, at, Num::F(hz));
        }
    }
    for (dir, v) in [
        ("transmit", r.pcie_tx_bytes_per_second),
        ("receive", r.pcie_rx_bytes_per_second),
    ] {
        if let Some(v) = v {
            let at = with(a.clone(), &[("network.io.direction", dir)]);
            b.point(
                "gpu_steward.gpu.pcie.throughput",
                "By/s",
                Kind::Gauge,
                at,
                Num::F(v),
            );
        }
    }
    for (xid, stat) in &g.xids {
        let mut at = a.clone();
        at.push(KeyValue {
            key: "gpu_steward.xid".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::IntValue(*xid as i64)),
            }),
        });
        let name = "gpu_steward.gpu.xid.errors";
        b.point(name, "{error}", counter, at, Num::I(stat.count as i64));
    }
}

/// Each MIG GPU instance as its own component: `hw.id` its MIG device's UUID (or
/// `<GPU UUID>/gi<id>` where the driver lists none), `hw.parent` the GPU's `hw.id`.
fn mig_instances(b: &mut Builder, g: &GpuSnapshot, gpu: &[KeyValue], driver: Option<&str>) {
    let Some(instances) = &g.reading.mig_instances else {
        return;
    };
    let parent = gpu
        .iter()
        .find(|a| a.key == "hw.id")
        .and_then(|a| a.value.as_ref())
        .and_then(|v| match &v.value {
            Some(any_value::Value::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_default();
    for gi in instances {
        let id = gi
            .compute_instances
            .iter()
            .find_map(|ci| ci.uuid.clone())
            .unwrap_or_else(|| format!("{parent}/gi{}", gi.gpu_instance_id));
        let mut a = vec![
            kv("hw.id", id),
            kv("hw.type", "gpu"),
            kv("hw.vendor", "NVIDIA"),
            kv("hw.parent", parent.clone()),
            kv(
                "hw.name",
                format!(
                    "GPU {} MIG {} (GI {})",
                    g.index, gi.profile, gi.gpu_instance_id
                ),
            ),
            kv("hw.model", format!("MIG {}", gi.profile)),
        ];
        if let Some(d) = driver.filter(|d| !d.is_empty()) {
            a.push(kv("hw.driver_version", d));
        }
        let updown = Kind::Sum { monotonic: false };
        let limit = (gi.memory_mib * MIB) as i64;
        b.point(
            "hw.gpu.memory.limit",
            "By",
            updown,
            a.clone(),
            Num::I(limit),
        );
        if let Some(used) = gi.memory_used_bytes {
            b.point(
                "hw.gpu.memory.usage",
                "By",
                updown,
                a.clone(),
                Num::I(used as i64),
            );
            if limit > 0 {
                let f = used as f64 / limit as f64;
                b.point("hw.gpu.memory.utilization", "1", Kind::Gauge, a, Num::F(f));
            }
        }
    }
}
