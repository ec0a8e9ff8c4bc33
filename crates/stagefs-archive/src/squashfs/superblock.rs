//! The 96-byte SquashFS 4.0 superblock: parsed, then checked against the image size.

use crate::codec::Compression;
use crate::fault::Fault;

pub(super) const SUPERBLOCK_LEN: usize = 96;
const MAGIC: &[u8; 4] = b"hsqs";
/// Marks an optional table (xattrs, export, fragments) as absent.
pub(super) const ABSENT: u64 = u64::MAX;

const FLAG_NO_XATTRS: u16 = 0x0200;

#[derive(Clone, Copy, Debug)]
pub(super) struct Superblock {
    pub(super) block_size: u32,
    pub(super) block_log: u16,
    pub(super) fragment_count: u32,
    pub(super) compressor: Compression,
    pub(super) flags: u16,
    pub(super) id_count: u16,
    pub(super) root_inode: u64,
    /// End of the image proper; anything after it is padding.
    pub(super) bytes_used: u64,
    pub(super) id_table: u64,
    pub(super) xattr_id_table: u64,
    pub(super) inode_table: u64,
    pub(super) directory_table: u64,
    pub(super) fragment_table: u64,
}

impl Superblock {
    /// Parses the superblock at the start of `image` and checks it against the image's length.
    pub(super) fn parse(image: &[u8]) -> Result<Superblock, Fault> {
        let raw = image.get(..SUPERBLOCK_LEN).ok_or_else(|| {
            Fault::truncated(0, format!("superblock needs {SUPERBLOCK_LEN} bytes, image has {}", image.len()))
        })?;
        let u16_at = |at: usize| u16::from_le_bytes([raw[at], raw[at + 1]]);
        let u32_at = |at: usize| u32::from_le_bytes(raw[at..at + 4].try_into().unwrap_or_default());
        let u64_at = |at: usize| u64::from_le_bytes(raw[at..at + 8].try_into().unwrap_or_default());
        if &raw[..4] != MAGIC {
            return Err(Fault::corrupt(0, format!("magic {:02x?}, expected \"hsqs\"", &raw[..4])));
        }
        let (major, minor) = (u16_at(28), u16_at(30));
        if (major, minor) != (4, 0) {
            return Err(Fault::corrupt(
                28,
                format!("SquashFS version {major}.{minor}, expected 4.0 (rebuild the image with mksquashfs 4.x)"),
            ));
        }
        let id = u16_at(20);
        let compressor = Compression::of_squashfs_id(id).ok_or_else(|| {
            Fault::unsupported(format!(
                "unknown SquashFS compressor id {id} (known: 1 gzip, 2 lzma, 3 lzo, 4 xz, 5 lz4, 6 zstd)"
            ))
        })?;
        let sb = Superblock {
            block_size: u32_at(12),
            block_log: u16_at(22),
            fragment_count: u32_at(16),
            compressor,
            flags: u16_at(24),
            id_count: u16_at(26),
            root_inode: u64_at(32),
            bytes_used: u64_at(40),
            id_table: u64_at(48),
            xattr_id_table: u64_at(56),
            inode_table: u64_at(64),
            directory_table: u64_at(72),
            fragment_table: u64_at(80),
        };
        sb.check(image.len() as u64)?;
        Ok(sb)
    }

    fn check(&self, image_len: u64) -> Result<(), Fault> {
        let bs = self.block_size;
        if !bs.is_power_of_two() || !(4096..=1 << 20).contains(&bs) {
            return Err(Fault::corrupt(12, format!("block size {bs}, expected a power of two from 4096 to 1048576")));
        }
        if u32::from(self.block_log) != bs.trailing_zeros() {
            return Err(Fault::corrupt(22, format!("block log {} does not match block size {bs}", self.block_log)));
        }
        if self.bytes_used > image_len {
            return Err(Fault::truncated(
                image_len,
                format!("superblock says the image is {} bytes, the file has {image_len}", self.bytes_used),
            ));
        }
        if self.bytes_used < SUPERBLOCK_LEN as u64 {
            return Err(Fault::corrupt(40, format!("bytes used {} is smaller than the superblock", self.bytes_used)));
        }
        // Every table in use must start inside the image.
        let tables = [
            ("id table", 48, self.id_table, true),
            ("xattr id table", 56, self.xattr_id_table, self.xattr_id_table != ABSENT),
            ("inode table", 64, self.inode_table, true),
            ("directory table", 72, self.directory_table, true),
            // Without fragments the field is unused, and writers differ in what they put there.
            ("fragment table", 80, self.fragment_table, self.fragment_count > 0),
        ];
        for (name, field, start, used) in tables {
            if !used {
                continue;
            }
            if start < SUPERBLOCK_LEN as u64 || start >= self.bytes_used {
                return Err(Fault::corrupt(
                    field,
                    format!("{name} starts at {start}, expected inside the image (96..{})", self.bytes_used),
                ));
            }
        }
        if self.inode_table >= self.directory_table {
            return Err(Fault::corrupt(
                64,
                format!(
                    "inode table at {} does not precede directory table at {}",
                    self.inode_table, self.directory_table
                ),
            ));
        }
        if self.id_count == 0 {
            return Err(Fault::corrupt(26, "id count is 0, expected at least one uid/gid".into()));
        }
        Ok(())
    }

    pub(super) fn has_xattrs(&self) -> bool {
        self.xattr_id_table != ABSENT && self.flags & FLAG_NO_XATTRS == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal() -> Vec<u8> {
        let mut sb = vec![0u8; 4096];
        sb[..4].copy_from_slice(MAGIC);
        sb[12..16].copy_from_slice(&131072u32.to_le_bytes());
        sb[20..22].copy_from_slice(&1u16.to_le_bytes());
        sb[22..24].copy_from_slice(&17u16.to_le_bytes());
        sb[26..28].copy_from_slice(&1u16.to_le_bytes());
        sb[28..30].copy_from_slice(&4u16.to_le_bytes());
        sb[40..48].copy_from_slice(&4096u64.to_le_bytes());
        for (at, value) in [(48, 4000u64), (56, ABSENT), (64, 100), (72, 200), (80, ABSENT)] {
            sb[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        sb
    }

    #[test]
    fn accepts_a_sane_superblock() {
        let sb = Superblock::parse(&minimal()).unwrap();
        assert_eq!(sb.block_size, 131072);
        assert!(!sb.has_xattrs());
    }

    #[test]
    fn rejects_bad_fields() {
        let mut image = minimal();
        image[12..16].copy_from_slice(&3000u32.to_le_bytes());
        assert!(Superblock::parse(&image).unwrap_err().what.contains("block size"));
        let mut image = minimal();
        image[28] = 3;
        assert!(Superblock::parse(&image).unwrap_err().what.contains("version 3.0"));
        let mut image = minimal();
        image[64..72].copy_from_slice(&9999u64.to_le_bytes());
        assert!(Superblock::parse(&image).unwrap_err().what.contains("inode table"));
        let mut image = minimal();
        image[20] = 77;
        assert!(Superblock::parse(&image).unwrap_err().what.contains("compressor"));
        assert!(Superblock::parse(&minimal()[..50]).is_err());
    }
}
