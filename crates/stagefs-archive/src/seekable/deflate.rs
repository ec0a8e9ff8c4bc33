//! Deflate blocks decoded from a guessed start whose 32 KiB of history is unknown: output as 16-bit symbols, each reference into the unknown history kept as a marker naming the window byte it needs.
//!
//! rapidgzip's scheme (Knespel and Brunst, HPDC'23): a worker that starts in the middle
//! of a gzip member cannot know the bytes its back-references reach before its start.
//! Such a byte is written as `MARKER + i` (byte `i` of the 32 KiB window before the
//! start); copies of it stay markers. Once the previous chunk's last 32 KiB are known,
//! the markers are replaced (see `pgzip`). Values below 256 are bytes.
//!
//! Only the start of a chunk needs this: once 32 KiB of output hold no marker, nothing
//! after can refer to an unknown byte, and zlib-rs decodes the rest (`sequential`). The
//! validity rules follow zlib's `inflate`, so this decoder accepts what zlib accepts.

/// How far back a reference reaches.
pub(super) const WINDOW: usize = 32 << 10;
/// Values from here on are markers: `MARKER + i` stands for byte `i` of the window.
pub(super) const MARKER: u16 = 256;

/// Why decoding stopped short.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Error {
    /// The input ends inside a block.
    End,
    /// Not deflate data (what zlib would report).
    Invalid(&'static str),
}

/// A little-endian bit reader over the whole compressed file.
pub(super) struct Bits<'a> {
    data: &'a [u8],
    /// The next byte to load into `buf`.
    next: usize,
    /// Loaded bits, the next one lowest; above `count` either zero or the next bits.
    buf: u64,
    count: u32,
}

impl<'a> Bits<'a> {
    /// A reader at bit `bit` of `data` (at its end if `bit` lies past it).
    pub(super) fn at(data: &'a [u8], bit: u64) -> Bits<'a> {
        let byte = usize::try_from(bit / 8).unwrap_or(usize::MAX).min(data.len());
        let mut bits = Bits { data, next: byte, buf: 0, count: 0 };
        bits.refill();
        if bits.count >= 8 {
            bits.consume((bit % 8) as u32);
        }
        bits
    }

    pub(super) fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The bit the reader is at, from the start of the file.
    pub(super) fn position(&self) -> u64 {
        self.next as u64 * 8 - u64::from(self.count)
    }

    /// Loads whole bytes until at least 56 bits are held, or the input ends.
    #[inline]
    fn refill(&mut self) {
        if let Some(word) = self.data.get(self.next..self.next + 8) {
            let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            // Bits past the whole bytes counted are the next byte's, as loaded again later.
            self.buf |= word << self.count;
            let bytes = (63 - self.count) / 8;
            self.next += bytes as usize;
            self.count += bytes * 8;
        } else {
            while self.count < 56 && self.next < self.data.len() {
                self.buf |= u64::from(self.data[self.next]) << self.count;
                self.next += 1;
                self.count += 8;
            }
        }
    }

    #[inline]
    fn consume(&mut self, n: u32) {
        self.buf >>= n;
        self.count -= n;
    }

    /// The next `n` (at most 32) bits, as a number.
    #[inline]
    pub(super) fn take(&mut self, n: u32) -> Result<u32, Error> {
        if self.count < n {
            self.refill();
            if self.count < n {
                return Err(Error::End);
            }
        }
        let value = (self.buf & ((1u64 << n) - 1)) as u32;
        self.consume(n);
        Ok(value)
    }

    /// Skips to the next byte boundary (a stored block's LEN).
    pub(super) fn align(&mut self) {
        self.consume(self.count % 8);
    }
}

/// An entry links to a sub-table for codes longer than the root bits.
const LINK: u32 = 1 << 5;

/// A canonical Huffman code as lookup tables: its first `root` bits index the main
/// table; longer codes continue in sub-tables. An entry holds the code's length (bits
/// 0-4; 0: no such code) and its symbol (from bit 16), or a link (bit 5) with the
/// sub-table's index bits (8-11) and start (from bit 12).
pub(super) struct Table {
    entries: Vec<u32>,
    root: u32,
}

impl Table {
    pub(super) fn new(root: u32) -> Table {
        Table { entries: Vec::with_capacity(2 << root), root }
    }

