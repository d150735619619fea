//! `nubo vm snapshot create|ls|rm|restore`.

use nubo_backend::Restored;
use nubo_engine::snapshot::SnapshotInfo;
use nubo_engine::Engine;

use super::print_event;
use crate::cli::vm::SnapshotCmd;
use crate::output::{print_json, print_table, Format};

pub fn run(cmd: SnapshotCmd, engine: &Engine) -> anyhow::Result<()> {
    match cmd {
        SnapshotCmd::Create(a) => {
            let c = engine.snapshot_create(
                &a.name,
                a.snapshot.as_deref(),
                a.description.as_deref(),
                &mut print_event,
            )?;
            let what = if c.info.has_memory {
                format!("disk and memory, {} of VM state", size(c.info.vm_state_size))
            } else {
                "disk only".to_owned()
            };
            match c.frozen {
                Some(f) => eprintln!(
                    "  snapshot `{}` of vm `{}` taken ({what}); the guest was frozen for {:.3}s",
                    c.info.name,
                    a.name,
                    f.as_secs_f64()
                ),
                None => eprintln!("  snapshot `{}` of vm `{}` taken ({what})", c.info.name, a.name),
            }
            println!("{}", c.info.name);
            Ok(())
        }
        SnapshotCmd::Ls(a) => {
            let l = engine.snapshot_list(&a.name)?;
            if a.output == Format::Json {
                return print_json(&l);
            }
            let rows: Vec<Vec<String>> = l.snapshots.iter().map(row).collect();
            print_table(
                &[
                    "NAME",
                    "CURRENT",
                    "STATUS",
                    "CREATED",
                    "MEMORY",
                    "VM STATE",
                    "PARENT",
                    "DESCRIPTION",
                ],
                &rows,
            )?;
            for s in l.snapshots.iter().filter(|s| s.note.is_some()) {
                eprintln!(
                    "note: snapshot `{}` is {}: {}",
                    nubo_core::name::quote(&s.name),
                    s.status.word(),
                    s.note.as_deref().unwrap_or("")
                );
            }
            Ok(())
        }
        SnapshotCmd::Rm(a) => Ok(engine.snapshot_remove(&a.name, &a.snapshots, &mut print_event)?),
        SnapshotCmd::Restore(a) => {
            let (r, state) = engine.snapshot_restore(&a.name, &a.snapshot, &mut print_event)?;
            if let Restored::DiskOnly = r {
                eprintln!("  start it with `nubo vm start {}`", a.name);
            }
            eprintln!("  vm `{}` is {state}", a.name);
            Ok(())
        }
    }
}

fn row(s: &SnapshotInfo) -> Vec<String> {
    vec![
        s.name.clone(),
        if s.current { "*".into() } else { String::new() },
        s.status.word().into(),
        s.created.clone().unwrap_or_else(|| "-".into()),
        if s.has_memory { "yes".into() } else { "no".into() },
        if s.has_memory {
            size(s.vm_state_size)
        } else {
            "-".into()
        },
        s.parent.clone().unwrap_or_else(|| "-".into()),
        s.description
            .as_deref()
            .map(nubo_core::file::escape_control)
            .unwrap_or_default(),
    ]
}

fn size(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}
