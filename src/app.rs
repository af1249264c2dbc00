//! Wiring only: start the actors, the poller and the HTTP servers, handle signals, shut down
//! gracefully.
//!
//! Each task takes what it needs and the one shutdown signal (`stop`, a `watch` that turns
//! true). The actors (rules, remediation, reclaim, sharing) receive the poller's publications and
//! hand the poller their series and findings once, at start; the poller calls none of them.
//!
//! SIGHUP reloads the configuration: an invalid new file is rejected, logged and counted, and the
//! running configuration stays. SIGTERM and SIGINT stop the server and the poller within a second.
//! The signal handlers exist before the first change to the node: a stop during a MIG apply (the
//! start-time one included) lets it finish or roll back within `shutdown::CHANGE_BUDGET`, and a
//! SIGHUP during the start-time apply is handled after it. The whole stop fits
//! `shutdown::STOP_BUDGET`, below the unit's `TimeoutStopSec`.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::changes::{MigApply, MigReport, Owner, Setup};
use crate::config::{self, Config, Overrides};
use crate::health::NodeHealth;
use crate::kubernetes::{self, KubeletFeed};
use crate::logging::LogHandle;
use crate::metrics::{self, Collector, RenderConfig};
use crate::poller::{self, Control, FromActors, PollerConfig};
use crate::publication::Published;
use crate::reclaim::cri::{self, PodLabelFeed};
use crate::reclaim::Reclaim;
use crate::sharing::Sharing;
use crate::snapshot::Snapshot;
use crate::{http, AgentCounters};

/// How long in-flight responses get to finish after SIGTERM: with the poller's stop (~150 ms)
/// it keeps the documented "within a second".
const DRAIN: Duration = Duration::from_millis(500);

/// Failures that stop the daemon (exit status 1).
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot listen on {addr}: {source}; {holder}; pick another with --listen")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
        /// What holds the port, as far as this user can tell ([`crate::port_holder`]).
        holder: String,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}; the agent does not start without the TLS or authentication it was asked for")]
    WebConfig(String),
    /// The audit log or the state directory can be written by another user.
    #[error("{0}")]
    Trust(String),
}

impl AppError {
    /// The exit status: 2 for a configuration error (an unusable web config: restarting
    /// cannot help, and the unit's `RestartPreventExitStatus=2` stops it), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            AppError::WebConfig(_) | AppError::Trust(_) => 2,
            AppError::Bind { .. } | AppError::Io(_) => 1,
        }
    }
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
    // The file's value is checked when it is read; NODE_NAME has no file to point at, and a
    // node should not lose its monitoring over it: cut, and said (once per (re)load).
    let (hostname, cut) = config::labels::truncate_value(hostname);
    if cut {
        tracing::warn!(
            limit = config::labels::MAX_LABEL_VALUE,
            "the hostname label value (NODE_NAME or the host name) is longer than the limit; cut to '{hostname}'"
        );
    }
    RenderConfig {
        dcgm: c.metrics_dcgm,
        native: c.metrics_native,
        nvlink_links: c.metrics_nvlink_links,
        hostname,
        hostname_label: c.hostname_label.clone(),
        profile: c.metrics_profile,
        names: c.dcgm_names,
        labelled: Default::default(),
    }
}

/// The background feeds the poller reads: the kubelet's pods, the container runtime's pod labels.
#[derive(Clone)]
struct Feeds {
    kubelet: Option<KubeletFeed>,
    pod_labels: Option<PodLabelFeed>,
}

/// What the owner of changes is given from the configuration (at start and on reload).
fn owner_setup(c: &Config) -> Setup {
    Setup {
        nvml_lib: c.nvml_lib.clone(),
        audit_file: c.audit_file.clone(),
        mig: c.mig.clone(),
    }
}

/// `labelled`: the metric names the running rules select (fixed at start), whose series keep
/// their label pairs on the page for the rules.
fn poller_config(
    c: &Config,
    feeds: &Feeds,
    sharing: &Sharing,
    labelled: &Arc<HashSet<String>>,
) -> PollerConfig {
    PollerConfig {
        nvml_lib: c.nvml_lib.clone(),
        interval: c.interval,
        slow_interval: c.slow_interval,
        expensive_interval: c.expensive_interval,
        profiling_interval: c.profiling_interval,
        render: RenderConfig {
            labelled: labelled.clone(),
            ..render_config(c)
        },
        health: c.health.clone(),
        processes: c.processes.clone(),
        kubelet: feeds.kubelet.clone(),
        sharing: Some(sharing.feed()),
    }
}

