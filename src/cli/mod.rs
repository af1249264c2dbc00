//! The command line, as clap parses it. Every flag also reads `GPU_STEWARD_<FLAG>` from the
//! environment (flag > environment > config file > default). Usage errors exit with status 2.
//!
//! The one-shot subcommands live here, over the library: [`mig`], [`sharing`] and
//! [`check_config`] each load the configuration, call their subsystem, print, and return the
//! exit status for `main`; [`demo`] fills in the demo's defaults. Subsystems must not import
//! this module; the daemon (`run`, `demo`) is started from `main`, which sets up its logging.

pub mod agent_client;
pub mod check_config;
pub mod check_health;
pub mod demo;
pub mod habits;
pub mod job;
pub mod mig;
pub mod sharing;
pub mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{self, LogFormat, Overrides};

#[derive(Debug, Parser)]
#[command(
    name = "gpu-steward",
    version,
    about = "Node-local GPU agent: dcgm-exporter compatible metrics, honest health checks"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Run(RunArgs),
    /// Run the daemon against the simulated NVML with a bundled 8×H100 NVLink node.
    Demo(DemoArgs),
    /// Show, plan and apply MIG layouts (mig-parted compatible).
    Mig(MigArgs),
    /// One screen of the node from the running agent: health, telemetry, MIG, processes,
    /// reclaim candidates and the last changes.
    Status(StatusArgs),
    /// Validate a configuration file and print what it would do.
    CheckConfig {
        /// The file to check.
        file: PathBuf,
    },
    /// Ask the running agent whether its GPUs are healthy, as a node-problem-detector custom
    /// plugin: exit 0 every GPU passes or warns, 1 a GPU fails, 2 the agent cannot tell.
    CheckHealth {
        /// The agent's HTTP listener.
        #[arg(long, env = "GPU_STEWARD_URL", conflicts_with = "socket")]
        url: Option<String>,
        /// The agent's API Unix socket (`[api] socket`), instead of --url.
        #[arg(long, env = "GPU_STEWARD_SOCKET")]
        socket: Option<PathBuf>,
        /// One GPU (index or UUID) instead of all.
        #[arg(long)]
        gpu: Option<String>,
        /// The longest the whole question may take.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// What a job used of this node's GPUs, from the running agent.
    Job {
        #[command(subcommand)]
        action: JobAction,
    },
    /// Show or apply the [sharing] settings: compute mode and time-slice per GPU.
    Sharing {
        #[command(subcommand)]
        action: SharingAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum JobAction {
    /// The report of one job: its GPUs, held and busy time, SM utilization, memory, energy,
    /// XIDs, health conditions and reclaim actions. Exit 1 when the agent has none.
    Report(JobReportArgs),
}

/// Whose report `job report` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum JobKind {
    /// A Slurm job id.
    Slurm,
    /// A pod, as NAMESPACE/NAME.
    Pod,
    /// A systemd unit.
    Unit,
    /// A user name.
    User,
}

#[derive(Debug, Args)]
pub struct JobReportArgs {
    /// The job id (or the pod, unit or user with --kind).
    #[arg(value_name = "JOBID")]
    pub id: String,
    /// What the id names.
    #[arg(long, value_enum, default_value = "slurm")]
    pub kind: JobKind,
    /// Print the report as JSON, as the agent serves it.
    #[arg(long)]
    pub json: bool,
    /// The agent's HTTP listener [default: the [server] listen of the local config].
    #[arg(
        long,
        value_name = "URL",
        env = "GPU_STEWARD_URL",
        conflicts_with = "socket"
    )]
    pub url: Option<String>,
    /// The agent's API Unix socket (`[api] socket`), instead of --url.
    #[arg(long, value_name = "PATH", env = "GPU_STEWARD_SOCKET")]
    pub socket: Option<PathBuf>,
    /// The configuration whose [server] listen says where the agent is, without --url.
    #[arg(long, value_name = "FILE", env = "GPU_STEWARD_CONFIG")]
    pub config: Option<PathBuf>,
    /// The longest the whole question may take.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Subcommand)]
pub enum SharingAction {
    /// Observe the GPUs and print what `apply` would change (changes nothing).
    Show(SharingArgs),
    /// Observe, diff and apply; audited. Exit 1 when the node does not match afterwards.
    Apply {
        /// Print the plan, change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        args: SharingArgs,
    },
}

