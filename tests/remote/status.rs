//! `stagefs status` counts the RAM of a mount of an object once: the copy fetched into a memfd is staged bytes, not also resident bytes.

use std::fs;

use super::servers::Nginx;
use super::{make_tree, mount_url, scene};
use crate::kit::pack_tar;
use crate::memory::{anon_bytes, in_page_cache, memfd_bytes, status_ram};

/// An object fetched into RAM (`--stage copy` of an `http://` URL): the RAM column is
/// what the mount holds, counted from outside (the daemon's private memory, its memfd, the
/// page cache of the mounted files), not the copy twice.
#[test]
fn status_counts_a_remote_copy_once() {
    let (tmp, env) = scene("remote-status");
    let nginx = Nginx::start("status");
    let src = tmp.join("src");
    make_tree(&src);
    pack_tar(&src, &nginx.root.join("data.tar"), &["."]);
    let size = fs::metadata(nginx.root.join("data.tar")).unwrap().len() as i64;
    let mnt = mount_url(&env, &["--stage", "copy"], &nginx.url("data.tar"), &tmp.join("mnt"));
    let pid = mnt.daemon_pids()[0];
    let (ram, staged) = status_ram(mnt.path());
    let held = anon_bytes(pid) as i64 + memfd_bytes(pid) + in_page_cache(mnt.path());
    let shown = format!("status says {ram} B (staged {staged} B), it holds {held} B, object {size} B");
    assert_eq!(staged, size, "{shown}");
    assert!((ram - held).abs() < held / 10 + (16 << 20), "{shown}");
    mnt.unmount().assert_success();
}
