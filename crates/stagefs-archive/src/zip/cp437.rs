//! Names of zips made on MS-DOS and Windows without the UTF-8 flag: IBM code page 437, as Info-ZIP, 7-Zip and Python read them.

/// The upper half of code page 437 (bytes 0x80 to 0xFF); the lower half is ASCII.
const UPPER: [char; 128] = [
    'Ç', 'ü', 'é', 'â', 'ä', 'à', 'å', 'ç', 'ê', 'ë', 'è', 'ï', 'î', 'ì', 'Ä', 'Å', //
    'É', 'æ', 'Æ', 'ô', 'ö', 'ò', 'û', 'ù', 'ÿ', 'Ö', 'Ü', '¢', '£', '¥', '₧', 'ƒ', //
    'á', 'í', 'ó', 'ú', 'ñ', 'Ñ', 'ª', 'º', '¿', '⌐', '¬', '½', '¼', '¡', '«', '»', //
    '░', '▒', '▓', '│', '┤', '╡', '╢', '╖', '╕', '╣', '║', '╗', '╝', '╜', '╛', '┐', //
    '└', '┴', '┬', '├', '─', '┼', '╞', '╟', '╚', '╔', '╩', '╦', '╠', '═', '╬', '╧', //
    '╨', '╤', '╥', '╙', '╘', '╒', '╓', '╫', '╪', '┘', '┌', '█', '▄', '▌', '▐', '▀', //
    'α', 'ß', 'Γ', 'π', 'Σ', 'σ', 'µ', 'τ', 'Φ', 'Θ', 'Ω', 'δ', '∞', 'φ', 'ε', '∩', //
    '≡', '±', '≥', '≤', '⌠', '⌡', '÷', '≈', '°', '∙', '·', '√', 'ⁿ', '²', '■', '\u{a0}',
];

/// `name` read as code page 437, in UTF-8.
pub(super) fn to_utf8(name: &[u8]) -> Vec<u8> {
    let text: String = name.iter().map(|&b| if b < 0x80 { b as char } else { UPPER[(b - 0x80) as usize] }).collect();
    text.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upper_half_maps_as_unzip_shows_it() {
        assert_eq!(String::from_utf8(to_utf8(b"File 2 - \x94.txt")).unwrap(), "File 2 - ö.txt");
        assert_eq!(String::from_utf8(to_utf8(b"\x80\x81\xe1\xff")).unwrap(), "Çüß\u{a0}");
        assert_eq!(to_utf8(b"plain/ascii"), b"plain/ascii");
    }
}
