use proptest::prelude::*;

use super::*;

fn spec(s: &str) -> Result<ConnectUri, UriError> {
    ConnectUri::parse(s, Origin::Spec)
}

fn why(s: &str) -> String {
    spec(s).unwrap_err().why
}

#[test]
fn parse_local_system_is_accepted() {
    let u = spec("qemu:///system").unwrap();

    assert_eq!(
        (u.transport(), u.instance(), u.as_str()),
        (Transport::Local, Instance::System, "qemu:///system")
    );
}

#[test]
fn parse_local_session_is_accepted() {
    assert_eq!(spec("qemu:///session").unwrap(), ConnectUri::session());
}

#[test]
fn parse_unix_with_socket_under_run_libvirt_is_accepted() {
    let u = spec("qemu+unix:///system?socket=/run/libvirt/libvirt-sock&mode=direct").unwrap();

    assert_eq!(u.socket(1000), Some(PathBuf::from("/run/libvirt/libvirt-sock")));
}

#[test]
fn parse_session_socket_under_run_user_is_accepted() {
    let u = spec("qemu:///session?socket=/run/user/1000/libvirt/virtqemud-sock").unwrap();

    assert_eq!(
        u.socket(0),
        Some(PathBuf::from("/run/user/1000/libvirt/virtqemud-sock"))
    );
}

#[test]
fn parse_tls_host_port_is_accepted() {
    let u = spec("qemu+tls://hv-1.example.org:16514/system").unwrap();

    assert_eq!(
        (u.host(), u.port(), u.socket(0)),
        (Some(&Host::Name("hv-1.example.org".into())), Some(16514), None)
    );
}

#[test]
fn parse_ssh_user_ipv6_is_accepted() {
    let u = spec("qemu+ssh://root@[::1]:2222/system?no_tty=1&mode=legacy").unwrap();

    assert_eq!(
        (u.user(), u.host().map(ToString::to_string)),
        (Some("root"), Some("[::1]".into()))
    );
}

#[test]
fn parse_ext_command_is_refused_naming_program() {
    let e = spec("qemu+ext:///system?command=/abs/pwn.sh").unwrap_err();

    assert!(e.why.contains("`ext`"), "{e}");
    assert!(e.to_string().contains("qemu+tls://HOST[:PORT]/system"), "{e}");
}

#[test]
fn parse_ssh_command_param_is_refused() {
    assert!(why("qemu+ssh://h/system?command=/bin/sh").contains("run a program"));
}

#[test]
fn parse_ssh_keyfile_param_is_refused() {
    assert!(why("qemu+ssh://h/system?keyfile=/etc/shadow").contains("read a file"));
}

#[test]
fn parse_tls_no_verify_is_refused() {
    assert!(why("qemu+tls://h/system?no_verify=1").contains("certificate"));
}

#[test]
fn parse_tls_pkipath_is_refused() {
    assert!(why("qemu+tls://h/system?pkipath=/tmp/x").contains("`pkipath`"));
}

#[test]
fn parse_local_socket_outside_run_dirs_from_spec_is_refused() {
    assert!(why("qemu:///system?socket=/tmp/evil-sock").contains("outside"));
}

#[test]
fn parse_local_socket_outside_run_dirs_from_env_is_accepted() {
    let u = ConnectUri::parse("qemu:///system?socket=/tmp/t/libvirt-sock", Origin::Env).unwrap();

    assert_eq!(u.socket(0), Some(PathBuf::from("/tmp/t/libvirt-sock")));
}

#[test]
fn parse_socket_dotdot_is_refused_from_any_origin() {
    let e = ConnectUri::parse("qemu:///system?socket=/run/libvirt/../../etc/x", Origin::Record).unwrap_err();

    assert!(e.why.contains("`..`"), "{e}");
}

#[test]
fn parse_socket_run_user_non_numeric_is_refused() {
    assert!(why("qemu:///session?socket=/run/user/x/libvirt/s").contains("outside"));
}

#[test]
fn parse_percent_escape_is_refused() {
    assert!(why("qemu+ssh://h/system?mode=auto%26command=x").contains("percent"));
}

