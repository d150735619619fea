//! A tiny PVH test guest, made by the tests themselves: an ELF64 with a Xen PVH entry note
//! (`XEN_ELFNOTE_PHYS32_ENTRY`), loaded at 1 MiB, whose 44 bytes of 32-bit code print a counter
//! to COM1 (0x3f8) as eight hex digits and a newline, forever, with a busy delay between lines.
//! Cloud Hypervisor boots it through its PVH entry; QEMU's microvm machine through
//! `-kernel` the same way. On a PVM host its 32-bit code is emulated: about ten lines a second.
//! The counter is what proves continuity: a restored guest goes on from the snapshot's value,
//! a rebooted one starts again at 00000000.

/// Where the guest is loaded (the PVH boot protocol's lowest usual address).
const BASE: u64 = 0x10_0000;
/// Where the code starts in the file (and, + BASE, in guest memory).
const CODE_OFFSET: usize = 200;
/// The delay loop's iterations between lines.
pub const DELAY: u32 = 0x1_0000;

/// The guest's code (assembled from the listing beside each line, `as --32`).
fn code() -> Vec<u8> {
    let d = DELAY.to_le_bytes();
    let mut c = vec![
        0x66, 0xba, 0xf8, 0x03, //             mov  $0x3f8, %dx
        0x31, 0xdb, //                         xor  %ebx, %ebx
        0xb9, 0x08, 0x00, 0x00, 0x00, //       1: mov $8, %ecx
        0xc1, 0xc3, 0x04, //                   2: rol $4, %ebx
        0x88, 0xd8, //                         mov  %bl, %al
        0x24, 0x0f, //                         and  $0xf, %al
        0x3c, 0x0a, //                         cmp  $10, %al
        0x72, 0x02, //                         jb   3f
        0x04, 0x27, //                         add  $39, %al   ('a' - '0' - 10)
        0x04, 0x30, //                         3: add $'0', %al
        0xee, //                               out  %al, (%dx)
        0xe2, 0xee, //                         loop 2b
        0xb0, 0x0a, //                         mov  $'\n', %al
        0xee, //                               out  %al, (%dx)
        0xb9, //                               mov  $DELAY, %ecx
    ];
    c.extend_from_slice(&d);
    c.extend_from_slice(&[
        0x49, //                               4: dec %ecx
        0x75, 0xfd, //                         jnz  4b
        0x43, //                               inc  %ebx
        0xeb, 0xdb, //                         jmp  1b
    ]);
    c
}

/// The whole ELF file.
pub fn guest_elf() -> Vec<u8> {
    let code = code();
    let entry = BASE + CODE_OFFSET as u64;
    let total = (CODE_OFFSET + code.len()) as u64;
    let mut note = Vec::new();
    note.extend_from_slice(&4u32.to_le_bytes()); // namesz ("Xen\0")
    note.extend_from_slice(&4u32.to_le_bytes()); // descsz
    note.extend_from_slice(&18u32.to_le_bytes()); // XEN_ELFNOTE_PHYS32_ENTRY
    note.extend_from_slice(b"Xen\0");
    note.extend_from_slice(&(entry as u32).to_le_bytes());
    let note_off = 64 + 2 * 56;

    let mut e = Vec::new();
    e.extend_from_slice(b"\x7fELF\x02\x01\x01\x00"); // ELF64, little-endian, version 1
    e.extend_from_slice(&[0; 8]);
    e.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    e.extend_from_slice(&1u32.to_le_bytes());
    e.extend_from_slice(&entry.to_le_bytes());
    e.extend_from_slice(&64u64.to_le_bytes()); // program headers right after this header
    e.extend_from_slice(&0u64.to_le_bytes()); // no section headers
    e.extend_from_slice(&0u32.to_le_bytes());
    for h in [64u16, 56, 2, 0, 0, 0] {
        e.extend_from_slice(&h.to_le_bytes());
    }
    let phdr = |e: &mut Vec<u8>, kind: u32, flags: u32, off: u64, addr: u64, size: u64, align: u64| {
        e.extend_from_slice(&kind.to_le_bytes());
        e.extend_from_slice(&flags.to_le_bytes());
        for v in [off, addr, addr, size, size, align] {
            e.extend_from_slice(&v.to_le_bytes());
        }
    };
    phdr(&mut e, 1, 5, 0, BASE, total, 0x1000); // PT_LOAD r-x: the whole file at 1 MiB
    phdr(
        &mut e,
        4,
        4,
        note_off as u64,
        BASE + note_off as u64,
        note.len() as u64,
        4,
    ); // PT_NOTE
    e.extend_from_slice(&note);
    e.resize(CODE_OFFSET, 0);
    e.extend_from_slice(&code);
    e
}

/// The counter values in a serial log, in order (complete lines only).
pub fn counters(log: &str) -> Vec<u32> {
    log.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .filter_map(|l| u32::from_str_radix(l.trim_end(), 16).ok())
        .collect()
}
