//! `stagefs pack`: GNU tar, bsdtar and Python's tarfile read its archive without a warning and extract the source
//! tree; it is the same bytes whatever the thread count; its saved index serves the first mount; shards keep samples
//! whole; and every failure (a file changing, Ctrl-C, an unwritable or hostile destination) leaves no partial
//! archive behind and says what and where.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::compare::{assert_trees_equal, Options};
use crate::kit::*;

/// `stagefs pack ARGS...`.
pub(crate) fn pack<S: AsRef<OsStr>>(args: &[S]) -> CmdOutput {
    stagefs([OsStr::new("pack")].into_iter().chain(args.iter().map(AsRef::as_ref)))
}

pub(crate) fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

/// A tree with what tar formats make hard: long names (a 150-byte name, a 350-byte path), names that are not UTF-8
/// (short and long), empty files and directories, hard links across directories, symlinks (relative, absolute,
/// dangling), a file large enough to be streamed in chunks, and some ordinary files.
pub(crate) fn hard_tree(root: &Path) {
    let mut rng = Rng::new(27);
    for i in 0..40 {
        write(&root.join(format!("class{}/{i:03}.jpg", i % 4)), &pseudo_random(i as u64, rng.below(50_000) as usize));
    }
    write(&root.join("d".repeat(200)).join("f".repeat(150)), b"long path\n");
    write(&root.join(OsStr::from_bytes(b"caf\xe9.txt")), b"latin-1 name\n");
    let long_binary = [b"\xff".repeat(120), b".bin".to_vec()].concat();
    write(&root.join("bin").join(OsStr::from_bytes(&long_binary)), b"binary long name\n");
    write(&root.join("empty.txt"), b"");
    fs::create_dir_all(root.join("empty-dir/nested-empty")).unwrap();
    write(&root.join("links/original.txt"), b"linked content\n");
    fs::hard_link(root.join("links/original.txt"), root.join("links/second.txt")).unwrap();
    fs::hard_link(root.join("links/original.txt"), root.join("class0/third.txt")).unwrap();
    std::os::unix::fs::symlink("original.txt", root.join("links/rel")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("links/abs")).unwrap();
    std::os::unix::fs::symlink("nowhere", root.join("links/dangling")).unwrap();
    write(&root.join("big/streamed.bin"), &pseudo_random(99, 17 << 20));
    chmod(&root.join("class1"), 0o750);
    chmod(&root.join("class2/002.jpg"), 0o600);
}

/// Compares what a tool extracted (or a mount shows) with the source, mtimes to the second.
pub(crate) fn assert_same_tree(expected: &Path, actual: &Path) {
    assert_trees_equal(expected, actual, &Options::default().nanos(false).xattrs(false));
}

/// Runs a tool that must succeed and say nothing on stderr (no warnings).
fn quiet_tool(tool: &str, args: &[&OsStr]) -> CmdOutput {
    let out = run_tool(tool, args);
    assert!(out.stderr.trim().is_empty(), "{tool} warned:\n{}", out.describe());
    out
}

/// As root: a test's directory and its `src` (not made yet).
fn scene(name: &str) -> (TempDir, PathBuf) {
    require_root();
    let tmp = TempDir::new(name);
    let src = tmp.join("src");
    (tmp, src)
}

