//! One path to archive, as the walk found it, with the shard it goes to and the earlier member it links to.

use super::walk::Stat;

/// One path to archive, in archive order.
#[derive(Clone, Debug)]
pub struct Member {
    /// Relative to DIR, no trailing `/`; `""` is DIR itself.
    pub path: Vec<u8>,
    pub stat: Stat,
    pub shard: u32,
    /// A hard link to this earlier member of the same shard.
    pub link_to: Option<usize>,
}

impl Member {
    /// Whether a reader opens it: symlinks and non-empty regular files, hard links aside.
    pub(super) fn needs_read(&self) -> bool {
        self.link_to.is_none()
            && match self.stat.file_type() {
                libc::S_IFLNK => true,
                libc::S_IFREG => self.stat.size > 0,
                _ => false,
            }
    }
}