/// The reclaim actor's view of the configuration.
fn reclaim_settings(c: &Config, feeds: &Feeds) -> crate::reclaim::Settings {
    crate::reclaim::Settings {
        reclaim: c.reclaim.clone(),
        pod_labels: feeds.pod_labels.clone(),
        accounting: c.accounting.clone(),
        jobs_dir: crate::health::journal_file::state_dir(),
        audit_file: c.audit_file.clone(),
        procfs: c.processes.procfs.clone(),
        interval: c.interval,
    }
}

/// Applies the configured `[mig] layout`, if any, and logs how it went.
async fn converge(owner: &Arc<Owner>, when: &'static str) {
    let Some(layout) = owner.setup().mig.layout else {
        return;
    };
    // One word in the log and the audit records: `start`, or `sighup` for a reload.
    let trigger = if when == "start" { "start" } else { "sighup" };
    let change = MigApply::configured(&layout, false, false, trigger);
    match owner.call(change).await {
        Some(r) => {
            let r = MigReport::new(&layout, r);
            if r.ok() {
                tracing::info!(layout = %layout, outcome = %r.outcome, steps = r.steps, trigger, "MIG layout in place")
            } else {
                tracing::error!(
                    layout = %layout,
                    outcome = %r.outcome,
                    error = r.error.as_deref().unwrap_or(""),
                    pending = ?r.pending,
                    trigger,
                    "MIG layout not reached"
                )
            }
        }
        None => tracing::error!("the MIG apply task failed"),
    }
}

/// The actors that act on publications: rules, remediation and reclaim, and what they give the
/// poller and the router.
struct Actors {
    remediation: crate::remediation::Handle,
    reclaim: Reclaim,
    for_poller: FromActors,
}

/// Starts remediation (which refuses to start without its audit log), the rules and reclaim.
fn start_actors(
    config: &Config,
    rules: &Arc<crate::rules::RuleSet>,
    owner: &Arc<Owner>,
    feeds: &Feeds,
    published: &watch::Receiver<Arc<Published>>,
    stop: &watch::Receiver<bool>,
) -> Result<Actors, AppError> {
    if !config.remediation.routes.is_empty() {
        // Remediation without its audit trail is not started: hooks would run unrecorded.
        owner.audit_ready().map_err(|e| {
            std::io::Error::other(format!("{e}; [remediation] needs it: fix [audit] file"))
        })?;
    }
    let node = crate::remediation::dispatch::Node {
        published: published.clone(),
        procfs: config.processes.procfs.clone(),
    };
    let remediation = crate::remediation::dispatch::spawn(
        config.remediation.clone(),
        owner.clone(),
        Some(node),
        stop.clone(),
    );
    let mut collectors: Vec<Arc<dyn Collector>> = vec![remediation.metrics.clone()];
    if rules.rule_count() > 0 {
        let metrics = Arc::new(crate::rules::RuleMetrics::default());
        crate::rules::task::spawn(
            rules.clone(),
            config.interval,
            published.clone(),
            metrics.clone(),
            remediation.clone(),
            stop.clone(),
        );
        collectors.push(metrics);
    }
    // Reclaim stops when the publications do, after the poller: its last run is recorded.
    let reclaim = crate::reclaim::task::spawn(
        reclaim_settings(config, feeds),
        owner.clone(),
        published.clone(),
    );
    collectors.push(reclaim.series.clone());
    let for_poller = FromActors {
        collectors,
        findings: Some(reclaim.findings.clone()),
    };
    Ok(Actors {
        remediation,
        reclaim,
        for_poller,
    })
}

/// Starts the fleet engines' actors that are configured: the Slurm drain and the NVSentinel
/// connector (`[slurm]`, `[nvsentinel]`; both change only on restart).
fn start_fleet(
    config: &Config,
    owner: &Arc<Owner>,
    published: &watch::Receiver<Arc<Published>>,
    stop: &watch::Receiver<bool>,
    collectors: &mut Vec<Arc<dyn Collector>>,
) {
    if config.slurm.drain {
        collectors.push(crate::slurm::task::spawn(
            &config.slurm,
            owner.clone(),
            published.clone(),
            stop.clone(),
        ));
    }
    if let Some(socket) = &config.nvsentinel.socket {
        let node = render_config(config).hostname;
        collectors.push(crate::nvsentinel::task::spawn(
            socket.clone(),
            crate::nvsentinel::strategy(config.nvsentinel.processing_strategy),
            node,
            published.clone(),
            stop.clone(),
        ));
    }
}

