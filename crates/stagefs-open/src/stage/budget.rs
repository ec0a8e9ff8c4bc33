//! The RAM budget (`--max-ram`, MemAvailable, the job's cgroup) and the facts of where an archive lies.

use std::path::{Path, PathBuf};

use super::error::StageError;

/// RAM still free to fill once `staged` bytes are staged, and what limits it: the same
/// limits as staging, with `--max-ram` covering the staged copy and the page-cache warm-up.
pub fn headroom(max_ram: Option<u64>, staged: u64) -> (u64, String) {
    let budget = RamBudget::measure(max_ram.map(|max| max.saturating_sub(staged)));
    (budget.bytes, budget.reason)
}

/// [`headroom`] while `pending` bytes of a staged copy are still to come into RAM (the
/// copy is made in the background): the memory limits will have that much less, while
/// `--max-ram` already counts them in `staged`.
pub fn headroom_while_staging(max_ram: Option<u64>, staged: u64, pending: u64) -> (u64, String) {
    let system = RamBudget::measure(None);
    let limits = [
        Some((system.bytes.saturating_sub(pending), format!("{} and the copy still to stage", system.reason))),
        max_ram.map(|max| (max.saturating_sub(staged), "--max-ram".to_string())),
    ];
    limits.into_iter().flatten().min_by_key(|(b, _)| *b).expect("at least one limit")
}

/// How many bytes may be staged, and why that number.
#[derive(Debug)]
pub struct RamBudget {
    pub bytes: u64,
    pub reason: String,
}

impl RamBudget {
    /// The smallest of `--max-ram`, MemAvailable and the cgroup's headroom, the last two
    /// less a margin (512 MiB + 5 % of the total they come from).
    pub fn measure(max_ram: Option<u64>) -> RamBudget {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |key: &str| -> Option<u64> {
            let line = meminfo.lines().find(|l| l.starts_with(key))?;
            Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
        };
        // Each limit keeps a margin scaled to its own size, so training still has room.
        let margin = |total: u64| (512 << 20) + total / 20;
        let total = field("MemTotal:").unwrap_or(0);
        let available = field("MemAvailable:").unwrap_or(0).saturating_sub(margin(total));
        let mut limits = vec![(available, "MemAvailable less a margin".to_string())];
        if let Some((max, used)) = cgroup_limit() {
            limits.push((
                max.saturating_sub(used).saturating_sub(margin(max)),
                "the job's cgroup memory limit less a margin".to_string(),
            ));
        }
        if let Some(max) = max_ram {
            limits.push((max, "--max-ram".to_string()));
        }
        let (bytes, reason) = limits.into_iter().min_by_key(|(b, _)| *b).expect("at least one limit");
        RamBudget { bytes, reason }
    }

    pub fn check(&self, path: &Path, needed: u64) -> Result<(), StageError> {
        if needed > self.bytes {
            return Err(StageError::NoRoom {
                path: path.to_owned(),
                needed,
                budget: self.bytes,
                budget_reason: self.reason.clone(),
            });
        }
        Ok(())
    }
}

/// This process's cgroup memory limit and usage, if it has a limit: cgroup v2
/// (`memory.max`) or v1 (`memory.limit_in_bytes`, still common on SLURM clusters).
fn cgroup_limit() -> Option<(u64, u64)> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |path: PathBuf| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    for line in cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(rel)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let rel = rel.trim_start_matches('/');
        let (dir, limit, usage) = match controllers {
            "" => (Path::new("/sys/fs/cgroup").join(rel), "memory.max", "memory.current"),
            c if c.split(',').any(|c| c == "memory") => {
                (Path::new("/sys/fs/cgroup/memory").join(rel), "memory.limit_in_bytes", "memory.usage_in_bytes")
            }
            _ => continue,
        };
        // "max" (v2) does not parse, and v1 reports "no limit" as a huge number: both mean none.
        if let (Some(max), Some(used)) = (read(dir.join(limit)), read(dir.join(usage))) {
            if max < 1 << 60 {
                return Some((max, used));
            }
        }
    }
    None
}

/// Network and parallel filesystems, where staging pays off (statfs magic numbers).
pub fn is_network_filesystem(file: &std::fs::File) -> bool {
    const REMOTE: &[i64] = &[
        0x6969,     // NFS
        0x0BD00BD0, // Lustre
        0x47504653, // GPFS / Spectrum Scale
        0xFF534D42, // CIFS
        0xFE534D42, // SMB2
        0x19830326, // BeeGFS
        0x00C36400, // CephFS
        0x20030528, // OrangeFS
        0x5346414F, // AFS
        0x65735546, // FUSE (sshfs, s3fs, ...)
    ];
    // f_type is i64 on x86-64 but narrower on some targets.
    #[allow(clippy::unnecessary_cast)]
    let remote = rustix::fs::fstatfs(file).is_ok_and(|s| REMOTE.contains(&(s.f_type as i64)));
    remote
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_refuses_before_copying() {
        let budget = RamBudget { bytes: 100, reason: "--max-ram".into() };
        let err = budget.check(Path::new("/x.tar"), 1000).unwrap_err().to_string();
        assert!(err.contains("needs 1000 B") && err.contains("budget is 100 B") && err.contains("--max-ram"), "{err}");
        assert!(RamBudget::measure(Some(5)).bytes <= 5);
    }
}
