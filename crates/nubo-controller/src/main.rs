//! `nubo-controller`: `run` reconciles nubo's resources; `crds` prints their definitions.
//! `nubo controller run|crds` executes this binary.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "nubo-controller", version, about = "nubo's Kubernetes controller")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Reconcile VirtualMachines onto the Providers' libvirt hosts (KUBECONFIG or in-cluster).
    Run {
        /// Where engine records, per-host state and TLS directories live (a volume of the Pod).
        #[arg(long, env = "NUBO_CONTROLLER_STATE", default_value = "/var/lib/nubo-controller")]
        state_dir: std::path::PathBuf,
        /// Address of /metrics, /healthz and /readyz.
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: std::net::SocketAddr,
        /// Namespace of the leader-election Lease.
        #[arg(long, env = "POD_NAMESPACE", default_value = "nubo-system")]
        lease_namespace: String,
        /// This replica's identity in the Lease.
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// Reconciles at once.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
        concurrency: u16,
        /// A namespace whose Secrets are watched, so a VirtualMachine follows a change of its
        /// user-data Secret at once (SeedCurrent) instead of at its next poll; repeat it, or
        /// give a comma-separated list. Only namespaces the controller may read Secrets in
        /// (deploy/rbac.yaml's Role), checked at start.
        #[arg(long = "watch-secrets-in", env = "NUBO_WATCH_SECRETS_IN", value_delimiter = ',')]
        watch_secrets_in: Vec<String>,
        /// A CA certificate (PEM) trusted, besides the system's (or `SSL_CERT_FILE`'s), for
        /// image downloads and registries: a private mirror's or registry's. Repeat it, or give
        /// a comma-separated list.
        #[arg(long = "ca-cert", env = "NUBO_CA_CERT", value_delimiter = ',')]
        ca_cert: Vec<std::path::PathBuf>,
        /// Seconds between reconciles of a settled VirtualMachine when nothing changed: how
        /// soon a Secret change outside --watch-secrets-in, or a domain changed on its host, is
        /// seen (±20 % jitter). A VM booting is looked at every 5 s regardless.
        #[arg(
            long = "resync-seconds",
            env = "NUBO_CONTROLLER_RESYNC",
            default_value_t = 30,
            value_parser = clap::value_parser!(u64).range(1..=86_400)
        )]
        resync_seconds: u64,
    },
    /// Print the CustomResourceDefinitions (YAML), as in deploy/crds.yaml.
    Crds,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Crds => {
            print!("{}", nubo_controller::crds::yaml());
            ExitCode::SUCCESS
        }
        Cmd::Run {
            state_dir,
            listen,
            lease_namespace,
            identity,
            concurrency,
            watch_secrets_in,
            ca_cert,
            resync_seconds,
        } => {
            let identity = identity.unwrap_or_else(|| format!("{}-{}", nix_hostname(), std::process::id()));
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let opts = nubo_controller::Options {
                state_dir,
                listen,
                lease_namespace,
                lease_name: "nubo-controller".into(),
                identity,
                concurrency,
                secret_namespaces: watch_secrets_in,
                tls: nubo_image::TlsSettings {
                    ca_bundle: std::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from),
                    extra_ca: ca_cert,
                },
                resync: std::time::Duration::from_secs(resync_seconds),
            };
            match rt.block_on(nubo_controller::run(opts)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn nix_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "nubo-controller".into())
}