    /// The code whose symbol `s` has `lengths[s]` bits (0: unused). As zlib: an
    /// over-subscribed code is refused, an incomplete one too unless `incomplete_ok` and
    /// it is a single code of one bit; no code at all is accepted when `incomplete_ok`
    /// (a distance code that is never used).
    pub(super) fn build(&mut self, lengths: &[u8], incomplete_ok: bool) -> Result<(), Error> {
        let mut count = [0u16; 16];
        for &length in lengths {
            count[usize::from(length)] += 1;
        }
        count[0] = 0;
        let max = (1..16).rev().find(|&l| count[l] > 0).unwrap_or(0) as u32;
        let mask = (1usize << self.root) - 1;
        self.entries.clear();
        self.entries.resize(1 << self.root, 0);
        if max == 0 {
            return if incomplete_ok { Ok(()) } else { Err(Error::Invalid("invalid code lengths set")) };
        }
        let mut left = 1i32;
        for &n in &count[1..] {
            left = (left << 1) - i32::from(n);
            if left < 0 {
                return Err(Error::Invalid("over-subscribed code"));
            }
        }
        if left > 0 && !(incomplete_ok && max == 1) {
            return Err(Error::Invalid("incomplete code"));
        }
        let mut next = [0u32; 16];
        let mut code = 0u32;
        for length in 1..16 {
            code = (code + u32::from(count[length - 1])) << 1;
            next[length] = code;
        }
        // Codes are read lowest bit first: the tables are indexed by reversed codes.
        let mut reversed = [0u16; 320];
        let mut sub_bits = [0u8; 1 << 10];
        for (symbol, &length) in lengths.iter().enumerate() {
            let length = u32::from(length);
            if length == 0 {
                continue;
            }
            let r = next[length as usize].reverse_bits() >> (32 - length);
            next[length as usize] += 1;
            reversed[symbol] = r as u16;
            let entry = length | ((symbol as u32) << 16);
            if length <= self.root {
                for at in (r as usize..=mask).step_by(1 << length) {
                    self.entries[at] = entry;
                }
            } else {
                let prefix = r as usize & mask;
                sub_bits[prefix] = sub_bits[prefix].max((length - self.root) as u8);
            }
        }
        if max <= self.root {
            return Ok(());
        }
        for (symbol, &length) in lengths.iter().enumerate() {
            let length = u32::from(length);
            if length <= self.root {
                continue;
            }
            let r = u32::from(reversed[symbol]);
            let prefix = r as usize & mask;
            let bits = u32::from(sub_bits[prefix]);
            if self.entries[prefix] & LINK == 0 {
                let start = self.entries.len() as u32;
                self.entries.resize(self.entries.len() + (1 << bits), 0);
                self.entries[prefix] = LINK | (bits << 8) | (start << 12);
            }
            let start = (self.entries[prefix] >> 12) as usize;
            let entry = length | ((symbol as u32) << 16);
            for at in ((r >> self.root) as usize..1 << bits).step_by(1 << (length - self.root)) {
                self.entries[start + at] = entry;
            }
        }
        Ok(())
    }

    /// The next symbol.
    #[inline]
    pub(super) fn decode(&self, bits: &mut Bits) -> Result<u16, Error> {
        if bits.count < 15 {
            bits.refill();
        }
        let mut entry = self.entries[(bits.buf & ((1 << self.root) - 1)) as usize];
        if entry & LINK != 0 {
            let sub = (entry >> 8) & 15;
            let at = (bits.buf >> self.root) & ((1 << sub) - 1);
            entry = self.entries[(entry >> 12) as usize + at as usize];
        }
        let length = entry & 31;
        if length > bits.count {
            return Err(Error::End);
        }
        if length == 0 {
            return Err(Error::Invalid("invalid code"));
        }
        bits.consume(length);
        Ok((entry >> 16) as u16)
    }
}

/// Match lengths of symbols 257-285: base and extra bits.
const LENGTH_BASE: [u16; 29] =
    [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258];
const LENGTH_EXTRA: [u8; 29] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
/// Distances of symbols 0-29: base and extra bits.
const DISTANCE_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145,
    8193, 12289, 16385, 24577,
];
const DISTANCE_EXTRA: [u8; 30] =
    [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13];
/// The order code-length code lengths are sent in.
const CODE_LENGTH_ORDER: [usize; 19] = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];

/// The codes of a block: a dynamic block's, built again for each, and the fixed ones.
pub(super) struct Codes {
    literals: Table,
    distances: Table,
    lengths: Table,
    fixed_literals: Table,
    fixed_distances: Table,
}

impl Codes {
    pub(super) fn new() -> Codes {
        let mut lengths = [8u8; 288];
        lengths[144..256].fill(9);
        lengths[256..280].fill(7);
        let mut fixed_literals = Table::new(10);
        fixed_literals.build(&lengths, false).expect("the fixed literal code is complete");
        // 32 codes of 5 bits, of which 30 and 31 are invalid when used.
        let mut fixed_distances = Table::new(8);
        fixed_distances.build(&[5; 32], false).expect("the fixed distance code is complete");
        let (literals, distances, lengths) = (Table::new(10), Table::new(8), Table::new(7));
        Codes { literals, distances, lengths, fixed_literals, fixed_distances }
    }

    /// The codes of the block just read (after `dynamic`, or fixed).
    pub(super) fn of(&self, fixed: bool) -> (&Table, &Table) {
        if fixed {
            (&self.fixed_literals, &self.fixed_distances)
        } else {
            (&self.literals, &self.distances)
        }
    }

