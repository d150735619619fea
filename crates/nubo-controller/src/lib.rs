//! nubo on Kubernetes: VirtualMachine, VMClass, VMImage and Provider resources (group
//! `nubo.dev`) reconciled onto remote libvirt hosts through nubo's engine. The engine gets parsed
//! URIs and rendered bytes; this crate alone talks to the apiserver and reads Secrets.

pub mod consoles;
pub mod crds;
pub mod hosts;
pub mod http;
pub mod image;
pub mod leader;
pub mod metrics;
pub mod provider;
pub mod render;
pub mod trace;
pub mod types;
pub mod vm;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client};

pub use metrics::Metrics;

/// What a reconcile needs.
pub struct Ctx {
    pub client: Client,
    pub hosts: hosts::Hosts,
    /// The console recorders of the running VMs (CloudInitDone reads what they record).
    pub consoles: Arc<consoles::Consoles>,
    /// When each Provider (namespace/name) was last probed, at which generation.
    pub probed: std::sync::Mutex<std::collections::HashMap<String, (Option<i64>, std::time::Instant)>>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The server-side apply field manager.
    pub manager: String,
    pub backoff: Backoff,
    /// How often a settled VirtualMachine is looked at again (`--resync-seconds`).
    pub resync: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The apiserver's error in the message, not chained as a source: statuses and logs print
    /// it with `{}`, and `{:#}` would print it twice.
    #[error("kubernetes API: {0}")]
    Kube(kube::Error),
    #[error("{0}")]
    Engine(String),
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Error {
        Error::Kube(e)
    }
}

/// Requeue delays with ±20 % jitter, so many VMs refused together do not retry together; an
/// API error's retry doubles per consecutive failure up to 5 min.
#[derive(Default)]
pub struct Backoff {
    seed: AtomicU64,
}

impl Backoff {
    pub fn jittered(&self, d: Duration) -> Duration {
        // xorshift over a counter seeded by the clock: jitter needs no cryptographic randomness.
        let mut x = self.seed.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let f = 0.8 + (x % 4001) as f64 / 10_000.0;
        d.mul_f64(f)
    }

    /// The delay after `failures` consecutive failures: 1 s doubling, at most 300 s, jittered.
    pub fn after_failures(&self, failures: u32) -> Duration {
        let secs = 1u64 << failures.min(9);
        self.jittered(Duration::from_secs(secs.min(300)))
    }
}

/// Now, RFC 3339 to the second.
pub fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// How the controller runs.
pub struct Options {
    pub state_dir: std::path::PathBuf,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub listen: std::net::SocketAddr,
    pub lease_namespace: String,
    pub lease_name: String,
    pub identity: String,
    /// Reconciles at once, per kind.
    pub concurrency: u16,
    /// Namespaces whose Secrets are watched (a change reconciles the VMs naming the Secret).
    pub secret_namespaces: Vec<String>,
    /// Whom image downloads and registries are trusted by (`SSL_CERT_FILE`, `--ca-cert`).
    pub tls: nubo_image::TlsSettings,
    /// How often a settled VirtualMachine is reconciled again without an event: what brings
    /// Secret changes outside the watched namespaces, and a domain changed behind its back.
    pub resync: Duration,
}