#[test]
fn pack_is_read_by_gnu_tar_bsdtar_and_tarfile_and_extracts_to_the_source() {
    let (tmp, src) = scene("pack-tools");
    hard_tree(&src);
    let archive = tmp.join("out.tar");
    pack(&osargs![src, archive]).assert_success().assert_stderr_has(&["packed", "files/s", "1 index saved"]);
    let listing = quiet_tool("tar", &osargs!["-tvf", archive]);
    listing.assert_stdout_has(&[&"f".repeat(150), "links/second.txt link to class0/third.txt"]);
    quiet_tool("bsdtar", &osargs!["-tvf", archive]);

    let gnu = tmp.join("gnu");
    extract_tar(&archive, &gnu);
    assert_same_tree(&src, &gnu);
    run_tool("diff", osargs!["-r", "--no-dereference", src, gnu]);

    let bsd = tmp.join("bsd");
    fs::create_dir_all(&bsd).unwrap();
    quiet_tool("bsdtar", &osargs!["-xpf", archive, "-C", bsd]);
    // bsdtar sets the time of `./` (the directory it extracts into) before filling it.
    assert_trees_equal(&src, &bsd, &Options::default().nanos(false).xattrs(false).root(false));

    let py = tmp.join("py");
    let script = "import os, sys, tarfile, warnings\n\
                  warnings.simplefilter('error')\n\
                  with tarfile.open(sys.argv[1], errorlevel=2) as t:\n\
                  \x20   names = t.getnames()\n\
                  \x20   t.extractall(sys.argv[2], numeric_owner=True, filter='fully_trusted')\n\
                  \x20   for m in t.getmembers():\n\
                  \x20       if m.issym():  # tarfile leaves a symlink's own time unset\n\
                  \x20           p = sys.argv[2] + '/' + m.name\n\
                  \x20           os.utime(p, (m.mtime, m.mtime), follow_symlinks=False)\n\
                  print(len(names))\n";
    let out = quiet_tool("python3", &osargs!["-c", script, archive, py]);
    assert!(out.stdout.trim().parse::<usize>().unwrap() > 50, "{}", out.describe());
    assert_same_tree(&src, &py);
}

#[test]
fn the_same_tree_gives_the_same_bytes_whatever_the_thread_count() {
    let (tmp, src) = scene("pack-determinism");
    hard_tree(&src);
    let mut first = None;
    for (i, threads) in ["1", "3", "64", "64"].into_iter().enumerate() {
        let archive = tmp.join(format!("out-{i}.tar"));
        pack(&osargs!["--threads", threads, src, archive]).assert_success();
        let bytes = read(&archive);
        let first = first.get_or_insert_with(|| bytes.clone());
        assert!(&bytes == first, "pack {i} differs from pack 0 (sizes {} and {})", bytes.len(), first.len());
    }
}

#[test]
fn the_first_mount_of_a_fresh_pack_uses_its_saved_index() {
    let (tmp, src) = scene("pack-index");
    hard_tree(&src);
    let archive = tmp.join("data.tar");
    pack(&osargs![src, archive]).assert_success();
    let index = tmp.join("data.tar.stagefs-index");
    assert!(index.is_file(), "the index is saved beside the archive");
    let mp = tmp.join("mnt");
    let fg = Foreground::start(&archive, &mp, &tmp.join("mount.log"), &[]);
    assert_same_tree(&src, &mp);
    let log = fg.finish();
    assert!(log.contains("using saved index") && log.contains(&*index.to_string_lossy()), "{log}");
    assert!(!log.contains("indexed") && !log.contains("ignoring saved index"), "no scan at the first mount:\n{log}");
}

/// WebDataset-style samples: `NNNN.jpg` and `NNNN.cls` of one directory.
fn samples(root: &Path, count: usize) {
    for i in 0..count {
        let len = 20_000 + (i * 7919) % 30_000;
        write(&root.join(format!("part{}/{i:04}.jpg", i % 2)), &pseudo_random(i as u64, len));
        write(&root.join(format!("part{}/{i:04}.cls", i % 2)), format!("{}\n", i % 10).as_bytes());
    }
}

