use std::collections::BTreeMap;

use nubo_core::ByteSize;

use crate::*;

fn line_err(text: &str) -> ParseError {
    parse(text).expect_err("the VMfile must be refused")
}

const FULL: &str = r#"# a comment
FROM debian:12
SIZE 3G
ARG GREETING=hello
ENV A=1 B="two words"
ENV LEGACY value
LABEL org.example.team=infra version=1
HYPERVISOR qemu
DEFAULTS vcpus=2 memory=2G
COPY motd files/ /etc/
CLOUDINIT cloud.cfg
RUN echo "$GREETING" \
    > /marker
RUN ["touch", "/exec-form"]
"#;

#[test]
fn parse_every_instruction_ok() {
    let f = parse(FULL).unwrap();

    let ops: Vec<&Op> = f.instructions.iter().map(|i| &i.op).collect();
    assert_eq!(
        f.from,
        FromSource::Image {
            reference: "debian:12".into()
        }
    );
    assert_eq!(ops[1], &Op::Size(ByteSize(3 << 30)));
    assert_eq!(
        ops[2],
        &Op::Arg {
            name: "GREETING".into(),
            default: Some("hello".into())
        }
    );
    assert_eq!(
        ops[3],
        &Op::Env(vec![("A".into(), "1".into()), ("B".into(), "two words".into())])
    );
    assert_eq!(ops[4], &Op::Env(vec![("LEGACY".into(), "value".into())]));
    assert_eq!(
        ops[5],
        &Op::Label(vec![
            ("org.example.team".into(), "infra".into()),
            ("version".into(), "1".into())
        ])
    );
    assert_eq!(ops[6], &Op::Hypervisor("qemu".into()));
    assert_eq!(
        ops[7],
        &Op::Defaults {
            vcpus: Some(2),
            memory: Some(ByteSize(2 << 30))
        }
    );
    assert_eq!(
        ops[8],
        &Op::Copy {
            sources: vec!["motd".into(), "files/".into()],
            dest: "/etc/".into()
        }
    );
    assert_eq!(ops[9], &Op::CloudInit("cloud.cfg".into()));
    assert_eq!(ops[10], &Op::Run(Command::Shell("echo \"$GREETING\" > /marker".into())));
    assert_eq!(
        ops[11],
        &Op::Run(Command::Exec(vec!["touch".into(), "/exec-form".into()]))
    );
}

#[test]
fn parse_lines_are_where_instructions_start() {
    let f = parse(FULL).unwrap();

    let lines: Vec<usize> = f.instructions.iter().map(|i| i.line).collect();
    assert_eq!(lines, vec![2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14]);
}

#[test]
fn parse_appliance_and_keywords_any_case_ok() {
    let f = parse("from debian:12\nappliance\n").unwrap();

    assert_eq!(f.instructions[1].op, Op::Appliance);
}

#[test]
fn parse_from_url_with_checksum_ok() {
    let sum = format!("sha256:{}", "ab".repeat(32));
    let f = parse(&format!("FROM https://example.org/d.qcow2 CHECKSUM {sum}\n")).unwrap();

    assert_eq!(
        f.from,
        FromSource::Url {
            url: "https://example.org/d.qcow2".into(),
            checksum: sum
        }
    );
}

#[test]
fn parse_from_url_without_checksum_is_refused() {
    let e = line_err("FROM https://example.org/d.qcow2\n");

    assert_eq!(e.line, 1);
    assert!(e.message.contains("CHECKSUM"), "{e}");
}

#[test]
fn parse_from_bad_checksum_is_refused() {
    let e = line_err("FROM https://example.org/d.qcow2 CHECKSUM md5:abc\n");

    assert!(e.message.contains("sha256"), "{e}");
}

#[test]
fn parse_size_after_run_is_refused_with_both_lines() {
    let e = line_err("FROM debian:12\nRUN true\n\nSIZE 20G\n");

    assert_eq!(e.line, 4);
    assert!(e.message.contains("SIZE after RUN (line 2)"), "{e}");
}

#[test]
fn parse_size_after_copy_is_refused() {
    let e = line_err("FROM debian:12\nCOPY a /a\nSIZE 20G\n");

    assert_eq!(e.line, 3);
}

#[test]
fn parse_missing_from_is_refused() {
    let e = line_err("# nothing\nRUN true\n");

    assert_eq!(e.line, 2);
    assert!(e.message.contains("before FROM"), "{e}");
}

