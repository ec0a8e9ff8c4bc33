//! One copy per node, seen from the library: a mount's copy is handed to a process of the user only once it is complete (a copy still filling, or an archive served in place, is not: the caller stages its own), and what is handed over reads byte for byte.

use std::path::Path;

use stagefs_open::places::{open_outside, Trust};
use stagefs_open::stage::Staging;

use crate::kit::*;

/// The archive as `stagefs.open` would find it: from a mount's copy, if one is handed over.
fn shared(archive: &Path) -> Option<stagefs_open::open::Opened> {
    let file = open_outside(archive, Trust::Named, None).unwrap();
    stagefs_open::share::receive(&file, &Default::default())
}

#[test]
fn only_a_complete_copy_is_handed_over_and_it_reads_byte_for_byte() {
    require_root();
    // Three members of 3 MiB: a copy of several 4 MiB chunks.
    let scene = Scene::new("share")
        .files([(0, "a.bin"), (1, "b.bin"), (2, "c.bin")].map(|(i, n)| (n, pseudo_random(i, 3 << 20))));
    let (tar, mp) = (scene.tar_at(&scene.join("data.tar")), scene.join("mnt"));

    let in_place = Mounted::with_env(&[], &["--stage", "none"], &tar, &mp);
    assert!(shared(&tar).is_none(), "a mount in place holds no copy to hand over");
    drop(in_place);

    // A copy slowed down to a chunk every 10 s is not complete while we ask.
    let filling =
        Mounted::with_env(&[("STAGEFS_TEST_STAGE_CHUNK_DELAY_MS", Some("10000"))], &["--stage", "copy"], &tar, &mp);
    assert!(shared(&tar).is_none(), "a copy still filling is not handed over");
    drop(filling);

    let copied = Mounted::with_env(&[], &["--stage", "copy"], &tar, &mp);
    stagefs(["wait".as_ref(), "--staged".as_ref(), mp.as_os_str()]).assert_success();
    let opened = shared(&tar).expect("the complete copy is handed over");
    assert_eq!(opened.staging, Staging::Shared);
    drop(copied);
    // The mount is gone; what was handed over still reads, byte for byte.
    let index = &opened.archive.index;
    for (name, expected) in scene.members() {
        let id = index.resolve(name.as_bytes(), true).unwrap();
        let inode = index.inode(id).unwrap();
        let mut bytes = Vec::new();
        while (bytes.len() as u64) < inode.attrs.size {
            let piece = opened.archive.read(id, &inode, bytes.len() as u64, 1 << 20).unwrap();
            assert!(!piece.is_empty());
            bytes.extend_from_slice(&piece);
        }
        assert_eq!(&bytes, expected, "{name}");
    }
}