#[derive(Debug, Args)]
pub struct SharingArgs {
    /// Configuration file (absent default file = built-in defaults).
    #[arg(long, env = "GPU_STEWARD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Run on the simulated node of this scenario (the simulator, its state in FILE.state, and
    /// the stand-in nvidia-smi with its state in FILE.nvidia-smi/), as `demo` does.
    #[arg(long, env = "GPU_STEWARD_SCENARIO", value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// NVML library to load [default: libnvidia-ml.so.1].
    #[arg(long, env = "GPU_STEWARD_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Configuration file (absent default file = built-in defaults).
    #[arg(long, env = "GPU_STEWARD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to serve HTTP on [default: 0.0.0.0:9400].
    #[arg(long, env = "GPU_STEWARD_LISTEN", value_name = "ADDR", value_parser = config::parse_listen)]
    pub listen: Option<SocketAddr>,
    /// NVML library to load [default: libnvidia-ml.so.1].
    #[arg(long, env = "GPU_STEWARD_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<String>,
    /// Poll interval, e.g. 500ms, 5s [default: 5s].
    #[arg(long, env = "GPU_STEWARD_INTERVAL", value_name = "DURATION", value_parser = config::parse_interval)]
    pub interval: Option<Duration>,
    /// Log level (error, warn, info, debug, trace, off) or target=level directives [default: RUST_LOG, else config, else info].
    #[arg(long, env = "GPU_STEWARD_LOG_LEVEL", value_name = "LEVEL", value_parser = config::parse_log_level)]
    pub log_level: Option<String>,
    /// Log format [default: text].
    #[arg(long, env = "GPU_STEWARD_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// TLS and basic auth from a Prometheus exporter-toolkit web config file.
    #[arg(long, env = "GPU_STEWARD_WEB_CONFIG_FILE", value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
    /// The listen address below the config file's (`demo` sets its own); not a flag.
    #[arg(skip)]
    pub default_listen: Option<SocketAddr>,
    /// The `nvidia-smi` for `[sharing]` (`demo` sets the stand-in); not a flag.
    #[arg(skip)]
    pub nvidia_smi: Option<PathBuf>,
    /// `demo`'s throwaway state directory: the health journal, accounting, and the audit log
    /// unless the named config sets `[audit] file`; the installed agent's config is not read
    /// unless named. Not a flag.
    #[arg(skip)]
    pub demo_state: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct MigArgs {
    #[command(subcommand)]
    pub command: MigCommand,
    /// Configuration file (absent default file = built-in defaults).
    #[arg(long, env = "GPU_STEWARD_CONFIG", value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
    /// NVML library to load [default: libnvidia-ml.so.1].
    #[arg(long, env = "GPU_STEWARD_NVML_LIB", value_name = "PATH", global = true)]
    pub nvml_lib: Option<String>,
    /// Run on the simulated node of this scenario (the simulator, with its MIG state kept in
    /// FILE.state between commands), as `demo` does.
    #[arg(long, env = "GPU_STEWARD_SCENARIO", value_name = "FILE", global = true)]
    pub scenario: Option<PathBuf>,
    /// Take the layouts from this mig-parted YAML file instead of the config.
    #[arg(
        long,
        env = "GPU_STEWARD_MIG_CONFIG",
        value_name = "FILE",
        global = true
    )]
    pub mig_config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum MigCommand {
    /// Per GPU: MIG mode (current, pending), GPU and compute instances, UUIDs, processes.
    Show {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the steps that would reach a layout; change nothing.
    Plan {
        /// The layout: a name under [mig.layouts] of the config, in its [mig] mig_config file,
        /// or in --mig-config FILE.
        #[arg(long, value_name = "NAME")]
        layout: String,
    },
    /// Reach a layout with the fewest changes; restore the found layout if a step fails.
    Apply {
        /// The layout: a name under [mig.layouts] of the config, in its [mig] mig_config file,
        /// or in --mig-config FILE.
        #[arg(long, value_name = "NAME")]
        layout: String,
        /// Print the plan; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Try even where processes run in instances the layout removes or on a GPU whose MIG
        /// mode changes. The driver still refuses to destroy an instance in use (the apply is
        /// then undone), and a mode change waits for the processes to end or a GPU reset.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The agent's HTTP address.
    #[arg(
        long,
        value_name = "URL",
        env = "GPU_STEWARD_URL",
        conflicts_with = "socket",
        default_value = "http://127.0.0.1:9400"
    )]
    pub url: Option<String>,
    /// Ask the agent on its API socket ([api] socket) instead.
    #[arg(long, value_name = "PATH", env = "GPU_STEWARD_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Refresh the screen until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// How often --watch refreshes.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = config::parse_interval)]
    pub interval: Duration,
    /// The configuration whose [audit] file gives the last changes.
    #[arg(long, value_name = "FILE", env = "GPU_STEWARD_CONFIG")]
    pub config: Option<PathBuf>,
    /// The longest one question to the agent may take (a screen asks a few).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// `demo` shares `run`'s flags but not its defaults: its help says what the demo uses.
#[derive(Debug, Args)]
#[command(
    mut_arg("listen", |a| a.help(
        "Address to serve HTTP on [default: [server] listen of --config FILE, else 127.0.0.1:9400]"
    )),
    mut_arg("nvml_lib", |a| a.help(
        "NVML library to load [default: the simulator, libnvml_sim.so beside the executable or in /usr/lib/gpu-steward/]"
    )),
)]
pub struct DemoArgs {
    /// Scenario file for the simulated NVML [default: the bundled 8×H100 NVLink node].
    #[arg(long, env = "GPU_STEWARD_SCENARIO", value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    #[command(flatten)]
    pub run: RunArgs,
}

impl RunArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen,
            nvml_lib: self.nvml_lib.clone(),
            interval: self.interval,
            log_level: self.log_level.clone(),
            log_format: self.log_format,
            web_config_file: self.web_config_file.clone(),
            default_listen: self.default_listen,
            nvidia_smi: self.nvidia_smi.clone(),
            default_audit_file: self.demo_state.as_deref().map(crate::demo::audit_file_in),
        }
    }

    /// The config path and whether it must exist (it must when given explicitly).
    pub fn config_path(&self) -> (PathBuf, bool) {
        match (&self.config, &self.demo_state) {
            (Some(p), _) => (p.clone(), true),
            // The demo reads no config it was not given: the installed agent's would point it
            // at the node's audit log, Slurm and hooks. A file that never exists there.
            (None, Some(state)) => (state.join("no-config.toml"), false),
            (None, None) => (PathBuf::from(config::DEFAULT_CONFIG), false),
        }
    }
}

/// The owner of changes of a CLI command, as in the daemon: its NVML session, the audit log and
/// the node lock, from the command's configuration.
fn owner_of(c: &crate::config::Config) -> std::sync::Arc<crate::changes::Owner> {
    crate::changes::Owner::with(crate::changes::Setup {
        nvml_lib: c.nvml_lib.clone(),
        audit_file: c.audit_file.clone(),
        mig: c.mig.clone(),
    })
}
