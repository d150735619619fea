//! Leader election over a `coordination.k8s.io` Lease: the holder renews it every third of its
//! duration; another replica takes it only once it has expired. Updates carry the
//! resourceVersion read, so two replicas racing for it cannot both win (409 for the loser).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease as KLease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

pub struct Lease {
    pub api: Api<KLease>,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
}

impl Lease {
    /// Waits until this replica holds the lease.
    pub async fn acquire(&self) -> Result<(), kube::Error> {
        loop {
            if self.try_take().await? {
                return Ok(());
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews until it fails: returns the error when the lease is lost or cannot be renewed in time.
    pub async fn keep(&self) -> Result<(), kube::Error> {
        let mut last_ok = std::time::Instant::now();
        loop {
            tokio::time::sleep(self.duration / 3).await;
            match self.try_take().await {
                Ok(true) => last_ok = std::time::Instant::now(),
                Ok(false) => return Err(kube::Error::Service("another replica holds the lease".into())),
                Err(e) if last_ok.elapsed() >= self.duration => return Err(e),
                Err(_) => {}
            }
        }
    }

    /// Takes or renews the lease if it is ours or expired; `false` when another holds it.
    async fn try_take(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let secs = i32::try_from(self.duration.as_secs()).unwrap_or(15);
        match self.api.get_opt(&self.name).await? {
            None => {
                let l = KLease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(secs),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                match self.api.create(&PostParams::default(), &l).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Some(mut l) => {
                let spec = l.spec.get_or_insert_with(LeaseSpec::default);
                let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
                let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
                    (Some(MicroTime(t)), Some(d)) => now.as_second() >= t.as_second() + i64::from(d),
                    _ => true,
                };
                if !mine && !expired {
                    return Ok(false);
                }
                if !mine {
                    spec.holder_identity = Some(self.identity.clone());
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.renew_time = Some(MicroTime(now));
                spec.lease_duration_seconds = Some(secs);
                match self.api.replace(&self.name, &PostParams::default(), &l).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }
}
