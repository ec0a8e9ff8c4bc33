//! Extended attributes: the xattr id table (one entry per distinct attribute set) and the
//! key/value area it points into.

use super::metadata::{Cursor, MetaReader};
use super::superblock::Superblock;
use crate::fault::Fault;

const ID_ENTRY_LEN: usize = 16;
/// Set in a key's type when its value is stored once elsewhere and referenced here.
const VALUE_OUT_OF_LINE: u16 = 0x0100;
/// Linux limits: XATTR_NAME_MAX and XATTR_SIZE_MAX.
const MAX_NAME: u16 = 255;
const MAX_VALUE: u32 = 64 * 1024;
/// More attributes than fit in one listxattr buffer cannot be real.
const MAX_PER_INODE: u32 = 64 * 1024;

pub(super) type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

pub(super) struct XattrTable {
    /// Image offset of the key/value area that references are relative to.
    pairs_start: u64,
    /// Raw id entries: reference u64, count u32, total size u32.
    ids: Vec<u8>,
}

impl XattrTable {
    /// Loads the id table, or `None` when the image has no extended attributes.
    pub(super) fn load(meta: &mut MetaReader, sb: &Superblock) -> Result<Option<XattrTable>, Fault> {
        if !sb.has_xattrs() {
            return Ok(None);
        }
        // The table header is raw (not a metadata block): pairs start, id count, padding.
        let start = sb.xattr_id_table;
        let raw = meta.raw(start, 16)?;
        let pairs_start = u64::from_le_bytes(raw[..8].try_into().unwrap_or_default());
        let count = u32::from_le_bytes(raw[8..12].try_into().unwrap_or_default());
        if pairs_start >= start {
            return Err(Fault::corrupt(start, format!("xattr pairs start at {pairs_start}, after their id table")));
        }
        let ids = meta.lookup_table(start + 16, count.into(), ID_ENTRY_LEN, "xattr id table")?;
        Ok(Some(XattrTable { pairs_start, ids }))
    }

    /// The (full name, value) pairs of attribute set `index`.
    pub(super) fn pairs(&self, meta: &mut MetaReader, index: u32) -> Result<Pairs, Fault> {
        let entry = (index as usize)
            .checked_mul(ID_ENTRY_LEN)
            .and_then(|at| self.ids.get(at..at + ID_ENTRY_LEN))
            .ok_or_else(|| {
                Fault::corrupt(self.pairs_start, format!("xattr index {index} is past the end of the xattr id table"))
            })?;
        let reference = u64::from_le_bytes(entry[..8].try_into().unwrap_or_default());
        let count = u32::from_le_bytes(entry[8..12].try_into().unwrap_or_default());
        if count > MAX_PER_INODE {
            return Err(Fault::corrupt(self.pairs_start, format!("xattr set {index} claims {count} attributes")));
        }
        let mut cursor = Cursor::from_ref(self.pairs_start, reference)?;
        let mut pairs = Vec::new();
        for _ in 0..count {
            let at = cursor.block;
            let kind = meta.u16(&mut cursor)?;
            let name_len = meta.u16(&mut cursor)?;
            if name_len == 0 || name_len > MAX_NAME {
                return Err(Fault::corrupt(at, format!("xattr name of {name_len} bytes, expected 1..={MAX_NAME}")));
            }
            let prefix: &[u8] = match kind & !VALUE_OUT_OF_LINE {
                0 => b"user.",
                1 => b"trusted.",
                2 => b"security.",
                other => return Err(Fault::corrupt(at, format!("xattr prefix id {other}, expected 0, 1 or 2"))),
            };
            let mut name = prefix.to_vec();
            name.extend(meta.bytes(&mut cursor, name_len.into())?);
            let value = if kind & VALUE_OUT_OF_LINE != 0 {
                let _ref_len = meta.u32(&mut cursor)?;
                let mut elsewhere = Cursor::from_ref(self.pairs_start, meta.u64(&mut cursor)?)?;
                read_value(meta, &mut elsewhere)?
            } else {
                read_value(meta, &mut cursor)?
            };
            pairs.push((name, value));
        }
        Ok(pairs)
    }
}

fn read_value(meta: &mut MetaReader, cursor: &mut Cursor) -> Result<Vec<u8>, Fault> {
    let at = cursor.block;
    let len = meta.u32(cursor)?;
    if len > MAX_VALUE {
        return Err(Fault::corrupt(at, format!("xattr value of {len} bytes, expected at most {MAX_VALUE}")));
    }
    meta.bytes(cursor, len as usize)
}