#[test]
fn parse_user_with_password_is_refused() {
    assert!(why("qemu+ssh://root:secret@h/system").contains("password"));
}

#[test]
fn parse_user_option_shaped_is_refused() {
    assert!(why("qemu+ssh://-oProxyCommand=x@h/system").contains("user"));
}

#[test]
fn parse_host_leading_dash_is_refused() {
    assert!(why("qemu+ssh://-oProxyCommand/system").contains("`-`"));
}

#[test]
fn parse_host_label_64_is_refused() {
    assert!(why(&format!("qemu+tls://{}.org/system", "a".repeat(64))).contains("63"));
}

#[test]
fn parse_host_bad_ipv4_is_refused() {
    assert!(why("qemu+tls://1.2.3/system").contains("IPv4"));
}

#[test]
fn parse_fragment_is_refused() {
    assert!(why("qemu:///system#x").contains("fragment"));
}

#[test]
fn parse_control_char_is_refused_and_escaped() {
    let e = spec("qemu:///system\u{1b}[31m").unwrap_err();

    assert!(!e.to_string().contains('\u{1b}'), "{e}");
    assert!(e.uri.contains("\\u{1b}"), "{e}");
}

#[test]
fn parse_remote_session_is_refused() {
    assert!(why("qemu+ssh://h/session").contains("/system"));
}

#[test]
fn parse_local_with_host_is_refused() {
    assert!(why("qemu://h/system").contains("local transport"));
}

#[test]
fn parse_empty_path_is_refused() {
    assert!(why("qemu+tls://h").contains("no path"));
}

#[test]
fn parse_odd_path_is_refused() {
    assert!(why("qemu:///system/../session").contains("path"));
}

#[test]
fn parse_other_driver_is_refused() {
    assert!(why("xen:///system").contains("`xen`"));
}

#[test]
fn parse_repeated_param_is_refused() {
    assert!(why("qemu:///system?mode=auto&mode=direct").contains("twice"));
}

#[test]
fn parse_tls_user_is_refused() {
    assert!(why("qemu+tls://u@h/system").contains("certificate"));
}

#[test]
fn parse_port_zero_is_refused() {
    assert!(why("qemu+tls://h:0/system").contains("port"));
}

#[test]
fn record_deserialize_refuses_ext() {
    let r: Result<ConnectUri, _> = serde_json::from_str("\"qemu+ext:///system?command=/x\"");

    assert!(r.is_err());
}

#[test]
fn record_serialize_round_trips() {
    let u = spec("qemu+ssh://u@h:22/system?no_tty=1").unwrap();

    let back: ConnectUri = serde_json::from_str(&serde_json::to_string(&u).unwrap()).unwrap();

    assert_eq!(back, u);
}

const SCHEMES: &[&str] = &["qemu", "qemu+unix", "qemu+tls", "qemu+ssh"];

fn key() -> impl Strategy<Value = String> {
    "[a-z_]{1,12}"
}

fn hostname() -> impl Strategy<Value = String> {
    proptest::collection::vec("[a-z]([a-z0-9-]{0,10}[a-z0-9])?", 1..4).prop_map(|l| l.join("."))
}

/// Accepted URIs, built from the allowlisted grammar.
fn accepted() -> impl Strategy<Value = String> {
    let local = (
        prop_oneof![Just("qemu"), Just("qemu+unix")],
        prop_oneof![Just("system"), Just("session")],
        proptest::option::of("[a-z0-9-]{1,20}"),
        proptest::option::of(prop_oneof![Just("auto"), Just("legacy"), Just("direct")]),
    )
        .prop_map(|(s, p, sock, mode)| {
            let mut q = Vec::new();
            if let Some(sock) = sock {
                q.push(format!("socket=/run/libvirt/{sock}"));
            }
            if let Some(m) = mode {
                q.push(format!("mode={m}"));
            }
            let q = if q.is_empty() {
                String::new()
            } else {
                format!("?{}", q.join("&"))
            };
            format!("{s}:///{p}{q}")
        });
    let tls = (hostname(), proptest::option::of(1u16..)).prop_map(|(h, p)| match p {
        Some(p) => format!("qemu+tls://{h}:{p}/system"),
        None => format!("qemu+tls://{h}/system"),
    });
    let ssh = (
        proptest::option::of("[a-z_][a-z0-9_.-]{0,8}"),
        hostname(),
        any::<bool>(),
    )
        .prop_map(|(u, h, t)| {
            let u = u.map(|u| format!("{u}@")).unwrap_or_default();
            let q = if t { "?no_tty=1" } else { "" };
            format!("qemu+ssh://{u}{h}/system{q}")
        });
    prop_oneof![local, tls, ssh]
}

