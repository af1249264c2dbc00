//! Wiring only: start the poller and the HTTP server, handle signals, shut down gracefully.
//!
//! SIGHUP reloads the configuration: an invalid new file is rejected, logged and counted, and the
//! running configuration stays. SIGTERM and SIGINT stop the server and the poller within a second.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::config::{self, Config, Overrides};
use crate::health::{Journal, NodeHealth};
use crate::kubernetes::{self, KubeletFeed};
use crate::logging::LogHandle;
use crate::metrics::{self, RenderConfig};
use crate::mig::service::MigService;
use crate::poller::{self, Control, PollerConfig, Published};
use crate::reclaim::cri::{self, PodLabelFeed};
use crate::sharing::Sharing;
use crate::snapshot::Snapshot;
use crate::{http, AgentCounters};

/// How long in-flight responses get to finish after SIGTERM: with the poller's stop (~150 ms)
/// it keeps the documented "within a second".
const DRAIN: Duration = Duration::from_millis(500);

/// Failures that stop the daemon (exit status 1).
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot listen on {addr}: {source}; is another exporter (dcgm-exporter?) using the port? pick another with --listen")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}; the agent does not start without the TLS or authentication it was asked for")]
    WebConfig(String),
}

/// Where the configuration comes from, so that SIGHUP can read it again.
pub struct ConfigSource {
    pub path: PathBuf,
    pub required: bool,
    pub overrides: Overrides,
}

/// Builds the renderer's view of the configuration.
fn render_config(c: &Config) -> RenderConfig {
    let hostname = c
        .hostname
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
        })
        .unwrap_or_default();
    RenderConfig {
        dcgm: c.metrics_dcgm,
        native: c.metrics_native,
        hostname,
        hostname_label: c.hostname_label.clone(),
    }
}

/// The background feeds the poller reads: the kubelet's pods, the container runtime's pod labels.
#[derive(Clone)]
struct Feeds {
    kubelet: Option<KubeletFeed>,
    pod_labels: Option<PodLabelFeed>,
}

fn poller_config(c: &Config, feeds: &Feeds, sharing: &Sharing) -> PollerConfig {
    let kubelet = feeds.kubelet.clone();
    PollerConfig {
        nvml_lib: c.nvml_lib.clone(),
        interval: c.interval,
        slow_interval: c.slow_interval,
        expensive_interval: c.expensive_interval,
        render: render_config(c),
        health: c.health.clone(),
        processes: c.processes.clone(),
        kubelet,
        reclaim: c.reclaim.clone(),
        pod_labels: feeds.pod_labels.clone(),
        accounting: c.accounting.clone(),
        audit_file: c.audit_file.clone(),
        sharing: Some(sharing.feed()),
    }
}

/// Applies the configured `[mig] layout`, if any, and logs how it went.
async fn converge(mig: &Arc<MigService>, when: &'static str) {
    let Some(layout) = mig.configured_layout() else {
        return;
    };
    let service = mig.clone();
    let name = layout.clone();
    match tokio::task::spawn_blocking(move || service.apply(&name, false, false)).await {
        Ok(r) if r.ok() => {
            tracing::info!(layout = %layout, outcome = r.outcome, steps = r.steps, when, "MIG layout in place")
        }
        Ok(r) => tracing::error!(
            layout = %layout,
            outcome = r.outcome,
            error = r.error.as_deref().unwrap_or(""),
            pending = ?r.pending,
            when,
            "MIG layout not reached"
        ),
        Err(e) => tracing::error!(error = %e, "the MIG apply task failed"),
    }
}

