//! `nubo seed build` (a cloud-localds drop-in) and `nubo seed inspect`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use nubo_core::file::escape_control;
use nubo_seed::{CloudConfig, SeedFile, SeedFormat, SeedSpec};

use crate::cli::seed::{SeedBuildArgs, SeedCmd, SeedFormatArg, SeedInspectArgs};
use crate::output::{print_json, Format};
use crate::settings::Settings;

pub fn run(cmd: SeedCmd, _settings: &Settings) -> anyhow::Result<()> {
    match cmd {
        SeedCmd::Build(a) => build(&a),
        SeedCmd::Inspect(a) => inspect(&a),
    }
}

/// Where each input comes from once `-o` and cloud-localds' positional form are reconciled.
struct Inputs {
    output: PathBuf,
    user_data: Option<PathBuf>,
    meta_data: Option<PathBuf>,
}

fn resolve_inputs(a: &SeedBuildArgs) -> anyhow::Result<Inputs> {
    let mut pos = a.positional.iter().cloned();
    let output = match &a.output {
        Some(o) => o.clone(),
        None => pos
            .next()
            .context("no output file: give `-o seed.iso` (or OUTPUT first, as cloud-localds takes it)")?,
    };
    let positional_user_data = pos.next();
    let meta_data = pos.next();
    if pos.next().is_some() {
        bail!("too many file arguments: with -o, give at most USER-DATA and META-DATA");
    }
    if positional_user_data.is_some() && a.user_data.is_some() {
        bail!("user-data given twice (positional and --user-data): keep one");
    }
    Ok(Inputs {
        output,
        user_data: positional_user_data.or_else(|| a.user_data.clone()),
        meta_data,
    })
}

fn build(a: &SeedBuildArgs) -> anyhow::Result<()> {
    let inputs = resolve_inputs(a)?;
    let to_stdout = inputs.output == Path::new("-");
    if !to_stdout {
        // Up front, so a device, FIFO or symlink at the output is refused before any work.
        nubo_core::file::check_output(&inputs.output).context("checking the seed's output path")?;
    }
    let user_data = match &inputs.user_data {
        Some(path) => {
            if !a.ssh_keys.is_empty() {
                bail!("--ssh-key cannot be combined with user-data {}: add the key under `ssh_authorized_keys:` in that file", path.display());
            }
            let bytes = read_input(path, "user-data", nubo_seed::MAX_USER_DATA)?;
            if !a.no_validate {
                nubo_seed::validate_user_data(&bytes)
                    .with_context(|| format!("{} (pass --no-validate to send it anyway)", path.display()))?;
            }
            Some(bytes)
        }
        None if a.hostname.is_some() || !a.ssh_keys.is_empty() => {
            let home = std::env::var_os("HOME").map(PathBuf::from);
            let keys = a
                .ssh_keys
                .iter()
                .map(|k| crate::ssh_keys::parse(k, home.as_deref()))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let cc = CloudConfig {
                hostname: a.hostname.clone(),
                ssh_authorized_keys: keys.concat(),
            };
            Some(nubo_seed::render_cloud_config(&cc))
        }
        None => None,
    };
    let network_config = match &a.network_config {
        Some(path) => {
            let bytes = read_input(path, "network-config", nubo_seed::MAX_NETWORK_CONFIG)?;
            if !a.no_validate {
                nubo_seed::validate_network_config(&bytes)
                    .with_context(|| format!("{} (pass --no-validate to send it anyway)", path.display()))?;
            }
            Some(bytes)
        }
        None => None,
    };
    let vendor_data = match &a.vendor_data {
        Some(path) => {
            let bytes = read_input(path, "vendor-data", nubo_seed::MAX_VENDOR_DATA)?;
            if !a.no_validate {
                nubo_seed::validate_vendor_data(&bytes)
                    .with_context(|| format!("{} (pass --no-validate to send it anyway)", path.display()))?;
            }
            Some(bytes)
        }
        None => None,
    };
    let spec = SeedSpec {
        instance_id: a.instance_id.clone(),
        local_hostname: a.hostname.clone().unwrap_or_default(),
        user_data,
        network_config,
        vendor_data,
    };
    let mut files = nubo_seed::seed_files(&spec).context("building the seed's meta-data")?;
    if let Some(path) = &inputs.meta_data {
        // cloud-localds' META-DATA replaces the generated one, byte for byte.
        files[0].data = read_input(path, "meta-data", nubo_seed::MAX_META_DATA)?;
    }
    let image = match a.format {
        SeedFormatArg::Iso => {
            let mut out = Vec::new();
            nubo_seed::write_iso_files(&files, &mut out).map(|()| out)
        }
        SeedFormatArg::Vfat => nubo_seed::build_vfat(&files),
    }
    .context("building the seed image")?;
    if to_stdout {
        let mut out = std::io::stdout().lock();
        out.write_all(&image)?;
        return Ok(out.flush()?);
    }
    // 0600: a seed carries the user's keys and whatever secrets their user-data holds.
    // The error names the path and the cause; the context only says which output it was.
    nubo_core::file::write_output(&inputs.output, &image, SEED_MODE).context("writing the seed image")
}