proptest! {
    #[test]
    fn parse_accepted_round_trips(s in accepted()) {
        let u = spec(&s).unwrap();
        prop_assert_eq!(u.to_string(), s.clone());
        prop_assert_eq!(spec(u.as_str()).unwrap(), u);
    }

    #[test]
    fn parse_query_key_outside_allowlist_is_refused(
        scheme in proptest::sample::select(SCHEMES),
        k in key(),
        v in "[a-z0-9/._-]{0,16}",
    ) {
        let allowed: &[&str] = match scheme {
            "qemu" | "qemu+unix" => &["socket", "mode"],
            "qemu+ssh" => &["mode", "no_tty"],
            _ => &[],
        };
        prop_assume!(!allowed.contains(&k.as_str()));
        let host = if scheme.contains("tls") || scheme.contains("ssh") { "h" } else { "" };
        let s = format!("{scheme}://{host}/system?{k}={v}");
        for origin in [Origin::Spec, Origin::Env, Origin::Record] {
            prop_assert!(ConnectUri::parse(&s, origin).is_err(), "{} accepted", s);
        }
    }

    #[test]
    fn parse_scheme_outside_allowlist_is_refused(scheme in "[a-z0-9+.-]{1,16}", rest in "[a-z/:@?=&.]{0,24}") {
        prop_assume!(!SCHEMES.contains(&scheme.as_str()));
        let s = format!("{scheme}://{rest}");
        prop_assert!(ConnectUri::parse(&s, Origin::Env).is_err(), "{} accepted", s);
    }

    #[test]
    fn parse_arbitrary_text_never_panics_and_escapes(s in "\\PC{0,64}|[\\x00-\\x7f]{0,64}") {
        if let Err(e) = ConnectUri::parse(&s, Origin::Spec) {
            let shown = e.to_string();
            prop_assert!(!shown.chars().any(|c| c.is_control()), "{:?}", shown);
        }
    }
}

#[test]
fn with_pkipath_tls_uri_round_trips_through_a_record() {
    let u = spec("qemu+tls://h.example/system").unwrap();

    let p = u.with_pkipath(Path::new("/home/u/tls")).unwrap();
    let back = ConnectUri::parse(p.as_str(), Origin::Record).unwrap();

    assert_eq!(p.as_str(), "qemu+tls://h.example/system?pkipath=/home/u/tls");
    assert_eq!(back.pkipath(), Some(Path::new("/home/u/tls")));
}

#[test]
fn with_pkipath_ssh_uri_is_refused() {
    let u = spec("qemu+ssh://h/system").unwrap();

    let e = u.with_pkipath(Path::new("/tls")).unwrap_err();

    assert!(e.why.contains("not a qemu+tls URI"), "{e}");
}

#[test]
fn with_pkipath_dotdot_or_query_text_is_refused() {
    let u = spec("qemu+tls://h/system").unwrap();

    assert!(u.with_pkipath(Path::new("/a/../b")).is_err());
    assert!(u.with_pkipath(Path::new("/a&no_verify=1")).is_err());
    assert!(u.with_pkipath(Path::new("tls")).is_err());
}

#[test]
fn parse_tls_pkipath_from_record_is_accepted_from_spec_refused() {
    let s = "qemu+tls://h/system?pkipath=/etc/nubo/tls";

    assert!(ConnectUri::parse(s, Origin::Record).is_ok());
    assert!(ConnectUri::parse(s, Origin::Spec).is_err());
}