#[test]
fn parse_second_from_is_refused() {
    let e = line_err("FROM debian:12\nFROM ubuntu:24.04\n");

    assert_eq!(e.line, 2);
    assert!(e.message.contains("second FROM"), "{e}");
}

#[test]
fn parse_empty_file_is_refused() {
    assert!(line_err("\n# only comments\n").message.contains("no instructions"));
}

#[test]
fn parse_unknown_instruction_names_line_and_keyword() {
    let e = line_err("FROM debian:12\n\nFROB x\n");

    assert_eq!(e.line, 3);
    assert_eq!(e.to_string(), "line 3: unknown instruction `FROB`: a VMfile has FROM, SIZE, CLOUDINIT, RUN, COPY, ENV, ARG, LABEL, HYPERVISOR, DEFAULTS and APPLIANCE");
}

#[test]
fn parse_dockerfile_instruction_says_what_to_use() {
    assert!(line_err("FROM debian:12\nWORKDIR /x\n").message.contains("Dockerfile"));
}

#[test]
fn parse_copy_parent_dir_is_refused() {
    let e = line_err("FROM debian:12\nCOPY ../secret /etc/\n");

    assert_eq!(e.line, 2);
    assert!(e.message.contains("leaves the build context"), "{e}");
}

#[test]
fn parse_copy_nested_parent_dir_is_refused() {
    assert!(line_err("FROM debian:12\nCOPY a/../../b /etc/\n")
        .message
        .contains("`..`"));
}

#[test]
fn parse_copy_absolute_source_is_refused() {
    assert!(line_err("FROM debian:12\nCOPY /etc/shadow /x\n")
        .message
        .contains("absolute"));
}

#[test]
fn parse_copy_relative_destination_is_refused() {
    assert!(line_err("FROM debian:12\nCOPY a etc/\n").message.contains("relative"));
}

#[test]
fn parse_copy_exec_form_ok() {
    let f = parse("FROM debian:12\nCOPY [\"a b\", \"/x\"]\n").unwrap();

    assert_eq!(
        f.instructions[1].op,
        Op::Copy {
            sources: vec!["a b".into()],
            dest: "/x".into()
        }
    );
}

#[test]
fn parse_copy_one_word_is_refused() {
    assert!(line_err("FROM debian:12\nCOPY a\n").message.contains("destination"));
}

#[test]
fn parse_cloudinit_escaping_context_is_refused() {
    assert!(line_err("FROM debian:12\nCLOUDINIT ../x.cfg\n")
        .message
        .contains("context"));
}

#[test]
fn parse_cloudinit_with_appliance_is_refused() {
    let e = line_err("FROM debian:12\nAPPLIANCE\nCLOUDINIT c.cfg\n");

    assert_eq!(e.line, 3);
}

#[test]
fn parse_twice_given_setting_is_refused() {
    let e = line_err("FROM debian:12\nHYPERVISOR qemu\nHYPERVISOR libvirt\n");

    assert!(e.message.contains("first is on line 2"), "{e}");
}

#[test]
fn parse_defaults_unknown_key_is_refused() {
    assert!(line_err("FROM debian:12\nDEFAULTS cpus=2\n").message.contains("`cpus`"));
}

#[test]
fn parse_defaults_zero_vcpus_is_refused() {
    assert!(line_err("FROM debian:12\nDEFAULTS vcpus=0\n").message.contains("vcpus"));
}

#[test]
fn parse_bad_size_is_refused() {
    assert_eq!(line_err("FROM debian:12\nSIZE lots\n").line, 2);
}

#[test]
fn parse_hypervisor_bad_name_is_refused() {
    assert!(line_err("FROM debian:12\nHYPERVISOR Q;EMU\n")
        .message
        .contains("backend name"));
}

#[test]
fn parse_unclosed_quote_is_refused() {
    let e = line_err("FROM debian:12\nENV A=\"x\n");

    assert_eq!(e.line, 2);
}

#[test]
fn parse_trailing_backslash_is_refused() {
    assert!(line_err("FROM debian:12\nRUN a \\\n").message.contains("backslash"));
}

#[test]
fn parse_comment_inside_continuation_is_skipped() {
    let f = parse("FROM debian:12\nRUN a \\\n# note\n  b\n").unwrap();

    assert_eq!(f.instructions[1].op, Op::Run(Command::Shell("a b".into())));
}