    /// Reads a dynamic block's header (after its 3 type bits) and builds its codes.
    pub(super) fn dynamic(&mut self, bits: &mut Bits) -> Result<(), Error> {
        let literals = bits.take(5)? as usize + 257;
        let distances = bits.take(5)? as usize + 1;
        let code_lengths = bits.take(4)? as usize + 4;
        if literals > 286 || distances > 30 {
            return Err(Error::Invalid("too many length or distance symbols"));
        }
        let mut order = [0u8; 19];
        for &symbol in &CODE_LENGTH_ORDER[..code_lengths] {
            order[symbol] = bits.take(3)? as u8;
        }
        self.lengths.build(&order, false)?;
        let total = literals + distances;
        let mut lengths = [0u8; 316];
        let mut at = 0;
        while at < total {
            let symbol = self.lengths.decode(bits)?;
            let (value, repeat) = match symbol {
                0..=15 => (symbol as u8, 1),
                16 if at == 0 => return Err(Error::Invalid("invalid bit length repeat")),
                16 => (lengths[at - 1], 3 + bits.take(2)? as usize),
                17 => (0, 3 + bits.take(3)? as usize),
                _ => (0, 11 + bits.take(7)? as usize),
            };
            if at + repeat > total {
                return Err(Error::Invalid("invalid bit length repeat"));
            }
            lengths[at..at + repeat].fill(value);
            at += repeat;
        }
        if lengths[256] == 0 {
            return Err(Error::Invalid("invalid code -- missing end-of-block"));
        }
        self.literals.build(&lengths[..literals], true)?;
        self.distances.build(&lengths[literals..total], true)
    }
}

/// Decoded symbols of a chunk, and what its references may reach.
pub(super) struct Output {
    pub(super) symbols: Vec<u16>,
    /// Where the current member's output starts in `symbols`.
    pub(super) member_start: usize,
    /// Unknown bytes before `symbols[0]` a reference may reach: [`WINDOW`] while the
    /// chunk is in the member it started in, 0 once another member began (or at a
    /// member's start).
    pub(super) history: usize,
    /// The most symbols to hold.
    pub(super) cap: usize,
}

impl Output {
    /// Appends the `length` symbols found `distance` back.
    #[inline]
    fn copy(&mut self, distance: usize, length: usize) -> Result<(), Error> {
        let here = self.symbols.len();
        if distance <= here - self.member_start {
            let from = here - distance;
            if distance >= length {
                self.symbols.extend_from_within(from..from + length);
            } else {
                for k in 0..length {
                    let symbol = self.symbols[from + k];
                    self.symbols.push(symbol);
                }
            }
        } else if self.member_start == 0 && distance <= here + self.history {
            // Reaching before the chunk, into the window.
            for k in 0..length {
                let symbol = match (here + k).checked_sub(distance) {
                    Some(from) => self.symbols[from],
                    None => MARKER + (WINDOW + here + k - distance) as u16,
                };
                self.symbols.push(symbol);
            }
        } else {
            return Err(Error::Invalid("invalid distance too far back"));
        }
        Ok(())
    }

    /// The stored block after the 3 header bits. `Ok(false)`: it would pass `cap`
    /// (nothing taken).
    pub(super) fn stored(&mut self, bits: &mut Bits) -> Result<bool, Error> {
        bits.align();
        let length = bits.take(16)?;
        if length != !bits.take(16)? & 0xffff {
            return Err(Error::Invalid("invalid stored block lengths"));
        }
        let at = (bits.position() / 8) as usize;
        let bytes = bits.data().get(at..at + length as usize).ok_or(Error::End)?;
        if self.symbols.len() + bytes.len() > self.cap {
            return Ok(false);
        }
        self.symbols.extend(bytes.iter().map(|&b| u16::from(b)));
        *bits = Bits::at(bits.data(), (at + bytes.len()) as u64 * 8);
        Ok(true)
    }

    /// A Huffman-coded block's symbols up to its end of block. `Ok(false)`: `cap` was
    /// reached first.
    pub(super) fn huffman(&mut self, bits: &mut Bits, (literals, distances): (&Table, &Table)) -> Result<bool, Error> {
        loop {
            if self.symbols.len() >= self.cap {
                return Ok(false);
            }
            if bits.count < 48 {
                bits.refill();
            }
            let symbol = literals.decode(bits)?;
            if symbol < 256 {
                self.symbols.push(symbol);
                continue;
            }
            if symbol == 256 {
                return Ok(true);
            }
            let index = usize::from(symbol - 257);
            if index >= LENGTH_BASE.len() {
                return Err(Error::Invalid("invalid literal/length code"));
            }
            let length = usize::from(LENGTH_BASE[index]) + bits.take(u32::from(LENGTH_EXTRA[index]))? as usize;
            let symbol = usize::from(distances.decode(bits)?);
            if symbol >= DISTANCE_BASE.len() {
                return Err(Error::Invalid("invalid distance code"));
            }
            let distance = usize::from(DISTANCE_BASE[symbol]) + bits.take(u32::from(DISTANCE_EXTRA[symbol]))? as usize;
            self.copy(distance, length)?;
        }
    }
}
