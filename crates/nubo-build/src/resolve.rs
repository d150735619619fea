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

/// The most one value may hold after variable expansion (an ARG, ENV or LABEL value, a COPY
/// path): far beyond any real setting, and small enough that a doubling chain
/// (`ENV X1=${X0}${X0}`, `ENV X2=${X1}${X1}`, ...) is refused after a dozen lines instead of
/// taking gigabytes.
pub const MAX_EXPANDED_VALUE: usize = 32 << 10;
/// The most one instruction's values may hold in all after expansion.
pub const MAX_EXPANDED_LINE: usize = 64 << 10;
/// The most the whole resolved VMfile may hold: every expanded value, and the environment each
/// step carries (a RUN step gets a copy of every variable in effect).
pub const MAX_EXPANDED_TOTAL: usize = 2 << 20;

/// What expansion has produced so far, against [`MAX_EXPANDED_LINE`] and [`MAX_EXPANDED_TOTAL`].
#[derive(Default)]
struct Budget {
    line: usize,
    line_used: usize,
    total_used: usize,
}

impl Budget {
    fn start(&mut self, line: usize) {
        self.line = line;
        self.line_used = 0;
    }

    /// Counts `n` more bytes expanded on this line (`what` says by what, for the error).
    fn spend(&mut self, n: usize, what: &str) -> Result<(), ParseError> {
        self.line_used = self.line_used.saturating_add(n);
        if self.line_used > MAX_EXPANDED_LINE {
            return Err(ParseError {
                line: self.line,
                message: format!(
                    "this instruction expands to more than {MAX_EXPANDED_LINE} bytes (64 KiB), the most one line may hold after variable expansion: use shorter values, or COPY a file in"
                ),
            });
        }
        self.carry(n, what)
    }

    /// Counts `n` more bytes the resolved build holds (a step's copy of the environment)
    /// against the total only.
    fn carry(&mut self, n: usize, what: &str) -> Result<(), ParseError> {
        self.total_used = self.total_used.saturating_add(n);
        if self.total_used > MAX_EXPANDED_TOTAL {
            return Err(ParseError {
                line: self.line,
                message: format!(
                    "{what} takes the VMfile past {MAX_EXPANDED_TOTAL} bytes (2 MiB) after variable expansion (every value, and the environment each step carries): use fewer or shorter variables"
                ),
            });
        }
        Ok(())
    }
}

/// The bytes `vars` holds: what each step's copy of the environment costs.
fn env_bytes(vars: &BTreeMap<String, String>) -> usize {
    vars.iter().map(|(k, v)| k.len() + v.len()).sum()
}

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
        if v.len() > MAX_EXPANDED_VALUE {
            return Err(ParseError {
                line: 0,
                message: format!(
                    "--build-arg {}: the value is {} bytes, more than the {MAX_EXPANDED_VALUE} (32 KiB) a value may hold: COPY a file in instead",
                    esc(k),
                    v.len()
                ),
            });
        }
        given.insert(k, v);
    }
    let mut budget = Budget::default();
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
        budget.start(line);
        let budget = &mut budget;
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
                    (None, Some(d)) => substitute(line, d, &vars, budget)?,
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
                    let v = substitute(line, v, &vars, budget)?;
                    vars.insert(k.clone(), v);
                }
            }
            Op::Label(pairs) => {
                for (k, v) in pairs {
                    out.labels.insert(k.clone(), substitute(line, v, &vars, budget)?);
                }
            }
            Op::Run(c) => {
                budget.carry(env_bytes(&vars), "the environment of this RUN step")?;
                out.steps.push(Step {
                    line,
                    text: ins.text.clone(),
                    action: Action::Run(c.clone()),
                    env: vars.clone(),
                })
            }
            Op::Copy { sources, dest } => {
                let sources = sources
                    .iter()
                    .map(|s| {
                        let s = substitute(line, s, &vars, budget)?;
                        check_context_path(line, "COPY", &s)?;
                        Ok(s)
                    })
                    .collect::<Result<Vec<_>, ParseError>>()?;
                let dest = substitute(line, dest, &vars, budget)?;
                if !dest.starts_with('/') {
                    return Err(ParseError {
                        line,
                        message: format!(
                            "COPY destination `{}` is relative: give an absolute path in the guest",
                            esc(&dest)
                        ),
                    });
                }
                budget.carry(env_bytes(&vars), "the environment of this COPY step")?;
                out.steps.push(Step {
                    line,
                    text: ins.text.clone(),
                    action: Action::Copy { sources, dest },
                    env: vars.clone(),
                });
            }
            Op::CloudInit(p) => {
                let p = substitute(line, p, &vars, budget)?;
                check_context_path(line, "CLOUDINIT", &p)?;
                budget.carry(env_bytes(&vars), "the environment of this CLOUDINIT step")?;
                out.steps.push(Step {
                    line,
                    text: ins.text.clone(),
                    action: Action::CloudInit(p),
                    env: vars.clone(),
                });
            }
        }
    }
    if let FromSource::Image { reference } | FromSource::Container { reference } = &out.from {
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

/// `${NAME}` and `$NAME` replaced by their values; `$$` is a literal `$`. The result may hold
/// at most [`MAX_EXPANDED_VALUE`] bytes, checked before each piece is appended (so a bomb never
/// allocates past the bound), and counts against `budget`.
fn substitute(
    line: usize,
    s: &str,
    vars: &BTreeMap<String, String>,
    budget: &mut Budget,
) -> Result<String, ParseError> {
    let out = expand(line, s, vars)?;
    budget.spend(out.len(), "this value")?;
    Ok(out)
}

fn expand(line: usize, s: &str, vars: &BTreeMap<String, String>) -> Result<String, ParseError> {
    let too_long = |what: String| {
        ParseError {
        line,
        message: format!(
            "{what} gives a value longer than {MAX_EXPANDED_VALUE} bytes (32 KiB), the most one value may hold after variable expansion: use shorter values, or COPY a file in"
        ),
    }
    };
    let fits = |out: &String, more: usize| out.len().saturating_add(more) <= MAX_EXPANDED_VALUE;
    if !fits(&String::new(), s.len()) {
        return Err(too_long("the value as written".into()));
    }
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
            Some(v) if !fits(&out, v.len()) => {
                let shown: String = name.chars().take(64).collect();
                return Err(too_long(format!("expanding `${{{}}}` here", esc(&shown))));
            }
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
    if !fits(&out, rest.len()) {
        return Err(too_long("expanding the variables here".into()));
    }
    out.push_str(rest);
    Ok(out)
}

fn esc(s: &str) -> String {
    nubo_core::name::quote(s)
}
