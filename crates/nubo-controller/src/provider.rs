//! Which Provider a VirtualMachine uses.

use kube::api::{Api, ListParams};
use kube::ResourceExt;

use crate::types::{Provider, ProviderRef};
use crate::vm::Refusal;
use crate::{Ctx, Error};

/// `r`, or the namespace's only Provider when the VM names none.
pub async fn resolve(ctx: &Ctx, ns: &str, r: Option<&ProviderRef>) -> Result<Result<Provider, Refusal>, Error> {
    let refuse = |reason: &'static str, message: String| Refusal {
        reason,
        message,
        phase: "Pending",
    };
    match r {
        Some(r) => {
            let pns = r.namespace.clone().unwrap_or_else(|| ns.to_owned());
            let api: Api<Provider> = Api::namespaced(ctx.client.clone(), &pns);
            Ok(api.get_opt(&r.name).await?.ok_or_else(|| {
                refuse(
                    "ProviderNotFound",
                    format!(
                        "provider `{pns}/{}` does not exist: create it or fix spec.providerRef",
                        r.name
                    ),
                )
            }))
        }
        None => {
            let api: Api<Provider> = Api::namespaced(ctx.client.clone(), ns);
            let mut all = api.list(&ListParams::default()).await?.items;
            match all.len() {
                1 => Ok(Ok(all.remove(0))),
                0 => Ok(Err(refuse(
                    "ProviderNotFound",
                    format!("namespace `{ns}` has no Provider: create one or set spec.providerRef"),
                ))),
                n => Ok(Err(refuse(
                    "ProviderAmbiguous",
                    format!(
                        "namespace `{ns}` has {n} Providers ({}): name one in spec.providerRef",
                        all.iter().map(|p| p.name_any()).collect::<Vec<_>>().join(", ")
                    ),
                ))),
            }
        }
    }
}
