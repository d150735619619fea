//! `nubo registry ...`.

use std::path::PathBuf;

#[derive(Debug, clap::Subcommand)]
pub enum RegistryCmd {
    /// Check credentials against a registry and store them (0600) for push and pull
    Login(LoginArgs),
    /// Forget the credentials stored for a registry
    Logout(LogoutArgs),
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Credentials go to $NUBO_ROOT/auth.json when NUBO_ROOT is set, else $XDG_CONFIG_HOME/nubo/auth.json (~/.config/nubo/auth.json), mode 0600, in the `auths` format docker and podman use.\n\
Pulls and pushes also read $REGISTRY_AUTH_FILE and ~/.docker/config.json (never written).\n\
Example:\n  printf '%s' \"$TOKEN\" | nubo registry login registry.example:5000 -u ci --password-stdin"
)]
pub struct LoginArgs {
    /// `host[:port]`
    pub registry: String,
    #[arg(short = 'u', long = "username")]
    pub username: Option<String>,
    /// Read the password from stdin (otherwise it is asked for on the terminal, not echoed)
    #[arg(long)]
    pub password_stdin: bool,
    /// Also trust this PEM CA bundle (repeatable)
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_cert: Vec<PathBuf>,
    /// Talk plain http to this registry (and to no other host)
    #[arg(long)]
    pub insecure_registry: bool,
    #[command(flatten)]
    pub limits: crate::cli::net::NetLimitArgs,
}

#[derive(Debug, clap::Args)]
pub struct LogoutArgs {
    /// `host[:port]`
    pub registry: String,
}