#[test]
fn shards_keep_samples_whole_carry_their_index_and_mount_as_one_tree() {
    let (tmp, src) = scene("pack-shards");
    samples(&src, 120);
    let out = tmp.join("shards/train.tar");
    fs::create_dir_all(out.parent().unwrap()).unwrap();
    pack(&osargs!["--shard-size", "500K", src, out]).assert_success().assert_stderr_has(&["train-*.tar"]);
    let shards: Vec<PathBuf> =
        (0..100).map(|n| tmp.join(format!("shards/train-{n:06}.tar"))).take_while(|p| p.is_file()).collect();
    assert!(shards.len() >= 4, "3.6 MB in 500 KiB shards: {} shards", shards.len());
    let mut seen = std::collections::BTreeMap::new();
    for (n, shard) in shards.iter().enumerate() {
        assert!(PathBuf::from(format!("{}.stagefs-index", shard.display())).is_file(), "shard {n} has its index");
        assert!(fs::metadata(shard).unwrap().len() <= 600 << 10, "shard {n} is about the size asked");
        let listing = quiet_tool("tar", &osargs!["-tf", shard]);
        for name in listing.stdout.lines().filter(|l| l.ends_with(".jpg") || l.ends_with(".cls")) {
            assert!(seen.insert(name.to_string(), n).is_none(), "{name} is in two shards");
            let (stem, ext) = name.rsplit_once('.').unwrap();
            let other = format!("{stem}.{}", if ext == "jpg" { "cls" } else { "jpg" });
            assert!(listing.stdout.lines().any(|l| l == other), "{name} and {other} are in one shard (shard {n})");
        }
    }
    assert_eq!(seen.len(), 240, "every file is in one shard");
    let pattern = tmp.join("shards/train-*.tar");
    let mp = tmp.join("mnt");
    let (_mounted, out) = StagefsCmd::new(osargs!["mount", pattern, mp]).mounts(&pattern, &mp);
    out.assert_stderr_has(&[&format!("({n} of {n} from saved indexes)", n = shards.len())]);
    assert_same_tree(&src, &mp);
}

#[test]
fn exclude_and_files_from_choose_what_is_packed() {
    let (tmp, src) = scene("pack-select");
    for name in ["keep/a.jpg", "keep/b.tmp", "keep/cache/c.jpg", "other/d.jpg", "other/e.jpg", "top.txt"] {
        write(&src.join(name), name.as_bytes());
    }
    let list = |archive: &Path| {
        quiet_tool("tar", &osargs!["-tf", archive]).stdout.lines().map(String::from).collect::<Vec<_>>()
    };
    let excluded = tmp.join("excluded.tar");
    pack(&osargs!["--exclude", "*.tmp", "--exclude", "cache", "--exclude", "other/e.jpg", src, excluded])
        .assert_success();
    assert_eq!(list(&excluded), ["./", "keep/", "keep/a.jpg", "other/", "other/d.jpg", "top.txt"]);

    let listed = tmp.join("list.txt");
    fs::write(&listed, "top.txt\n./other/\n\nkeep/cache/c.jpg\n").unwrap();
    let chosen = tmp.join("chosen.tar");
    pack(&osargs!["--files-from", listed, src, chosen]).assert_success();
    assert_eq!(list(&chosen), ["./", "keep/cache/c.jpg", "other/", "other/d.jpg", "other/e.jpg", "top.txt"]);
    // The directories a listed file implies are served by a mount all the same.
    let mounted = Mounted::new(&chosen, &tmp.join("mnt"));
    assert_eq!(read(&mounted.path().join("keep/cache/c.jpg")), b"keep/cache/c.jpg");
    // Each list (None: one that cannot be read), the exit code and what stderr says.
    for (list, code, said) in [
        (Some("/etc/passwd\n"), 2, &["line 1", "absolute path"][..]),
        (Some("keep/../../etc/passwd\n"), 2, &["line 1", "'..'"]),
        (None, 2, &["--files-from", "no-such-list.txt", "cannot read it"]),
        (Some("keep/missing.jpg\n"), 1, &["keep/missing.jpg", "No such file"]),
    ] {
        let from = list.map_or(tmp.join("no-such-list.txt"), |text| {
            fs::write(&listed, text).unwrap();
            listed.clone()
        });
        pack(&osargs!["--files-from", from, src, chosen]).assert_code(code).assert_stderr_has(said);
    }
}

#[test]
fn fifos_are_kept_and_sockets_skipped_with_a_warning() {
    let (tmp, src) = scene("pack-special");
    write(&src.join("f.txt"), b"x");
    run_tool("mkfifo", [src.join("fifo")]);
    let _socket = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();
    let archive = tmp.join("out.tar");
    pack(&osargs![src, archive]).assert_success().assert_stderr_has(&["sock: socket ignored"]);
    let listing = quiet_tool("tar", &osargs!["-tvf", archive]);
    assert!(listing.stdout.lines().any(|l| l.starts_with('p') && l.ends_with(" fifo")), "{}", listing.stdout);
    assert!(!listing.stdout.contains("sock"), "{}", listing.stdout);
}

