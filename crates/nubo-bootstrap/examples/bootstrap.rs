//! Runs one bootstrap outside the CLI: `cargo run -p nubo-bootstrap --example bootstrap -- OUT_DIR [CACHE_DIR]`.
//! Leaves `image.qcow2`, `vmlinuz`, `initrd.img` and `cmdline` in OUT_DIR. For working on the
//! recipe without the image store.

use std::path::PathBuf;
use std::time::Duration;

use nubo_bootstrap::{build, BuildSpec, Host, Progress, Recipe, Release, Stage, DEFAULT_SIZE};

struct Print;

impl Progress for Print {
    fn started(&mut self, stage: Stage) {
        eprintln!("[{}/{}] {}", stage.number(), Stage::ALL.len(), stage.label());
    }
    fn detail(&mut self, _stage: Stage, line: &str) {
        eprintln!("      {line}");
    }
    fn finished(&mut self, _stage: Stage, elapsed: Duration) {
        eprintln!("      done in {:.1}s", elapsed.as_secs_f64());
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(args.next().ok_or("usage: bootstrap OUT_DIR [CACHE_DIR]")?);
    let cache = args.next().map(PathBuf::from);
    std::fs::create_dir_all(&out)?;
    let host = Host::probe()?;
    let mirror = nubo_bootstrap::host_mirror(std::path::Path::new("/etc/apt"))?;
    let recipe = Recipe::new(Release::find("debian", "12")?, mirror, DEFAULT_SIZE, vec![])?;
    let spec = BuildSpec {
        recipe: &recipe,
        cache_dir: cache.as_deref(),
        work_parent: &out,
    };
    let built = build(&host, &spec, &mut Print)?;
    std::fs::rename(&built.qcow2, out.join("image.qcow2"))?;
    std::fs::rename(&built.kernel, out.join("vmlinuz"))?;
    std::fs::rename(&built.initrd, out.join("initrd.img"))?;
    std::fs::write(out.join("cmdline"), &built.cmdline)?;
    println!(
        "{} {} bytes in {:.1}s, key {}",
        built.digest,
        built.size,
        built.elapsed.as_secs_f64(),
        recipe.key()
    );
    Ok(())
}
