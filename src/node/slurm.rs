//! Where SLURM says this process sits: its task on the node, its job and step, and the process that lives as long as the job.

/// Where SLURM says this process sits; all `None` outside a job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmTask {
    pub local_id: Option<u32>,
    pub job: Option<String>,
    pub step: Option<String>,
    /// How many tasks of this step run on this node.
    pub local_tasks: Option<u32>,
}

impl SlurmTask {
    /// Reads `SLURM_LOCALID`, `SLURM_JOB_ID`, `SLURM_STEP_ID`, `SLURM_STEP_TASKS_PER_NODE`.
    pub fn from_env() -> SlurmTask {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let node_id: usize = var("SLURM_NODEID").and_then(|v| v.parse().ok()).unwrap_or(0);
        SlurmTask {
            local_id: var("SLURM_LOCALID").and_then(|v| v.parse().ok()),
            job: var("SLURM_JOB_ID"),
            step: var("SLURM_STEP_ID"),
            local_tasks: var("SLURM_STEP_TASKS_PER_NODE").and_then(|v| tasks_on_node(&v, node_id)),
        }
    }

    /// The `slurmstepd` of the job's batch (or interactive) step when this process runs in
    /// it, directly or through scripts: it lives exactly as long as the job. `None` in an
    /// srun step (which may end long before the job), outside SLURM, and where `/proc`
    /// hides other users' processes (then no ancestor is found at all).
    pub fn job_lifetime_process(&self) -> Option<u32> {
        self.job.as_ref()?;
        let mut pid = std::process::id();
        for _ in 0..64 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // pid (comm) state ppid ...: the command name may hold spaces and parentheses.
            let (head, rest) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1;
            if comm == "slurmstepd" {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let cmdline = String::from_utf8_lossy(&cmdline);
                // "slurmstepd: [JOB.batch]": the step after the dot.
                let step = cmdline.split_once('[')?.1.split(']').next()?.rsplit_once('.')?.1.to_string();
                return matches!(step.as_str(), "batch" | "interactive").then_some(pid);
            }
            pid = rest.split_whitespace().nth(1)?.parse().ok()?;
            if pid <= 1 {
                return None;
            }
        }
        None
    }

    /// `job.step`, the tag that tells this step's records from older ones.
    pub(super) fn step_tag(&self) -> Option<String> {
        Some(format!("{}.{}", self.job.as_deref()?, self.step.as_deref().unwrap_or("batch")))
    }
}

/// Decodes SLURM's compressed per-node task counts (`"4(x2),3"`) for node `index`.
fn tasks_on_node(spec: &str, index: usize) -> Option<u32> {
    let mut node = 0usize;
    for part in spec.split(',') {
        let (count, repeat) = match part.split_once("(x") {
            Some((c, r)) => (c.parse().ok()?, r.trim_end_matches(')').parse::<usize>().ok()?),
            None => (part.parse().ok()?, 1),
        };
        if index < node + repeat {
            return Some(count);
        }
        node += repeat;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_counts_decode_per_node() {
        assert_eq!(tasks_on_node("4", 0), Some(4));
        assert_eq!(tasks_on_node("4(x2),3", 1), Some(4));
        assert_eq!(tasks_on_node("4(x2),3", 2), Some(3));
        assert_eq!(tasks_on_node("4(x2),3", 3), None);
        assert_eq!(tasks_on_node("junk", 0), None);
    }
}
