//! An object on an HTTP server mounted by a job on the three-node cluster (.ci/cluster.sh): with `--broadcast` the object crosses the network once per job, without it once per node (never once per task), as nginx's access log counts.

use std::fs;
use std::time::Duration;

use super::servers::Nginx;
use crate::cluster::{run_line, submit_script, Cluster, Work, TASKS_PER_NODE};

/// The host's address on the cluster's bridge (.ci/cluster.sh): every node reaches it.
const BRIDGE: &str = "10.77.0.254";

#[test]
fn cluster_an_object_is_fetched_once_per_job_with_broadcast_and_once_per_node_without() {
    let cluster = Cluster::up();
    let work = Work::new(&cluster, "remote");
    let (tree, tar) = work.archive("remote", 8 << 20);
    let nginx = Nginx::start_on("cluster", BRIDGE, false);
    fs::copy(&tar, nginx.root.join("data.tar")).unwrap();
    let size = fs::metadata(&tar).unwrap().len();
    let url = nginx.url("data.tar");
    // Not loopback from the nodes: plain http needs --allow-http.
    for (name, options, fetches) in [("bcast", "--broadcast --allow-http", 1u64), ("per-node", "--allow-http", 3)] {
        let before = nginx.bytes_sent("/data.tar");
        let env = [("ARCHIVE", url.as_str())];
        let job = submit_script(&cluster, &work, &format!("remote-{name}"), &tree, &run_line(options), &env);
        let state = cluster.wait_end(&job, Duration::from_secs(180));
        assert_eq!(state, "COMPLETED", "{}", job.context());
        let results = job.results();
        assert_eq!(results.len(), 3 * TASKS_PER_NODE, "{}", job.context());
        assert!(results.iter().all(|l| l.contains(" ok ") && l.contains(" daemons=1 ")), "{}", job.context());
        // Each mounter also asks for byte 0 (the version it pins): a few bytes, not a fetch.
        let sent = nginx.bytes_sent("/data.tar") - before;
        assert!(
            sent >= fetches * size && sent < fetches * size + 64,
            "{name}: {sent} bytes sent for a {size}-byte object; want {fetches} fetch(es)\n{}",
            job.context()
        );
        let left = cluster.wait_clean(std::path::Path::new(&url));
        assert!(left.is_empty(), "left behind: {left:#?}\n{}", job.context());
    }
}