/// Starts the OTLP exporter when `[otlp]` (or the `OTEL_*` environment) gives an endpoint; one
/// whose TLS is unusable is not started, and says why on `/health`.
fn start_otlp(
    config: &Config,
    published: &watch::Receiver<Arc<Published>>,
    stop: &watch::Receiver<bool>,
    collectors: &mut Vec<Arc<dyn Collector>>,
) -> Option<tokio::task::JoinHandle<()>> {
    let o = config.otlp.as_ref()?;
    let origin = crate::otlp::Origin {
        host: nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default(),
        k8s_node: std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()),
        extra: o.resource.clone(),
        started: std::time::SystemTime::now(),
    };
    match crate::otlp::task::spawn(o, origin, published.clone(), stop.clone()) {
        Ok((m, task)) => {
            collectors.push(m);
            Some(task)
        }
        Err(e) => {
            tracing::error!("otlp: {e}; not exporting");
            crate::warnings::set("otlp", Some(format!("otlp: not exporting: {e}")));
            None
        }
    }
}

/// TLS or basic auth asked for and unusable: serving without them would expose what the
/// operator meant to protect, so the agent does not start.
fn load_web_config(config: &Config) -> Result<Option<http::web_config::WebConfig>, AppError> {
    let Some(f) = &config.web_config_file else {
        return Ok(None);
    };
    let w = http::web_config::load(f).map_err(AppError::WebConfig)?;
    tracing::info!(file = %f.display(), "web config: {}", w.describe());
    Ok(Some(w))
}

/// Starts the HTTP servers: TCP (with the web config's TLS and auth), and the API's Unix socket
/// when configured.
async fn start_http(
    config: &Config,
    state: http::AppState,
    web: Option<http::web_config::WebConfig>,
    stop: &watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, AppError> {
    let listener = TcpListener::bind(config.listen).await.map_err(|source| {
        let holder = match source.kind() {
            std::io::ErrorKind::AddrInUse => crate::port_holder::describe(config.listen.port())
                .map_or_else(
                    || {
                        "another program holds the port, one this user cannot see (`sudo ss \
                             -ltnp` names it; dcgm-exporter and the installed gpu-steward use \
                             9400)"
                            .to_string()
                    },
                    |h| format!("the port is held by {h}"),
                ),
            _ => "the address may not be this machine's, or the port is privileged".into(),
        };
        AppError::Bind {
            addr: config.listen,
            source,
            holder,
        }
    })?;
    let local = listener.local_addr()?;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        config = %config.file.as_ref().map_or("built-in defaults".into(), |p| p.display().to_string()),
        "listening on {local}"
    );
    let mut servers = Vec::new();
    if let (Some(path), true) = (&config.api_socket, config.api_enabled) {
        let listener = http::unix::bind(path, config.api_socket_mode)?;
        tracing::info!(socket = %path.display(), "API on the Unix socket");
        servers.push(tokio::spawn(http::unix::serve(
            listener,
            path.clone(),
            http::router(state.clone()),
            config.header_timeout,
            stop.clone(),
        )));
    }
    let api = state.api.clone();
    let app = http::protect(
        http::router(state),
        web.as_ref().map(|w| w.auth.clone()),
        api,
    );
    let limits = http::server::Limits {
        max_connections: config.max_connections,
        header_timeout: config.header_timeout,
        drain: DRAIN,
    };
    let tls = web.and_then(|w| w.tls);
    servers.push(tokio::spawn(http::server::serve(
        listener,
        app,
        limits,
        tls,
        stop.clone(),
    )));
    Ok(servers)
}