/// Runs the daemon until SIGTERM or SIGINT.
pub async fn run(config: Config, source: ConfigSource, log: LogHandle) -> Result<(), AppError> {
    let counters = Arc::new(AgentCounters::new());
    // The kubelet client lives as long as the daemon; `[kubernetes]` changes need a restart.
    let (kubelet_stop, kubelet_stop_rx) = watch::channel(false);
    let kubelet = config
        .kubernetes
        .enabled
        .then(|| kubernetes::spawn(&config.kubernetes, kubelet_stop_rx.clone()));
    // Pod labels for reclaim exemptions, from the CRI socket; changes need a restart too.
    let r = &config.reclaim;
    let pod_labels = (r.enabled && !r.exempt.pod_labels.is_empty())
        .then(|| cri::spawn(r.cri_socket.clone(), cri::REFRESH, kubelet_stop_rx));
    let feeds = Feeds {
        kubelet,
        pod_labels,
    };
    let sharing = Sharing::new(
        config.sharing.clone(),
        config.nvml_lib.clone(),
        config.audit_file.clone(),
    );
    let pconfig = poller_config(&config, &feeds, &sharing);
    let first = Snapshot::starting(SystemTime::now());
    let health = Arc::new(NodeHealth::default());
    let journal = Arc::new(Mutex::new(Journal::default()));
    let initial = Published {
        metrics: metrics::render(&first, &health, &pconfig.render, &counters),
        snapshot: Arc::new(first),
        health,
        journal: journal.clone(),
        interval: pconfig.interval,
        reclaim: None,
    };
    let (tx, rx) = watch::channel(Arc::new(initial));

    // TLS or basic auth asked for and unusable: serving without them would expose what the
    // operator meant to protect, so the agent does not start.
    let web = match &config.web_config_file {
        None => None,
        Some(f) => {
            let w = http::web_config::load(f).map_err(AppError::WebConfig)?;
            tracing::info!(file = %f.display(), "web config: {}", w.describe());
            Some(w)
        }
    };
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| AppError::Bind {
            addr: config.listen,
            source,
        })?;
    let local = listener.local_addr()?;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        config = %config.file.as_ref().map_or("built-in defaults".into(), |p| p.display().to_string()),
        "listening on {local}"
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    if config.api_enabled {
        // Checked again on every mutating request; said here so that a broken file shows at once.
        match http::api::load_token(&config.api_token_file) {
            Ok(_) => {
                tracing::info!(token_file = %config.api_token_file.display(), "mutating API on")
            }
            Err(e) => tracing::error!("{e}"),
        }
    }
    let mig = Arc::new(MigService::new(&config));
    let published = rx.clone();
    let audit = if config.remediation.routes.is_empty() {
        None
    } else {
        // Remediation without its audit trail is not started: hooks would run unrecorded.
        Some(
            crate::audit::AuditLog::open(&config.audit_file).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot open the audit log {} that [remediation] needs: {e}; fix [audit] file",
                        config.audit_file.display()
                    ),
                )
            })?,
        )
    };
    let node = crate::remediation::dispatch::Node {
        published: rx.clone(),
        procfs: config.processes.procfs.clone(),
        nvml_lib: config.nvml_lib.clone(),
    };
    let remediation = crate::remediation::dispatch::spawn(
        config.remediation.clone(),
        audit,
        Some(node),
        stop_rx.clone(),
    );
    let rules = (config.rules.rule_count() > 0).then(|| {
        let metrics = Arc::new(crate::rules::RuleMetrics::default());
        crate::rules::task::spawn(
            config.rules.clone(),
            config.interval,
            rx.clone(),
            metrics.clone(),
            remediation.clone(),
            stop_rx.clone(),
        );
        metrics
    });
    let api = Arc::new(http::api::ApiConfig {
        enabled: config.api_enabled,
        token_file: config.api_token_file.clone(),
        tcp: config.api_tcp,
    });
    let ahead = Arc::new(http::ahead::Ahead::new(counters.clone()));
    tokio::spawn(http::ahead::watch(
        rx.clone(),
        ahead.clone(),
        pconfig.interval,
    ));
    let state = http::AppState::new(http::AppFields {
        ahead,
        published: rx,
        api: api.clone(),
        mig: Some(mig.clone()),
        sharing: Some(sharing.clone()),
        rules,
        remediation: Some(remediation),
    });
    let unix = match (&config.api_socket, config.api_enabled) {
        (Some(path), true) => {
            let listener = http::unix::bind(path, config.api_socket_mode)?;
            tracing::info!(socket = %path.display(), "API on the Unix socket");
            Some(tokio::spawn(http::unix::serve(
                listener,
                path.clone(),
                http::router(state.clone()),
                config.header_timeout,
                stop_rx.clone(),
            )))
        }
        _ => None,
    };
    // Connections answer `GET /metrics` themselves unless basic auth or headers stand in front.
    let scrape = web
        .as_ref()
        .is_none_or(|w| w.auth.is_noop())
        .then(|| state.clone());
    let app = http::router(state);
    let app = http::protect(app, web.as_ref().map(|w| w.auth.clone()), api);
    let limits = http::server::Limits {
        max_connections: config.max_connections,
        header_timeout: config.header_timeout,
        drain: DRAIN,
    };
    let tls = web.and_then(|w| w.tls);
    let server = tokio::spawn(http::server::serve(
        listener, app, scrape, limits, tls, stop_rx,
    ));
    // The configured MIG layout is in place before the first snapshot: until then /readyz
    // answers 503 (a reboot loses every instance; the kubelet must not see the GPUs first).
    converge(&mig, "start").await;
    let poller = poller::spawn(pconfig, counters.clone(), journal, tx)?;

    // The device plugin and the memory guard live as long as the daemon.
    let (sharing_stop, sharing_stop_rx) = watch::channel(false);
    sharing.start(&config, published, sharing_stop_rx);
    let control = poller.control.clone();
    let handles = Handles {
        control: &control,
        feeds,
        sharing: &sharing,
        mig: &mig,
    };
    wait_for_signals(config, &source, &log, &counters, handles).await?;

    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    let _ = kubelet_stop.send(true);
    let _ = sharing_stop.send(true);
    // The servers drain for at most DRAIN each, side by side; the margin covers the tasks' exit.
    let unix = async {
        if let Some(unix) = unix {
            let _ = unix.await;
        }
    };
    let both = async {
        let _ = tokio::join!(server, unix);
    };
    if tokio::time::timeout(DRAIN + Duration::from_millis(100), both)
        .await
        .is_err()
    {
        tracing::warn!("the HTTP server did not stop in time");
    }
    // Joining the poller waits at most for its current NVML call.
    let _ = tokio::task::spawn_blocking(move || poller.stop()).await;
    tracing::info!("stopped");
    Ok(())
}

