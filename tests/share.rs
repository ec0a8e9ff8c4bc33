//! One copy per node, seen from the library: a mount's copy is handed to a process of the user only once it is complete (a copy still filling, or an archive served in place, is not: the caller stages its own), and what is handed over reads byte for byte.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use stagefs_open::places::{open_outside, Trust};
use stagefs_open::stage::Staging;

use crate::kit::{pack_tar, pseudo_random, require_root, run_cmd, stagefs, stagefs_bin, Mounted, TempDir};

/// The archive as `stagefs.open` would find it: from a mount's copy, if one is handed over.
fn shared(archive: &Path) -> Option<stagefs_open::open::Opened> {
    let file = open_outside(archive, Trust::Named, None).unwrap();
    stagefs_open::share::receive(&file, 0)
}

fn mount(archive: &Path, mp: &Path, args: &[&str], env: &[(&str, &str)]) -> Mounted {
    let mut cmd = Command::new(stagefs_bin());
    cmd.envs(env.iter().copied()).arg("mount").args(args).arg(archive).arg(mp);
    run_cmd(&mut cmd, Duration::from_secs(120)).assert_success();
    Mounted::adopt(archive, mp)
}

#[test]
fn only_a_complete_copy_is_handed_over_and_it_reads_byte_for_byte() {
    require_root();
    let tmp = TempDir::new("share");
    let src = tmp.join("src");
    fs::create_dir(&src).unwrap();
    // Three members of 3 MiB: a copy of several 4 MiB chunks.
    let names = ["a.bin", "b.bin", "c.bin"];
    for (i, name) in names.iter().enumerate() {
        fs::write(src.join(name), pseudo_random(i as u64, 3 << 20)).unwrap();
    }
    let tar = tmp.join("data.tar");
    pack_tar(&src, &tar, &names);
    let mp = tmp.join("mnt");

    let in_place = mount(&tar, &mp, &["--stage", "none"], &[]);
    assert!(shared(&tar).is_none(), "a mount in place holds no copy to hand over");
    drop(in_place);

    // A copy slowed down to a chunk every 10 s is not complete while we ask.
    let filling = mount(&tar, &mp, &["--stage", "copy"], &[("STAGEFS_TEST_STAGE_CHUNK_DELAY_MS", "10000")]);
    assert!(shared(&tar).is_none(), "a copy still filling is not handed over");
    drop(filling);

    let copied = mount(&tar, &mp, &["--stage", "copy"], &[]);
    stagefs(["wait".as_ref(), "--staged".as_ref(), mp.as_os_str()]).assert_success();
    let opened = shared(&tar).expect("the complete copy is handed over");
    assert_eq!(opened.staging, Staging::Shared);
    drop(copied);
    // The mount is gone; what was handed over still reads, byte for byte.
    let index = &opened.archive.index;
    for name in names {
        let id = index.resolve(name.as_bytes(), true).unwrap();
        let inode = index.inode(id).unwrap();
        let mut bytes = Vec::new();
        while (bytes.len() as u64) < inode.attrs.size {
            let piece = opened.archive.read(id, &inode, bytes.len() as u64, 1 << 20).unwrap();
            assert!(!piece.is_empty());
            bytes.extend_from_slice(&piece);
        }
        assert_eq!(bytes, fs::read(src.join(name)).unwrap(), "{name}");
    }
}