/// Runs the daemon until SIGTERM or SIGINT.
pub async fn run(
    loaded: crate::rules::served::Loaded,
    source: ConfigSource,
    log: LogHandle,
) -> Result<(), AppError> {
    let crate::rules::served::Loaded { config, rules } = loaded;
    // Before anything changes the node: a SIGTERM or SIGHUP from now on is an event, never the
    // default action (which kills the process, in the middle of a MIG change if one runs).
    let mut signals = Signals::install()?;
    // The records read back at start (rails, reclaim's count) must be ours: a log another
    // user can replace is refused before anything reads it.
    // `check-config` makes the same check, with the same text.
    crate::audit::check_places(&config.audit_file).map_err(AppError::Trust)?;
    if nix::unistd::getpid().as_raw() == 1 {
        // A container without an init: hooks' orphans come to us (src/exec.rs).
        crate::exec::reap_orphans()?;
        tracing::info!("running as PID 1: reaping orphaned processes");
    }
    let counters = Arc::new(AgentCounters::new());
    let (stop_tx, stop) = watch::channel(false);
    let feeds = start_feeds(&config, &stop);
    // The one owner of changes: every change to the node, from any component, goes through it.
    let owner = Owner::with(owner_setup(&config));
    let sharing = Sharing::new(config.sharing.clone(), owner.clone());
    // The rule set changes only on restart: so do the names whose labels the page keeps.
    let labelled = Arc::new(rules.needs.names.clone());
    let pconfig = poller_config(&config, &feeds, &sharing, &labelled);
    let initial = first_publication(&pconfig, &counters);
    let journal = initial.journal.clone();
    let (tx, published) = watch::channel(Arc::new(initial));

    let web = load_web_config(&config)?;
    say_api(&config);
    let mut actors = start_actors(&config, &rules, &owner, &feeds, &published, &stop)?;
    start_fleet(
        &config,
        &owner,
        &published,
        &stop,
        &mut actors.for_poller.collectors,
    );
    let otlp = start_otlp(
        &config,
        &published,
        &stop,
        &mut actors.for_poller.collectors,
    );
    let state = http::AppState::new(http::AppFields {
        published: published.clone(),
        api: Arc::new(http::api::ApiConfig {
            enabled: config.api_enabled,
            token_file: config.api_token_file.clone(),
            tcp: config.api_tcp,
            recorder: Some(owner.clone()),
        }),
        changes: Some(owner.clone()),
        sharing: Some(sharing.clone()),
        remediation: Some(actors.remediation),
        reclaim: Some(actors.reclaim.view.clone()),
        jobs: Some(actors.reclaim.jobs.clone()),
        audit_file: Some(
            std::path::absolute(&config.audit_file).unwrap_or(config.audit_file.clone()),
        ),
    });
    let servers = start_http(&config, state, web, &stop).await?;
    say_interrupted(&config);
    // The configured MIG layout is in place before the first snapshot: until then /readyz
    // answers 503 (a reboot loses every instance; the kubelet must not see the GPUs first).
    // A stop during it lets it finish or roll back; a reload waits for it.
    let stopping = converge_at_start(&owner, &mut signals).await;
    actors.reclaim.started(Duration::from_secs(5)).await;
    let poller = if stopping {
        None
    } else {
        Some(poller::spawn(
            pconfig,
            counters.clone(),
            journal,
            actors.for_poller,
            tx,
        )?)
    };
    if let Some(poller) = &poller {
        let control = poller.control.clone();
        // A MIG or sharing apply from now on (the start's, the API's, a reload's) wakes the
        // poller when it is done, so the next poll shows the change.
        let wake = control.clone();
        owner.set_waker(Arc::new(move || wake.send(Control::Changed).is_ok()));
        // The device plugin and the memory guard live as long as the daemon.
        sharing.start(&config, published, stop.clone());
        let handles = Handles {
            control: &control,
            feeds,
            sharing: &sharing,
            owner: &owner,
            reclaim: &actors.reclaim,
            labelled: &labelled,
        };
        let running = crate::rules::served::Loaded { config, rules };
        wait_for_signals(&mut signals, running, &source, &log, &counters, handles).await?;
        crate::shutdown::request();
    }

    shut_down(stop_tx, &owner, servers, poller, actors.reclaim, otlp).await;
    Ok(())
}

/// The feeds from outside that live as long as the daemon (`[kubernetes]` and the CRI socket
/// change only on restart): the kubelet's pods, and pod labels for reclaim's exemptions.
fn start_feeds(config: &Config, stop: &watch::Receiver<bool>) -> Feeds {
    let kubelet = config
        .kubernetes
        .enabled
        .then(|| kubernetes::spawn(&config.kubernetes, stop.clone()));
    let r = &config.reclaim;
    let pod_labels = (r.enabled && !r.exempt.pod_labels.is_empty())
        .then(|| cri::spawn(r.cri_socket.clone(), cri::REFRESH, stop.clone()));
    Feeds {
        kubelet,
        pod_labels,
    }
}