/// What a reload hands the new configuration to.
struct Handles<'a> {
    control: &'a std::sync::mpsc::Sender<Control>,
    feeds: Feeds,
    sharing: &'a Arc<Sharing>,
    mig: &'a Arc<MigService>,
}

async fn wait_for_signals(
    mut current: Config,
    source: &ConfigSource,
    log: &LogHandle,
    counters: &AgentCounters,
    h: Handles<'_>,
) -> Result<(), AppError> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
            _ = hup.recv() => {
                match config::load(&source.path, source.required, &source.overrides) {
                    Ok(new) => {
                        if (new.listen, new.max_connections, new.header_timeout)
                            != (current.listen, current.max_connections, current.header_timeout)
                        {
                            tracing::warn!("[server] settings change only on restart");
                        }
                        if new.listen != current.listen {
                            tracing::warn!(old = %current.listen, new = %new.listen, "the listen address changes only on restart");
                        }
                        if new.log_format != current.log_format {
                            tracing::warn!("the log format changes only on restart");
                        }
                        if (&new.rule_files, &new.rules, &new.remediation)
                            != (&current.rule_files, &current.rules, &current.remediation)
                        {
                            tracing::warn!("[rules] and [remediation] change only on restart");
                        }
                        if new.web_config_file != current.web_config_file {
                            tracing::warn!("[server] web_config_file changes only on restart");
                        }
                        if new.kubernetes != current.kubernetes {
                            tracing::warn!("[kubernetes] changes only on restart");
                        }
                        if (&new.reclaim.exempt.pod_labels, &new.reclaim.cri_socket)
                            != (&current.reclaim.exempt.pod_labels, &current.reclaim.cri_socket)
                        {
                            tracing::warn!("[reclaim] exempt_pod_labels and cri_socket change only on restart");
                        }
                        log.set_config_level(new.log_level.as_deref());
                        let _ = h.control.send(Control::Reconfigure(Box::new(poller_config(&new, &h.feeds, h.sharing))));
                        h.sharing.reload(&current, &new);
                        counters.reloads_ok.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(interval = ?new.interval, "configuration reloaded");
                        h.mig.reconfigure(&new);
                        let m = h.mig.clone();
                        // In the background: the signal loop must keep answering SIGTERM.
                        tokio::spawn(async move { converge(&m, "reload").await });
                        current = new;
                    }
                    Err(e) => {
                        counters.reloads_failed.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(error = %e, "configuration reload rejected; keeping the running configuration");
                    }
                }
            }
        }
    }
}
