//! `cargo run -p nubo-disk --example overlay -- BASE FORMAT OUT [SIZE]`: makes an overlay the
//! way nubo does, for poking at it with qemu-img by hand. `inspect PATH` prints DiskInfo.
use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [cmd, path] if cmd == "inspect" => {
            println!("{:#?}", nubo_disk::inspect(Path::new(path))?);
        }
        [base, format, out, rest @ ..] => {
            let size = rest
                .first()
                .map(|s| nubo_core::ByteSize::parse(s))
                .transpose()?
                .map(|s| s.bytes());
            nubo_disk::create_overlay(Path::new(base), format.parse()?, Path::new(out), size)?;
        }
        _ => return Err("usage: overlay BASE FORMAT OUT [SIZE] | overlay inspect PATH".into()),
    }
    Ok(())
}