/// The seed's file mode: it may hold secrets (passwords, tokens in user-data).
const SEED_MODE: u32 = 0o600;

/// The whole of input `path` (a regular file, a pipe or FIFO, or `-` for standard input),
/// refused when it is a device or a directory, is over `max` bytes, or a pipe stays silent.
fn read_input(path: &Path, what: &str, max: u64) -> anyhow::Result<Vec<u8>> {
    Ok(nubo_core::input::read_small_input(path, what, max)?)
}

#[derive(serde::Serialize)]
struct FileJson<'a> {
    name: &'a str,
    size: usize,
    /// The file as text, or null when it is not UTF-8 (gzip user-data, for one).
    content: Option<&'a str>,
}

#[derive(serde::Serialize)]
struct InspectJson<'a> {
    image: String,
    format: SeedFormat,
    files: Vec<FileJson<'a>>,
}

fn inspect(a: &SeedInspectArgs) -> anyhow::Result<()> {
    let image = nubo_core::file::read_bounded(&a.image, "seed image", nubo_seed::MAX_SEED_IMAGE)?;
    let format = SeedFormat::sniff(&image).with_context(|| {
        format!(
            "{} is not a seed image (neither ISO9660 nor VFAT): build one with `nubo seed build`",
            a.image.display()
        )
    })?;
    let files = nubo_seed::read(&image).with_context(|| format!("reading seed image {}", a.image.display()))?;
    match a.output {
        Format::Json => print_json(&InspectJson {
            image: a.image.display().to_string(),
            format,
            files: files
                .iter()
                .map(|f| FileJson {
                    name: &f.name,
                    size: f.data.len(),
                    content: text(f),
                })
                .collect(),
        }),
        Format::Table => print_files(format, &files),
    }
}

fn text(f: &SeedFile) -> Option<&str> {
    std::str::from_utf8(&f.data).ok()
}

fn print_files(format: SeedFormat, files: &[SeedFile]) -> anyhow::Result<()> {
    // Names and contents come from the image, which anyone may have made: never raw to a terminal.
    let rows: Vec<Vec<String>> = files
        .iter()
        .map(|f| vec![escape_control(&f.name), f.data.len().to_string()])
        .collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "format: {format}")?;
    drop(out);
    crate::output::print_table(&["NAME", "SIZE"], &rows)?;
    let mut out = std::io::stdout().lock();
    for f in files {
        writeln!(out, "\n--- {} ({} bytes)", escape_control(&f.name), f.data.len())?;
        match text(f) {
            Some(t) => {
                out.write_all(escape_control(t).as_bytes())?;
                if !t.is_empty() && !t.ends_with('\n') {
                    writeln!(out)?;
                }
            }
            None => writeln!(out, "<binary: {} bytes, not shown>", f.data.len())?,
        }
    }
    Ok(out.flush()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn build_args(argv: &[&str]) -> SeedBuildArgs {
        let argv = ["nubo", "seed", "build"].iter().chain(argv);
        match crate::cli::Cli::try_parse_from(argv).unwrap().command {
            crate::cli::Command::Seed(SeedCmd::Build(a)) => a,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn resolve_inputs_cloud_localds_positional_form() {
        let a = build_args(&["seed.iso", "ud", "md"]);

        let i = resolve_inputs(&a).unwrap();

        assert_eq!(
            (i.output, i.user_data, i.meta_data),
            ("seed.iso".into(), Some("ud".into()), Some("md".into()))
        );
    }

    #[test]
    fn resolve_inputs_output_flag_with_user_data_flag() {
        let a = build_args(&["-o", "s.iso", "--user-data", "ud"]);

        let i = resolve_inputs(&a).unwrap();

        assert_eq!(
            (i.output, i.user_data, i.meta_data),
            ("s.iso".into(), Some("ud".into()), None)
        );
    }

    #[test]
    fn resolve_inputs_no_output_is_refused() {
        let a = build_args(&["--hostname", "h"]);

        let err = resolve_inputs(&a).err().unwrap();

        assert!(err.to_string().contains("-o seed.iso"), "{err}");
    }

    #[test]
    fn resolve_inputs_user_data_twice_is_refused() {
        let a = build_args(&["-o", "s.iso", "ud", "--user-data", "ud2"]);

        assert!(resolve_inputs(&a).is_err());
    }
}