/// Runs the controller until a signal: waits to lead, then reconciles.
pub async fn run(opts: Options) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(opts.listen).await?;
    eprintln!(
        "nubo-controller {}: serving /metrics /healthz /readyz on {}",
        opts.identity,
        listener.local_addr()?
    );
    tokio::spawn(http::serve(listener, metrics.clone(), ready.clone()));

    let cancel = nubo_core::Cancel::new();
    let lease = leader::Lease {
        api: Api::namespaced(client.clone(), &opts.lease_namespace),
        name: opts.lease_name.clone(),
        identity: opts.identity.clone(),
        duration: Duration::from_secs(15),
    };
    lease.acquire().await?;
    eprintln!(
        "nubo-controller {}: leading (lease {}/{})",
        opts.identity, opts.lease_namespace, opts.lease_name
    );
    // Losing the lease ends the process: a replica that is not sure it leads must not act.
    let renew = tokio::spawn(async move { lease.keep().await });

    let ctx = Arc::new(Ctx {
        client: client.clone(),
        hosts: hosts::Hosts::new(&opts.state_dir, cancel.clone())
            .map_err(anyhow::Error::msg)?
            .with_tls(opts.tls.clone()),
        consoles: Arc::default(),
        probed: Default::default(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "nubo-controller".into(),
                instance: Some(opts.identity.clone()),
            },
        ),
        metrics,
        manager: "nubo-controller".into(),
        backoff: Backoff::default(),
        resync: opts.resync,
    });
    let vms: Api<types::VirtualMachine> = Api::all(client.clone());
    let failures = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<String, u32>::new()));
    let f2 = failures.clone();
    let mut vm_ctl = Controller::new(vms, watcher::Config::default());
    let store = vm_ctl.store();
    for ns in &opts.secret_namespaces {
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
        // A namespace whose Secrets this controller may not read would make its watch fail
        // over and over: it is left to the VMs' polls, and said so.
        if let Err(e) = secrets.list_metadata(&kube::api::ListParams::default().limit(1)).await {
            eprintln!("nubo-controller: not watching Secrets in namespace `{ns}` ({e}): grant the Role of deploy/rbac.yaml there; its VMs see Secret changes at their next poll");
            continue;
        }
        let store = store.clone();
        vm_ctl = vm_ctl.watches(secrets, watcher::Config::default(), move |s| {
            use kube::ResourceExt;
            vm::referrers(&store.state(), &s.namespace().unwrap_or_default(), &s.name_any())
        });
    }
    let vm_ctl = vm_ctl
        .with_config(controller::Config::default().concurrency(opts.concurrency))
        .shutdown_on_signal()
        .run(
            vm::reconcile,
            move |vm, err, ctx: Arc<Ctx>| {
                use kube::ResourceExt;
                let key = format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any());
                let mut f = f2.lock().unwrap_or_else(|p| p.into_inner());
                let n = f.entry(key.clone()).or_default();
                *n += 1;
                eprintln!("nubo-controller: virtualmachine {key}: {err} (retry {})", n);
                Action::requeue(ctx.backoff.after_failures(*n))
            },
            ctx.clone(),
        )
        .for_each(move |r| {
            if let Ok((obj, _)) = &r {
                let key = format!("{}/{}", obj.namespace.clone().unwrap_or_default(), obj.name);
                failures.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
            }
            async {}
        });
    let images: Api<types::VMImage> = Api::all(client.clone());
    let image_ctl = Controller::new(images, watcher::Config::default())
        .with_config(controller::Config::default().concurrency(opts.concurrency.min(4)))
        .shutdown_on_signal()
        .run(
            image::reconcile,
            |img, err, ctx: Arc<Ctx>| {
                use kube::ResourceExt;
                eprintln!("nubo-controller: vmimage {}: {err}", img.name_any());
                Action::requeue(ctx.backoff.after_failures(3))
            },
            ctx.clone(),
        )
        .for_each(|_| async {});
    let providers: Api<types::Provider> = Api::all(client.clone());
    let provider_ctl = Controller::new(providers, watcher::Config::default())
        .with_config(controller::Config::default().concurrency(opts.concurrency.min(4)))
        .shutdown_on_signal()
        .run(
            provider::reconcile,
            |p, err, ctx: Arc<Ctx>| {
                use kube::ResourceExt;
                eprintln!("nubo-controller: provider {}: {err}", p.name_any());
                Action::requeue(ctx.backoff.after_failures(3))
            },
            ctx.clone(),
        )
        .for_each(|_| async {});
    ready.store(true, Ordering::SeqCst);
    tokio::select! {
        _ = futures::future::join3(vm_ctl, image_ctl, provider_ctl) => {}
        r = renew => {
            cancel.cancel();
            return Err(anyhow::anyhow!("lost the lease: {}", match r { Ok(Err(e)) => e.to_string(), _ => "renewal ended".into() }));
        }
    }
    cancel.cancel();
    Ok(())
}