#[test]
fn parse_bad_env_name_is_refused() {
    assert!(line_err("FROM debian:12\nENV 1A=x\n").message.contains("variable name"));
}

#[test]
fn parse_empty_exec_form_is_refused() {
    assert!(line_err("FROM debian:12\nRUN []\n").message.contains("empty"));
}

#[test]
fn parse_bytes_not_utf8_names_line() {
    let e = parse_bytes(b"FROM debian:12\nRUN \xff\n").unwrap_err();

    assert_eq!(e.line, 2);
}

#[test]
fn parse_bytes_too_large_is_refused() {
    let big = vec![b'#'; parse::MAX_VMFILE + 1];

    assert!(parse_bytes(&big).unwrap_err().message.contains("more than"));
}

#[test]
fn parse_nul_is_refused() {
    assert_eq!(line_err("FROM debian:12\nRUN a\0b\n").line, 2);
}

#[test]
fn resolve_build_arg_overrides_default_and_reaches_env() {
    let f = parse(FULL).unwrap();

    let r = resolve(&f, &[("GREETING".into(), "hi".into())]).unwrap();

    assert_eq!(r.args, BTreeMap::from([("GREETING".into(), "hi".into())]));
    assert_eq!(r.steps[2].env.get("GREETING").map(String::as_str), Some("hi"));
    assert_eq!(r.steps[2].env.get("B").map(String::as_str), Some("two words"));
}

#[test]
fn resolve_collects_settings_and_steps() {
    let r = resolve(&parse(FULL).unwrap(), &[]).unwrap();

    assert_eq!(r.size, Some(ByteSize(3 << 30)));
    assert_eq!(r.hypervisor.as_deref(), Some("qemu"));
    assert_eq!((r.vcpus, r.memory), (Some(2), Some(ByteSize(2 << 30))));
    assert_eq!(r.labels.get("version").map(String::as_str), Some("1"));
    let lines: Vec<usize> = r.steps.iter().map(|s| s.line).collect();
    assert_eq!(lines, vec![10, 11, 12, 14]);
}

#[test]
fn resolve_undeclared_build_arg_is_refused() {
    let e = resolve(&parse("FROM debian:12\n").unwrap(), &[("X".into(), "1".into())]).unwrap_err();

    assert!(e.message.contains("declares no `ARG X`"), "{e}");
}

#[test]
fn resolve_arg_without_value_is_refused() {
    let e = resolve(&parse("FROM debian:12\nARG X\n").unwrap(), &[]).unwrap_err();

    assert_eq!(e.line, 2);
}

#[test]
fn resolve_substitutes_in_copy_and_label() {
    let f = parse("FROM debian:12\nARG DIR=files\nLABEL v=${DIR}-1\nCOPY $DIR/a /opt/${DIR}\n").unwrap();

    let r = resolve(&f, &[]).unwrap();

    assert_eq!(r.labels.get("v").map(String::as_str), Some("files-1"));
    assert_eq!(
        r.steps[0].action,
        Action::Copy {
            sources: vec!["files/a".into()],
            dest: "/opt/files".into()
        }
    );
}

#[test]
fn resolve_copy_escaping_through_a_variable_is_refused() {
    let f = parse("FROM debian:12\nARG DIR\nCOPY $DIR/x /x\n").unwrap();

    let e = resolve(&f, &[("DIR".into(), "..".into())]).unwrap_err();

    assert_eq!(e.line, 3);
    assert!(e.message.contains("leaves the build context"), "{e}");
}

#[test]
fn resolve_undefined_variable_is_refused() {
    let e = resolve(&parse("FROM debian:12\nLABEL a=$NOPE\n").unwrap(), &[]).unwrap_err();

    assert!(e.message.contains("`$NOPE` is not defined"), "{e}");
}

#[test]
fn starter_parses() {
    let r = resolve(&parse(&starter("debian:12")).unwrap(), &[]).unwrap();

    assert_eq!(r.steps.len(), 1);
}

#[test]
fn example_vmfile_parses_and_resolves() {
    let f = parse(include_str!("../../../examples/VMfile")).unwrap();

    let r = resolve(&f, &[]).unwrap();

    assert_eq!(r.steps.len(), 4);
    assert_eq!(
        r.labels.get("org.opencontainers.image.title").map(String::as_str),
        Some("web")
    );
}

