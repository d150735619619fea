//! From a parsed VMfile and the `--build-arg`s to what the build does: variables substituted,
//! the image's settings gathered, and the steps that run in the guest, each with the
//! environment it sees. Pure.

use std::collections::BTreeMap;

use nubo_core::ByteSize;
use serde::Serialize;

use crate::parse::{check_context_path, ParseError};
use crate::vmfile::{Command, FromSource, Op, VmFile};

/// What a build does, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resolved {
    pub from: FromSource,
    pub size: Option<ByteSize>,
    pub hypervisor: Option<String>,
    pub vcpus: Option<u32>,
    pub memory: Option<ByteSize>,
    pub appliance: bool,
    pub labels: BTreeMap<String, String>,
    /// The build arguments in effect (declared defaults and `--build-arg`s), recorded in provenance.
    pub args: BTreeMap<String, String>,
    /// The steps that run in the build VM, in order.
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub line: usize,
    /// The instruction as written (the cache key's text).
    pub text: String,
    pub action: Action,
    /// ARGs and ENVs in effect at this step: RUN sees them as its environment.
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "action")]
pub enum Action {
    Run(Command),
    Copy { sources: Vec<String>, dest: String },
    CloudInit(String),
}

/// Where the CLOUDINIT file goes in the image: cloud.cfg.d is read after cloud.cfg, and `90-`
/// sorts after the distro's own files, so the image's settings win over the distro's.
pub const CLOUD_CFG: &str = "/etc/cloud/cloud.cfg.d/90-nubo-image.cfg";

/// Substitutes variables and applies `build_args` (each must be declared by an ARG).
pub fn resolve(file: &VmFile, build_args: &[(String, String)]) -> Result<Resolved, ParseError> {
    let mut given: BTreeMap<&str, &str> = BTreeMap::new();
    for (k, v) in build_args {
        if !file
            .instructions
            .iter()
            .any(|i| matches!(&i.op, Op::Arg { name, .. } if name == k))
        {
            return Err(ParseError {
                line: 0,
                message: format!(
                    "--build-arg {}: the VMfile declares no `ARG {}`: add it, or drop the flag",
                    esc(k),
                    esc(k)
                ),
            });
        }
        given.insert(k, v);
    }
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut args = BTreeMap::new();
    let mut out = Resolved {
        from: file.from.clone(),
        size: None,
        hypervisor: None,
        vcpus: None,
        memory: None,
        appliance: false,
        labels: BTreeMap::new(),
        args: BTreeMap::new(),
        steps: Vec::new(),
    };
    for ins in &file.instructions {
        let line = ins.line;
        match &ins.op {
            Op::From(_) => {}
            Op::Size(s) => out.size = Some(*s),
            Op::Hypervisor(h) => out.hypervisor = Some(h.clone()),
            Op::Defaults { vcpus, memory } => {
                out.vcpus = *vcpus;
                out.memory = *memory;
            }
            Op::Appliance => out.appliance = true,
            Op::Arg { name, default } => {
                let value = match (given.get(name.as_str()), default) {
                    (Some(v), _) => (*v).to_owned(),
                    (None, Some(d)) => substitute(line, d, &vars)?,
                    (None, None) => {
                        return Err(ParseError {
                            line,
                            message: format!("ARG {name} has no default and no value: pass `--build-arg {name}=...` or write `ARG {name}=default`"),
                        })
                    }
                };
                args.insert(name.clone(), value.clone());
                vars.insert(name.clone(), value);
            }
            Op::Env(pairs) => {
                for (k, v) in pairs {
                    let v = substitute(line, v, &vars)?;
                    vars.insert(k.clone(), v);
                }
            }
            Op::Label(pairs) => {
                for (k, v) in pairs {
                    out.labels.insert(k.clone(), substitute(line, v, &vars)?);
                }
            }
            Op::Run(c) => out.steps.push(Step {
                line,
                text: ins.text.clone(),
                action: Action::Run(c.clone()),
                env: vars.clone(),
            }),
            Op::Copy { sources, dest } => {
                let sources = sources
                    .iter()
                    .map(|s| {
                        let s = substitute(line, s, &vars)?;
                        check_context_path(line, "COPY", &s)?;
                        Ok(s)
                    })
                    .collect::<Result<Vec<_>, ParseError>>()?;
                let dest = substitute(line, dest, &vars)?;
                if !dest.starts_with('/') {
                    return Err(ParseError {
                        line,
                        message: format!(
                            "COPY destination `{}` is relative: give an absolute path in the guest",
                            esc(&dest)
                        ),
                    });
                }
                out.steps.push(Step {
                    line,
                    text: ins.text.clone(),
                    action: Action::Copy { sources, dest },
                    env: vars.clone(),
                });
            }
            Op::CloudInit(p) => {
                let p = substitute(line, p, &vars)?;
                check_context_path(line, "CLOUDINIT", &p)?;
                out.steps.push(Step {
                    line,
                    text: ins.text.clone(),
                    action: Action::CloudInit(p),
                    env: vars.clone(),
                });
            }
        }
    }
    if let FromSource::Image { reference } = &out.from {
        // FROM is the first instruction, before any ARG, so a `$` in it names nothing.
        if reference.contains('$') {
            return Err(ParseError {
                line: file.instructions.first().map_or(1, |i| i.line),
                message: format!(
                    "FROM `{}` uses a variable, but FROM comes before any ARG: write the image out",
                    esc(reference)
                ),
            });
        }
    }
    out.args = args;
    Ok(out)
}

/// `${NAME}` and `$NAME` replaced by their values; `$$` is a literal `$`.
fn substitute(line: usize, s: &str, vars: &BTreeMap<String, String>) -> Result<String, ParseError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, skip) = if let Some(b) = after.strip_prefix('{') {
            match b.find('}') {
                Some(end) => (&b[..end], end + 2),
                None => {
                    return Err(ParseError {
                        line,
                        message: format!("`${{` without its `}}` in `{}`", esc(s)),
                    })
                }
            }
        } else if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
            continue;
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        if name.is_empty() {
            out.push('$');
            rest = after;
            continue;
        }
        match vars.get(name) {
            Some(v) => out.push_str(v),
            None => {
                return Err(ParseError {
                    line,
                    message: format!(
                        "`${}` is not defined here: declare it with ARG or ENV above this line",
                        esc(name)
                    ),
                })
            }
        }
        rest = &after[skip..];
    }
    out.push_str(rest);
    Ok(out)
}

fn esc(s: &str) -> String {
    nubo_core::name::quote(s)
}
