//! VM images through OCI registries.
//!
//! - [`manifest`] (pure, golden-tested): the artifact format, rendering from an image record
//!   and classifying what a registry returns.
//! - [`auth`]: `WWW-Authenticate` challenges and the `auths` credentials file format.
//! - [`client`]: a small distribution-spec client over the tree's HTTP stack.
//! - [`pull`] / [`push`]: between the store and a registry, every blob verified.
//!
//! Why not the oci-client crate: it brings tokio and reqwest, a second HTTP and TLS stack
//! (and with it a second crypto provider) next to ureq/rustls/ring, and minutes of build on two
//! cores; the part nubo needs (one manifest kind, blobs, three auth flows) is small.

pub mod auth;
pub mod client;
pub mod compress;
pub mod container;
pub mod error;
pub mod manifest;
pub mod pull;
pub mod push;
pub mod unpack;

pub use auth::{AuthFile, Challenge, CredentialSource, Credentials};
pub use client::{Client, ClientSettings};
pub use error::OciError;
pub use pull::{local_name, pull, stored, OciPullRequest};
pub use push::{push, PushRequest, Pushed};
