//! A libvirt URI in a manifest is code (libvirt runs programs for some transports and
//! parameters): the parser must never panic, every accepted URI must round-trip and stay inside
//! the allowlist, and every refusal must render without a control character.
#![no_main]

use std::path::Component;

use libfuzzer_sys::fuzz_target;
use nubo_spec::uri::{ConnectUri, Origin, Param, Transport};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    for origin in [Origin::Spec, Origin::Env, Origin::Record] {
        match ConnectUri::parse(s, origin) {
            Ok(u) => {
                assert_eq!(u.as_str(), s);
                assert_eq!(ConnectUri::parse(u.as_str(), origin).as_ref(), Ok(&u));
                assert!(!s.contains('%') && !s.contains('#'), "{s}");
                for p in u.params() {
                    match p {
                        Param::Socket(path) => {
                            assert!(u.is_local(), "{s}");
                            let clean = path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
                            assert!(path.is_absolute() && clean, "{s}");
                            if origin == Origin::Spec {
                                assert!(
                                    path.starts_with("/run/libvirt")
                                        || path.starts_with("/var/run/libvirt")
                                        || path.starts_with("/run/user"),
                                    "{s}"
                                );
                            }
                        }
                        Param::NoTty(_) => assert_eq!(u.transport(), Transport::Ssh, "{s}"),
                        Param::Mode(_) => assert_ne!(u.transport(), Transport::Tls, "{s}"),
                        Param::PkiPath(path) => {
                            assert_eq!(u.transport(), Transport::Tls, "{s}");
                            assert_ne!(origin, Origin::Spec, "{s}");
                            let clean = path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
                            assert!(path.is_absolute() && clean, "{s}");
                        }
                    }
                }
            }
            Err(e) => {
                let shown = e.to_string();
                assert!(!shown.chars().any(char::is_control), "{shown:?}");
            }
        }
    }
});