/// Issue 21: `ENV Xn=${Xn-1}${Xn-1}` doubled a value each line (23 lines took 3.2 GB); the
/// chain must be refused at the line where a value first passes the bound, fast.
#[test]
fn resolve_doubling_env_bomb_refused_with_line_and_bound() {
    let mut text = String::from("FROM debian:12\nENV X0=0123456789abcdef\n");
    for n in 1..=40 {
        text.push_str(&format!("ENV X{n}=${{X{}}}${{X{}}}\n", n - 1, n - 1));
    }
    let file = parse(&text).unwrap();
    let t = std::time::Instant::now();

    let err = resolve(&file, &[]).unwrap_err();

    // X0 is 16 bytes: X11 is 32 KiB (allowed), X12 would be 64 KiB; X12 is on line 2 + 12.
    assert_eq!(err.line, 14, "{err}");
    assert!(err.to_string().contains("32768 bytes"), "{err}");
    assert!(t.elapsed() < std::time::Duration::from_secs(2));
}

#[test]
fn resolve_value_at_the_bound_is_accepted() {
    let text = format!(
        "FROM debian:12\nARG A={}\nENV B=${{A}}\nRUN true\n",
        "a".repeat(resolve::MAX_EXPANDED_VALUE)
    );
    let file = parse(&text).unwrap();

    let r = resolve(&file, &[]).unwrap();

    assert_eq!(r.steps[0].env["B"].len(), resolve::MAX_EXPANDED_VALUE);
}

#[test]
fn resolve_line_over_64k_after_expansion_refused() {
    let text = format!(
        "FROM debian:12\nARG A={}\nLABEL a=${{A}} b=${{A}} c=${{A}}\n",
        "a".repeat(30 << 10)
    );
    let file = parse(&text).unwrap();

    let err = resolve(&file, &[]).unwrap_err();

    assert_eq!(err.line, 3, "{err}");
    assert!(err.to_string().contains("65536 bytes"), "{err}");
}

#[test]
fn resolve_total_over_2m_after_expansion_refused() {
    // 100 values of 30 KiB: each value and each line is within bounds, the sum is not.
    let mut text = format!("FROM debian:12\nARG A={}\n", "a".repeat(30 << 10));
    for n in 0..100 {
        text.push_str(&format!("LABEL l{n}=${{A}}\n"));
    }
    let file = parse(&text).unwrap();

    let err = resolve(&file, &[]).unwrap_err();

    assert!(err.line > 3 && err.line < 102, "{err}");
    assert!(err.to_string().contains("2097152 bytes"), "{err}");
}

#[test]
fn resolve_environment_copied_into_many_steps_counts_against_total() {
    // 64 KiB of environment carried by up to 900 RUN steps would be 57 MiB of copies.
    let mut text = format!("FROM debian:12\nARG A={}\nENV B=${{A}}\n", "a".repeat(30 << 10));
    for _ in 0..900 {
        text.push_str("RUN true\n");
    }
    let file = parse(&text).unwrap();

    let err = resolve(&file, &[]).unwrap_err();

    assert!(err.to_string().contains("environment of this RUN step"), "{err}");
}

#[test]
fn resolve_build_arg_over_value_bound_refused() {
    let file = parse("FROM debian:12\nARG A\nRUN true\n").unwrap();

    let err = resolve(&file, &[("A".into(), "a".repeat(resolve::MAX_EXPANDED_VALUE + 1))]).unwrap_err();

    assert!(err.to_string().contains("--build-arg A"), "{err}");
}

#[test]
fn parse_from_oci_container_reference() {
    let d = format!("sha256:{}", "a".repeat(64));

    let f = parse(&format!("FROM oci://reg.example:5000/team/os@{d}\nRUN true\n")).unwrap();

    assert_eq!(
        f.from,
        FromSource::Container {
            reference: format!("reg.example:5000/team/os@{d}")
        }
    );
}

#[test]
fn parse_from_oci_without_repository_is_refused() {
    let e = line_err("FROM oci://\n");

    assert!(e.message.contains("oci://REGISTRY/REPO@sha256:<hex>"), "{e}");
}

#[test]
fn resolve_from_oci_with_variable_is_refused() {
    let f = parse("FROM oci://reg.example/$X\n").unwrap();

    let e = resolve(&f, &[]).unwrap_err();

    assert!(e.message.contains("uses a variable"), "{e}");
}
