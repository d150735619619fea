//! The `nubo-controller` binary itself: what `nubo controller crds` prints is deploy/crds.yaml,
//! and a wrong command is a usage error. (It also makes `cargo test --workspace` build the
//! binary, which the live test `controller` runs from target/<profile>/.)

use std::process::Command;

fn controller(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nubo-controller"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("running nubo-controller")
}

#[test]
fn crds_prints_what_deploy_ships() {
    let out = controller(&["crds"]);

    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shipped = include_str!("../../../deploy/crds.yaml");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        shipped,
        "deploy/crds.yaml is stale: run `cargo run -p nubo-controller -- crds > deploy/crds.yaml`"
    );
}

#[test]
fn an_unknown_command_is_a_usage_error() {
    let out = controller(&["frobnicate"]);

    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty());
}
