//! nubo on Kubernetes: VirtualMachine, VMClass, VMImage and Provider resources (group
//! `nubo.dev`) reconciled onto remote libvirt hosts through nubo's engine. The engine gets parsed
//! URIs and rendered bytes; this crate alone talks to the apiserver and reads Secrets.

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
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The server-side apply field manager.
    pub manager: String,
    pub backoff: Backoff,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Engine(String),
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
        hosts: hosts::Hosts::new(&opts.state_dir, cancel.clone()).map_err(anyhow::Error::msg)?,
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
    });
    let vms: Api<types::VirtualMachine> = Api::all(client.clone());
    let failures = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<String, u32>::new()));
    let f2 = failures.clone();
    let vm_ctl = Controller::new(vms, watcher::Config::default())
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
    ready.store(true, Ordering::SeqCst);
    tokio::select! {
        _ = futures::future::join(vm_ctl, image_ctl) => {}
        r = renew => {
            cancel.cancel();
            return Err(anyhow::anyhow!("lost the lease: {}", match r { Ok(Err(e)) => e.to_string(), _ => "renewal ended".into() }));
        }
    }
    cancel.cancel();
    Ok(())
}
