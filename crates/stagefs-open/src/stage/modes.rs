//! What staging is asked for (`--stage`) and what it gave: how an opened archive's bytes reach RAM.

/// Whether to bring the archive into RAM before serving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum StageMode {
    /// Like ram when the archive is on a network or parallel filesystem and fits the RAM budget;
    /// like disk when it does not fit the RAM budget but fits the local disk's free space
    Auto,
    /// The files in the page cache once (read the archive once, keep no second copy), warmed
    /// in the background once mounted; evicted pages are read again from the archive (fail if
    /// it does not fit)
    Ram,
    /// Copy the whole archive into private RAM, in the background once mounted (what is not
    /// copied yet is read from the archive in place): immune to changes of the archive file
    /// once copied, at the cost of that copy on top of the page cache
    Copy,
    /// Copy the archive to the node's local disk (--stage-dir), in the background once
    /// mounted, and serve that copy, with the page cache as its RAM cache; nothing is left on
    /// the disk after any exit
    Disk,
    /// Serve from the archive in place, cold (compressed tars without restart points are
    /// still decompressed into RAM)
    None,
}

/// How the bytes of an opened archive reach RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// Served from the file; pages enter the cache as they are read.
    InPlace,
    /// Served from the file; the warm-up fills the mount's page cache, the one copy in RAM.
    PageCache,
    /// Copied (or decompressed) into private memory.
    Copy,
    /// Copied to a nameless file on the local disk, served from it in place.
    Disk,
    /// The copy in RAM that a daemon of this user serves, mapped (see `share`): no copy of
    /// its own.
    Shared,
}

impl Staging {
    /// Words for `stagefs status`.
    pub fn name(self) -> &'static str {
        match self {
            Staging::InPlace => "in place",
            Staging::PageCache => "ram",
            Staging::Copy => "copy",
            Staging::Disk => "local disk",
            Staging::Shared => "shared",
        }
    }
}