/// What `/metrics` and `/health` answer before the first poll: no GPU read yet (not ready),
/// with the journal read back from the state directory.
fn first_publication(pconfig: &PollerConfig, counters: &AgentCounters) -> Published {
    let first = Snapshot::starting(SystemTime::now());
    let health = Arc::new(NodeHealth::default());
    let journal = Arc::new(Mutex::new(crate::health::journal::open(
        crate::health::journal_file::state_dir().as_deref(),
    )));
    Published {
        page: metrics::render(&first, &health, &pconfig.render, counters, &[]),
        snapshot: Arc::new(first),
        health,
        journal,
        interval: pconfig.interval,
    }
}

/// Whether the mutating API is on; a broken token file is said at once (it is checked again on
/// every mutating request).
fn say_api(config: &Config) {
    if !config.api_enabled {
        return;
    }
    match http::api::load_token(&config.api_token_file) {
        Ok(_) => {
            tracing::info!(token_file = %config.api_token_file.display(), "mutating API on")
        }
        Err(e) => tracing::error!("{e}"),
    }
}

/// A MIG apply killed half-way left its intent record: what the start does about it.
fn say_interrupted(config: &Config) {
    let intent = crate::mig::intent::intent_path(&config.audit_file);
    let Some(i) = crate::mig::intent::read_intent(&intent) else {
        return;
    };
    match &config.mig.layout {
        Some(l) => {
            tracing::warn!(layout = %i.layout, pid = i.pid, "a MIG apply was interrupted (the agent was killed during it); converging to the configured layout '{l}'")
        }
        None => {
            tracing::error!(layout = %i.layout, pid = i.pid, "a MIG apply was interrupted (the agent was killed during it) and no [mig] layout is configured; check `gpu-steward mig show` and run `gpu-steward mig apply --layout {}`", i.layout)
        }
    }
}

/// The stop: every task told at once, then each waited for within its share of the budget.
async fn shut_down(
    stop_tx: watch::Sender<bool>,
    owner: &Arc<Owner>,
    servers: Vec<tokio::task::JoinHandle<()>>,
    poller: Option<poller::PollerHandle>,
    reclaim: Reclaim,
    otlp: Option<tokio::task::JoinHandle<()>>,
) {
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    // A MIG apply in flight (a reload's or the API's) stops before its next step and rolls
    // back; it gets the change budget, the rest of the stop runs beside it.
    let change = wait_idle(owner.clone(), crate::shutdown::CHANGE_BUDGET);
    // The servers drain for at most DRAIN each, side by side; the margin covers the tasks' exit.
    let drained = futures_join_all(servers);
    if tokio::time::timeout(DRAIN + Duration::from_millis(100), drained)
        .await
        .is_err()
    {
        tracing::warn!("the HTTP server did not stop in time");
    }
    // Joining the poller waits at most for its current NVML call; its publications then end,
    // and reclaim writes its accounting state one last time.
    if let Some(poller) = poller {
        let _ = tokio::task::spawn_blocking(move || poller.stop()).await;
    }
    if tokio::time::timeout(Duration::from_secs(2), reclaim.stopped())
        .await
        .is_err()
    {
        tracing::warn!("reclaim did not stop in time; its last accounting state may be lost");
    }
    // The OTLP exporter's flush started with the stop and ends within its budget.
    if let Some(otlp) = otlp {
        let left = crate::otlp::task::FLUSH_BUDGET + Duration::from_millis(100);
        if tokio::time::timeout(left, otlp).await.is_err() {
            tracing::warn!("otlp: the flush did not end in time");
        }
    }
    if !change.await {
        tracing::error!(budget = ?crate::shutdown::CHANGE_BUDGET, "the change in flight did not finish within the stop budget (a MIG apply rolls back, and a half-done one leaves its intent record for the next start)");
    }
    tracing::info!("stopped");
}

