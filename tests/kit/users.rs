//! Second real users made with `useradd`, and running commands as them.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

/// An ordinary (non-root) user made for the tests with `useradd`, with a home directory.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

impl User {
    /// The user `name`, created (with a home and a group of its own) if missing.
    pub fn get(name: &str) -> User {
        static USERADD: std::sync::Mutex<()> = std::sync::Mutex::new(());
        require_root();
        let _serial = USERADD.lock().unwrap_or_else(|e| e.into_inner());
        // Distributions make /dev/fuse usable by everyone (0666); a bare VM may not.
        let fuse = fs::metadata("/dev/fuse").expect("/dev/fuse").mode();
        if fuse & 0o006 != 0o006 {
            fs::set_permissions("/dev/fuse", std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        }
        if nix::unistd::User::from_name(name).unwrap().is_none() {
            let useradd = require_tool("useradd");
            let out = run_cmd(
                Command::new(useradd).args(["--create-home", "--user-group", "--shell", "/bin/sh", name]),
                CMD_TIMEOUT,
            );
            out.assert_success();
        }
        let entry = nix::unistd::User::from_name(name).unwrap().expect("the user exists now");
        User { name: name.into(), uid: entry.uid.as_raw(), gid: entry.gid.as_raw(), home: entry.dir }
    }

    /// `program args...` run as this user with a login-like environment (HOME, USER, a plain
    /// PATH; no XDG_RUNTIME_DIR, as in a SLURM batch step), `env` added.
    pub fn command(&self, env: &[(&str, &str)], program: &Path) -> Command {
        let mut cmd = Command::new(require_tool("setpriv"));
        cmd.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--init-groups")
            .arg("--reset-env")
            .arg("--")
            .arg("env");
        for (k, v) in env {
            cmd.arg(format!("{k}={v}"));
        }
        cmd.arg(program);
        cmd
    }

    /// `stagefs ARGS...` as this user.
    pub fn stagefs<I, S>(&self, args: I) -> CmdOutput
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.stagefs_cmd(&[], args).run()
    }

    /// `stagefs ARGS...` as this user with `env` added, to run or spawn.
    pub fn stagefs_cmd<I, S>(&self, env: &[(&str, &str)], args: I) -> StagefsCmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command(env, &stagefs_bin());
        cmd.args(args);
        StagefsCmd(cmd)
    }

    /// A shell command as this user; panics unless it succeeds.
    pub fn sh(&self, script: &str) -> CmdOutput {
        let out = self.try_sh(script);
        out.assert_success();
        out
    }

    /// A shell command as this user.
    pub fn try_sh(&self, script: &str) -> CmdOutput {
        let mut cmd = self.command(&[], Path::new("/bin/sh"));
        cmd.arg("-c").arg(script);
        run_cmd(&mut cmd, CMD_TIMEOUT)
    }

    /// Gives `path` to this user.
    pub fn chown(&self, path: &Path) {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid)).unwrap();
    }

    /// This user's private runtime directory when XDG_RUNTIME_DIR is unset.
    pub fn tmp_runtime_dir(&self) -> PathBuf {
        PathBuf::from(format!("/tmp/stagefs-{}", self.uid))
    }

    /// `~/NAME` as a mountpoint, rid of whatever an earlier run left there.
    pub fn fresh_mountpoint(&self, name: &str) -> PathBuf {
        let mnt = self.home.join(name);
        remove_tree(&mnt);
        mnt
    }

    /// `stagefs mount EXTRA... ARCHIVE MNT` as this user.
    pub fn mount<S: AsRef<OsStr>>(&self, extra: &[S], archive: &Path, mnt: &Path) -> CmdOutput {
        let args = extra.iter().map(AsRef::as_ref).chain([archive.as_os_str(), mnt.as_os_str()]);
        self.stagefs([OsStr::new("mount")].into_iter().chain(args))
    }

    /// `stagefs umount MNT` as this user, which must succeed.
    pub fn umount(&self, mnt: &Path) {
        self.stagefs([OsStr::new("umount"), mnt.as_os_str()]).assert_success();
    }

    /// The file stagefs derives from `mountpoint` in this user's runtime directory when
    /// XDG_RUNTIME_DIR is unset (`HASH.EXTENSION`, as another user can compute it).
    pub fn runtime_file(&self, mountpoint: &Path, extension: &str) -> PathBuf {
        let hash = stagefs_archive::hash::hash(mountpoint.as_os_str().as_encoded_bytes());
        self.tmp_runtime_dir().join(format!("{hash:016x}.{extension}"))
    }

    /// A shell command started as this user, killed on drop.
    pub fn spawn_sh(&self, script: &str) -> KillOnDrop {
        KillOnDrop(self.command(&[], Path::new("/bin/sh")).arg("-c").arg(script).spawn().unwrap())
    }
}

pub fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A tar at `archive` holding `files` (path, bytes), made by GNU tar, owned by `owner`.
pub fn tar_of(owner: &User, archive: &Path, files: &[(&str, &[u8])]) {
    Scene::new("tar-of").files(files.iter().copied()).tar_listed_at(archive);
    owner.chown(archive);
}

/// Two users, alice (who runs stagefs) and eve (another user of the node), and a directory both can reach.
pub struct TwoUsers {
    pub alice: User,
    pub eve: User,
    pub tmp: TempDir,
}

pub fn two_users(name: &str) -> TwoUsers {
    let (alice, eve) = (User::get("sfs-alice"), User::get("sfs-eve"));
    let tmp = TempDir::new(name);
    chmod(tmp.path(), 0o755);
    TwoUsers { alice, eve, tmp }
}

impl TwoUsers {
    /// A directory of `mode` in the scene, owned by `owner`.
    pub fn dir(&self, name: &str, mode: u32, owner: &User) -> PathBuf {
        let dir = self.tmp.join(name);
        fs::create_dir_all(&dir).unwrap();
        owner.chown(&dir);
        chmod(&dir, mode);
        dir
    }

    pub fn mountpoint(&self, name: &str) -> PathBuf {
        self.alice.fresh_mountpoint(name)
    }

    pub fn alice_stagefs(&self, args: &[&OsStr]) -> CmdOutput {
        self.alice.stagefs(args)
    }

    pub fn cat(&self, path: &Path) -> CmdOutput {
        self.alice.try_sh(&format!("cat '{}'", path.display()))
    }

    pub fn umount(&self, mnt: &Path) {
        self.alice.umount(mnt);
        assert_nothing_left(mnt, "after the test's mount");
    }
}

/// This process's effective uid.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// `bytes` as the file `path` (replacing whatever is there), of `owner` and `mode`: a planted file.
pub fn plant(path: &Path, bytes: &[u8], owner: &User, mode: u32) {
    let _ = fs::remove_file(path);
    fs::write(path, bytes).unwrap();
    owner.chown(path);
    chmod(path, mode);
}

/// `text`'s lines, sorted.
pub fn sorted_lines(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines
}
