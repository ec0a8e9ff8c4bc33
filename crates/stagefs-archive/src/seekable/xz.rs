//! xz random access by block: the blocks listed in each stream's index, each decoded alone once re-wrapped as a one-block stream.
//!
//! An xz block is self-contained (its header names its filters), and the index at the
//! end of every stream gives each block's sizes, so the blocks are known without
//! decoding anything. One block behind its stream's header, followed by a one-record
//! index and a footer, is a valid stream for the ordinary decoder, which then checks the
//! block's own check (CRC-32/64, SHA-256). Only files of several blocks restart: `xz -T`
//! or `--block-size` writes them; plain `xz` writes one block.

use std::io::Read;

use super::points::Point;

pub(super) use crate::codec::XZ_MAGIC as HEADER_MAGIC;
const FOOTER_MAGIC: &[u8; 2] = b"YZ";

/// One block: where it starts, its unpadded size (header, data, check), its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Block {
    pub(super) start: u64,
    pub(super) unpadded: u64,
    pub(super) output: u64,
    pub(super) check: u8,
}

fn u32le(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// A variable-length integer of the xz format at `*pos`.
fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..9 {
        let byte = *b.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn round4(n: u64) -> u64 {
    n.div_ceil(4) * 4
}

/// Every block of every stream in `input`, in file order, read from the streams'
/// indexes (walked from the end); `None` if the file does not parse as xz streams.
pub(super) fn blocks(input: &[u8]) -> Option<Vec<Block>> {
    let mut streams = Vec::new();
    let mut end = input.len();
    while end > 0 {
        // Stream padding: zero bytes, in fours.
        while end >= 4 && input[end - 4..end] == [0; 4] {
            end -= 4;
        }
        if end == 0 {
            break;
        }
        let footer = input.get(end.checked_sub(12)?..end)?;
        if &footer[10..12] != FOOTER_MAGIC || crc32fast::hash(&footer[4..10]) != u32le(footer, 0)? {
            return None;
        }
        let index_len = (u64::from(u32le(footer, 4)?) + 1) * 4;
        let index_start = (end - 12).checked_sub(usize::try_from(index_len).ok()?)?;
        let index = &input[index_start..end - 12];
        if index.first() != Some(&0) || crc32fast::hash(&index[..index.len() - 4]) != u32le(index, index.len() - 4)? {
            return None;
        }
        let mut pos = 1;
        let count = varint(index, &mut pos)?;
        if count > super::points::max_points(input.len() as u64) as u64 {
            return None; // Decompressed whole instead, within the RAM budget.
        }
        let mut records = Vec::new();
        for _ in 0..count {
            records.push((varint(index, &mut pos)?, varint(index, &mut pos)?));
        }
        if records.iter().any(|&(unpadded, _)| unpadded > input.len() as u64) {
            return None;
        }
        let blocks_len = records.iter().try_fold(0u64, |sum, &(unpadded, _)| sum.checked_add(round4(unpadded)))?;
        let stream_start = index_start.checked_sub(usize::try_from(blocks_len).ok()?)?.checked_sub(12)?;
        let header = &input[stream_start..stream_start + 12];
        if &header[..6] != HEADER_MAGIC || header[6..8] != footer[8..10] || records.len() as u64 != count {
            return None;
        }
        let check = header[7] & 0x0f;
        let mut at = stream_start as u64 + 12;
        let stream: Vec<Block> = records
            .into_iter()
            .map(|(unpadded, output)| {
                let block = Block { start: at, unpadded, output, check };
                at += round4(unpadded);
                block
            })
            .collect();
        streams.push(stream);
        if streams.iter().map(Vec::len).sum::<usize>() > super::points::max_points(input.len() as u64) {
            return None;
        }
        end = stream_start;
    }
    Some(streams.into_iter().rev().flatten().collect())
}

/// A one-block stream around the block at `point` (its bytes read by `block`), which
/// decodes to `output` bytes.
pub(super) fn block_stream<R: Read>(point: &Point, output: u64, block: R) -> impl Read {
    let check = point.bits;
    let unpadded = point.end - point.input;
    let mut header = HEADER_MAGIC.to_vec();
    header.extend_from_slice(&[0, check]);
    header.extend_from_slice(&crc32fast::hash(&[0, check]).to_le_bytes());
    let mut index = vec![0u8];
    put_varint(&mut index, 1);
    put_varint(&mut index, unpadded);
    put_varint(&mut index, output);
    while index.len() % 4 != 0 {
        index.push(0);
    }
    let crc = crc32fast::hash(&index);
    index.extend_from_slice(&crc.to_le_bytes());
    let mut footer_body = ((index.len() / 4 - 1) as u32).to_le_bytes().to_vec();
    footer_body.extend_from_slice(&[0, check]);
    let mut tail = index;
    tail.extend_from_slice(&crc32fast::hash(&footer_body).to_le_bytes());
    tail.extend_from_slice(&footer_body);
    tail.extend_from_slice(FOOTER_MAGIC);
    std::io::Cursor::new(header).chain(block.take(round4(unpadded))).chain(std::io::Cursor::new(tail))
}

/// The restart points of `blocks`: each block, its check id kept in `bits` and the end
/// of its unpadded bytes in `end`.
pub(super) fn points(blocks: &[Block]) -> Vec<Point> {
    let mut out = 0;
    blocks
        .iter()
        .map(|b| {
            let point = Point { out, input: b.start, bits: b.check, window: None, end: b.start + b.unpadded };
            out += b.output;
            point
        })
        .collect()
}

/// The first pass over a multi-block xz file: its streams decoded in order (checks
/// verified), the points taken from the indexes.
pub(super) struct Pass<'a> {
    decoder: liblzma::read::XzDecoder<std::io::Cursor<&'a [u8]>>,
    points: Vec<Point>,
    total: u64,
}

impl<'a> Pass<'a> {
    pub(super) fn new(input: &'a [u8]) -> Result<Pass<'a>, String> {
        let blocks = blocks(input).ok_or("the xz index does not parse")?;
        let total = blocks.iter().map(|b| b.output).sum();
        Ok(Pass { decoder: crate::codec::xz_streams(std::io::Cursor::new(input))?, points: points(&blocks), total })
    }
}

impl super::points::CodecPass for Pass<'_> {
    fn consumed(&self) -> u64 {
        self.decoder.get_ref().position()
    }

    fn total(&self) -> u64 {
        self.total
    }

    fn points(&mut self) -> &mut Vec<Point> {
        &mut self.points
    }
}

impl Read for Pass<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.decoder.read(buf)
    }
}