/// The signal streams, created once before anything changes the node. A signal that arrives
/// while nobody polls its stream is kept (one per kind) and seen at the next poll.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// Converges to the configured layout while answering SIGTERM and SIGINT: a stop lets the apply
/// finish or roll back (it checks [`crate::shutdown`] between steps) within the change budget.
/// SIGHUP stays queued for the signal loop. Returns whether a stop was asked for.
async fn converge_at_start(owner: &Arc<Owner>, signals: &mut Signals) -> bool {
    let apply = converge(owner, "start");
    tokio::pin!(apply);
    tokio::select! {
        _ = &mut apply => return crate::shutdown::requested(),
        _ = signals.term.recv() => {}
        _ = signals.int.recv() => {}
    }
    crate::shutdown::request();
    tracing::warn!("stop asked for during the start-time MIG apply: it stops before its next step and rolls back");
    // The same deadline as the stop's own wait for the apply (`wait_idle`): counted once, from
    // the signal, however many places wait for it.
    let deadline = crate::shutdown::change_deadline().map_or_else(
        || tokio::time::Instant::now() + crate::shutdown::CHANGE_BUDGET,
        tokio::time::Instant::from_std,
    );
    if tokio::time::timeout_at(deadline, apply).await.is_err() {
        tracing::error!(budget = ?crate::shutdown::CHANGE_BUDGET, "the change in flight did not finish within the stop budget (a MIG apply rolls back, and a half-done one leaves its intent record for the next start)");
    }
    true
}

/// Waits until no MIG apply runs, at most until `budget` after the stop (the one deadline of
/// [`crate::shutdown::change_deadline`]; `budget` from now before any stop); whether it got there.
fn wait_idle(owner: Arc<Owner>, budget: Duration) -> impl std::future::Future<Output = bool> {
    let deadline = crate::shutdown::change_deadline().map_or_else(
        || tokio::time::Instant::now() + budget,
        tokio::time::Instant::from_std,
    );
    async move {
        while owner.busy() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}

/// Waits for every task of `tasks`.
async fn futures_join_all(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        let _ = t.await;
    }
}

/// What a reload hands the new configuration to.
struct Handles<'a> {
    control: &'a std::sync::mpsc::Sender<Control>,
    feeds: Feeds,
    sharing: &'a Arc<Sharing>,
    owner: &'a Arc<Owner>,
    reclaim: &'a Reclaim,
    labelled: &'a Arc<HashSet<String>>,
}

async fn wait_for_signals(
    signals: &mut Signals,
    mut current: crate::rules::served::Loaded,
    source: &ConfigSource,
    log: &LogHandle,
    counters: &AgentCounters,
    h: Handles<'_>,
) -> Result<(), AppError> {
    loop {
        tokio::select! {
            _ = signals.term.recv() => return Ok(()),
            _ = signals.int.recv() => return Ok(()),
            _ = signals.hup.recv() => {
                match crate::rules::served::load(&source.path, source.required, &source.overrides) {
                    Ok(loaded) => {
                        let (new, old) = (&loaded.config, &current.config);
                        if (new.listen, new.max_connections, new.header_timeout)
                            != (old.listen, old.max_connections, old.header_timeout)
                        {
                            tracing::warn!("[server] settings change only on restart");
                        }
                        if new.listen != old.listen {
                            tracing::warn!(old = %old.listen, new = %new.listen, "the listen address changes only on restart");
                        }
                        if new.log_format != old.log_format {
                            tracing::warn!("the log format changes only on restart");
                        }
                        if (&new.rule_files, &loaded.rules, &new.remediation)
                            != (&old.rule_files, &current.rules, &old.remediation)
                        {
                            tracing::warn!("[rules] and [remediation] change only on restart");
                        }
                        if new.web_config_file != old.web_config_file {
                            tracing::warn!("[server] web_config_file changes only on restart");
                        }
                        if new.kubernetes != old.kubernetes {
                            tracing::warn!("[kubernetes] changes only on restart");
                        }
                        if new.otlp != old.otlp {
                            tracing::warn!("[otlp] (and the OTEL_* environment) changes only on restart");
                        }
                        if (&new.reclaim.exempt.pod_labels, &new.reclaim.cri_socket)
                            != (&old.reclaim.exempt.pod_labels, &old.reclaim.cri_socket)
                        {
                            tracing::warn!("[reclaim] exempt_pod_labels and cri_socket change only on restart");
                        }
                        log.set_config_level(new.log_level.as_deref());
                        // First: whoever acts from now on records to the new audit log.
                        h.owner.set(owner_setup(new));
                        let _ = h.control.send(Control::Reconfigure(Box::new(poller_config(new, &h.feeds, h.sharing, h.labelled))));
                        h.reclaim.reconfigure(reclaim_settings(new, &h.feeds));
                        h.sharing.reload(old, new);
                        counters.reloads_ok.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(interval = ?new.interval, "configuration reloaded");
                        // In the background: the signal loop must keep answering SIGTERM. At
                        // most one reload apply runs and one waits (a storm of reloads merges).
                        h.owner.after_reload(|m| async move { converge(&m, "reload").await });
                        current = loaded;
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