/// Files in `dir` other than `keep`: a failed pack must leave nothing, temp files included.
fn leftovers(dir: &Path, keep: &[&str]) -> Vec<String> {
    let names = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned());
    names.filter(|n| !keep.contains(&n.as_str())).collect()
}

#[test]
fn a_file_that_keeps_changing_fails_the_pack_by_name_and_leaves_nothing() {
    let (tmp, src) = scene("pack-changing");
    write(&src.join("a/steady.txt"), b"steady");
    let growing = src.join("a/growing.log");
    write(&growing, &pseudo_random(5, 40 << 20));
    let out_dir = tmp.join("out");
    fs::create_dir_all(&out_dir).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let out = std::thread::scope(|scope| {
        scope.spawn(|| {
            use std::io::Write;
            let mut file = fs::OpenOptions::new().append(true).open(&growing).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                file.write_all(b"another line\n").unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let out = pack(&osargs![src, out_dir.join("out.tar")]);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    });
    out.assert_code(1).assert_stderr_has(&["growing.log changed while it was read, twice", "torn copy"]);
    assert_eq!(leftovers(&out_dir, &[]), Vec::<String>::new());
}

#[test]
fn ctrl_c_or_sigterm_while_packing_leaves_no_partial_archive() {
    let (tmp, src) = scene("pack-signals");
    samples(&src, 50);
    for (sig, code) in [(Signal::SIGINT, 130), (Signal::SIGTERM, 143)] {
        let name = sig.as_str();
        let out_dir = tmp.join(format!("out-{name}"));
        fs::create_dir_all(&out_dir).unwrap();
        let log = tmp.join(format!("pack-{name}.log"));
        let cmd = StagefsCmd::new(osargs!["-v", "pack", src, out_dir.join("out.tar")]);
        let mut child = cmd.env("STAGEFS_TEST_HOLD_PHASE", "packing").spawn_to(fs::File::create(&log).unwrap());
        let held = wait_until(Duration::from_secs(30), || fs::read_to_string(&log).unwrap().contains("phase: packing"));
        assert!(held, "the pack reached its first member; log:\n{}", fs::read_to_string(&log).unwrap());
        assert_eq!(leftovers(&out_dir, &[]).len(), 1, "the temp file exists while packing");
        signal(child.id() as i32, sig).expect("signal the pack");
        let status = wait_timeout(&mut child.0, Duration::from_secs(30)).expect("pack stops at the signal");
        let log = fs::read_to_string(&log).unwrap();
        assert_eq!(status.code(), Some(code), "{log}");
        assert!(log.contains(&format!("interrupted by {name}; the partial archive was removed")), "{log}");
        assert_eq!(leftovers(&out_dir, &[]), Vec::<String>::new(), "{log}");
    }
}

/// Shards left by an earlier, larger pack would join a mount of the pattern: pack says so.
#[test]
fn stale_shards_of_an_earlier_pack_are_pointed_out() {
    let (tmp, _) = scene("pack-stale");
    let (big, small) = (tmp.join("big"), tmp.join("small"));
    samples(&big, 60);
    samples(&small, 4);
    let out = tmp.join("set.tar");
    let args = |src: &Path| osargs!["--shard-size", "200K", src, out].map(OsString::from);
    pack(&args(&big)).assert_success();
    assert!(tmp.join("set-000003.tar").is_file());
    let again = pack(&args(&small));
    again.assert_success().assert_stderr_has(&["set-000001.tar to", "left from an earlier pack", "remove them"]);
}

#[test]
fn missing_or_wrong_paths_are_clear_errors() {
    let (tmp, src) = scene("pack-errors");
    write(&src.join("f"), b"f");
    // OUT's missing directories are made; a file where one should be is a clear error.
    pack(&osargs![src, tmp.join("no-dir/x.tar")]).assert_success();
    assert!(tmp.join("no-dir/x.tar").exists());
    fs::write(tmp.join("a-file"), b"x").unwrap();
    let x = tmp.join("x.tar");
    for (args, said) in [
        (&osargs![tmp.join("no-such-dir"), x][..], &["cannot pack", "no-such-dir", "No such file"][..]),
        (&osargs![src.join("f"), x], &["is not a directory"]),
        (&osargs![src, tmp.path()], &["is a directory; name the archive"]),
        (&osargs![src, tmp.join("a-file/x.tar")], &["cannot make the directory of", "a-file", "not a directory"]),
        (&osargs!["--exclude", "[z-a", src, x], &["--exclude", "not a valid pattern"]),
    ] {
        pack(args).assert_code(2).assert_stderr_has(said);
    }
    assert!(!x.exists());
    // More threads than the open-files limit allows: capped, with a warning.
    let script = "ulimit -n 100 && exec \"$0\" pack --threads 500 \"$1\" \"$2\"";
    let out = run_tool("sh", osargs!["-c", script, stagefs_bin(), src, x]);
    out.assert_stderr_has(&["--threads 500", "ulimit -n", "18 readers"]);
}

/// `bytes` written to `path`, owned by `user`.
fn write_as(user: &User, path: &Path, bytes: &[u8]) {
    write(path, bytes);
    user.chown(path);
}

#[test]
fn as_a_user_an_unwritable_destination_or_unreadable_file_is_a_clear_error() {
    let (t, root) = (two_users("pack-user-errors"), User::get("root"));
    let (alice, src) = (&t.alice, t.dir("src", 0o755, &t.alice));
    write_as(alice, &src.join("ok.txt"), b"ok");
    write_as(alice, &src.join("secret.txt"), b"secret");
    let out = alice.stagefs(osargs!["pack", src, t.dir("root-only", 0o755, &root).join("x.tar")]);
    out.assert_code(1).assert_stderr_has(&["cannot create a temporary file in", "root-only", "Permission denied"]);

    chmod(&src.join("secret.txt"), 0o000);
    let out_dir = t.dir("out", 0o755, alice);
    let out = alice.stagefs(osargs!["pack", src, out_dir.join("x.tar")]);
    out.assert_code(1).assert_stderr_has(&["cannot read", "secret.txt", "Permission denied"]);
    assert_eq!(leftovers(&out_dir, &[]), Vec::<String>::new());
}

/// On a login node `/tmp` is shared: another user may plant a symlink where the archive is
/// to go. pack never writes through it, and says why it cannot replace it.
#[test]
fn a_symlink_planted_at_out_by_another_user_is_never_followed() {
    let (t, root) = (two_users("pack-hostile"), User::get("root"));
    let (alice, src) = (&t.alice, t.dir("src", 0o755, &t.alice));
    write_as(alice, &src.join("data.txt"), b"dataset");
    let victim = t.dir("alice-home", 0o700, alice).join("thesis.txt");
    write_as(alice, &victim, b"years of work");
    let shared = t.dir("shared", 0o1777, &root);
    let out_path = shared.join("data.tar");
    t.eve.sh(&format!("ln -s {} {}", victim.display(), out_path.display()));

    let out = alice.stagefs(osargs!["pack", src, out_path]);
    out.assert_code(1).assert_stderr_has(&["data.tar", "cannot rename", "another user"]);
    assert_eq!(read(&victim), b"years of work", "the symlink's target is untouched");
    assert!(fs::symlink_metadata(&out_path).unwrap().file_type().is_symlink(), "eve's link is still eve's");
    assert_eq!(leftovers(&shared, &["data.tar"]), Vec::<String>::new(), "no temp file left in the shared dir");
}

#[test]
fn normalize_stores_owner_zero_without_names_and_modes_readable_by_all() {
    let (tmp, src) = scene("pack-normalize");
    write(&src.join("d/private.txt"), b"p");
    write(&src.join("d/tool.sh"), b"#!/bin/sh\n");
    for (path, mode) in [("d/private.txt", 0o600), ("d/tool.sh", 0o700), ("d", 0o700)] {
        chmod(&src.join(path), mode);
        std::os::unix::fs::chown(src.join(path), Some(1234), Some(5678)).unwrap();
    }
    let (normalized, plain) = (tmp.join("out.tar"), tmp.join("plain.tar"));
    pack(&osargs!["--normalize", src, normalized]).assert_success();
    pack(&osargs![src, plain]).assert_success();
    let listed = |archive: &Path, start: &str, name: &str| {
        let listing = quiet_tool("tar", &osargs!["-tvf", archive]).stdout;
        assert!(listing.lines().any(|l| l.starts_with(start) && l.ends_with(name)), "no {start}{name}:\n{listing}");
    };
    listed(&normalized, "drwxr-xr-x 0/0 ", " d/");
    listed(&normalized, "-rw-r--r-- 0/0 ", "d/private.txt");
    listed(&normalized, "-rwxr-xr-x 0/0 ", "d/tool.sh");
    listed(&plain, "-rw------- 1234/5678 ", "d/private.txt");
}

/// A file of `size` bytes with `data` written at each offset, holes elsewhere.
fn sparse_file(path: &Path, size: u64, data: &[(u64, &[u8])]) {
    use std::os::unix::fs::FileExt;
    let file = fs::File::create(path).unwrap();
    file.set_len(size).unwrap();
    for (offset, bytes) in data {
        file.write_all_at(bytes, *offset).unwrap();
    }
}

/// Sparse files are stored without their holes (pax 1.0, as `tar --sparse --format=posix`
/// writes them): GNU tar, bsdtar, tarfile and a mount all give back the same bytes.
#[test]
fn sparse_files_are_stored_without_their_holes_and_read_back_whole() {
    let (tmp, src) = scene("pack-sparse");
    fs::create_dir_all(src.join("d")).unwrap();
    let block = pseudo_random(7, 8192);
    sparse_file(&src.join("d/middle.img"), 300 << 20, &[(100 << 20, &block), (200 << 20, &block)]);
    sparse_file(&src.join("d/ends-with-data.img"), 64 << 20, &[(0, &block), ((64 << 20) - 8192, &block)]);
    sparse_file(&src.join("d/all-hole.img"), 50 << 20, &[]);
    write(&src.join("d/dense.txt"), b"dense");
    let archive = tmp.join("out.tar");
    pack(&osargs![src, archive]).assert_success();
    assert!(fs::metadata(&archive).unwrap().len() < 1 << 20, "holes are not stored");
    quiet_tool("tar", &osargs!["-tvf", archive]);
    quiet_tool("bsdtar", &osargs!["-tvf", archive]);
    let same = |dir: &str, how: &str| {
        for name in ["d/middle.img", "d/ends-with-data.img", "d/all-hole.img", "d/dense.txt"] {
            let out = run_cmd(Command::new("cmp").arg(src.join(name)).arg(tmp.join(dir).join(name)), CMD_TIMEOUT);
            assert!(out.success(), "{how}: {name} differs\n{}", out.describe());
        }
    };
    extract_tar(&archive, &tmp.join("gnu"));
    same("gnu", "GNU tar");
    fs::create_dir_all(tmp.join("bsd")).unwrap();
    quiet_tool("bsdtar", &osargs!["-xf", archive, "-C", tmp.join("bsd")]);
    same("bsd", "bsdtar");
    let script =
        "import sys, tarfile\nwith tarfile.open(sys.argv[1]) as t:\n    t.extractall(sys.argv[2], filter='tar')\n";
    quiet_tool("python3", &osargs!["-c", script, archive, tmp.join("py")]);
    same("py", "tarfile");
    let fg = Foreground::start(&archive, &tmp.join("mnt"), &tmp.join("mount.log"), &[]);
    same("mnt", "stagefs mount");
    let log = fg.finish();
    assert!(log.contains("using saved index"), "{log}");
}

/// On a terminal (`script` gives pack a pty) a progress bar shows files/s, MB/s and an
/// ETA; on a pipe only the one-line summary is printed.
#[test]
fn a_progress_bar_on_a_terminal_and_a_summary_line_always() {
    let (tmp, src) = scene("pack-progress");
    samples(&src, 20);
    let archive = tmp.join("out.tar");
    let line = format!("{} pack {} {}", stagefs_bin().display(), src.display(), archive.display());
    let terminal = run_tool("script", osargs!["-qec", &line, "/dev/null"]);
    terminal.assert_stdout_has(&["packing 0/", "files/s", "/s eta", "packed 40 files"]);
    let out = pack(&osargs![src, archive]);
    out.assert_success().assert_stderr_lacks(&["eta"]).assert_stderr_has(&["packed 40 files", "MB/s"]);
    assert_eq!(out.stderr.lines().count(), 1, "one summary line:\n{}", out.describe());
}
