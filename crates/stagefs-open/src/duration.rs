//! Parsing durations as users write them on command lines: `90`, `30s`, `5m`, `1h30m`, `500ms`.

use std::time::Duration;

/// A duration that does not parse: the text as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {text:?}: use e.g. 90, 30s, 5m, 1h30m or 500ms")]
pub struct DurationError {
    pub text: String,
}

/// Parses a sum of `<number><unit>` terms (units ms, s, m, h, d; a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError { text: text.to_owned() };
    let text = text.trim();
    if text.is_empty() {
        return Err(bad());
    }
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" | "min" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86400),
            _ => return Err(bad()),
        };
        total += unit.checked_mul(u32::try_from(number).map_err(|_| bad())?).ok_or_else(bad)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("m").is_err());
        assert_eq!(
            parse_duration(" 5x ").unwrap_err().to_string(),
            "invalid duration \" 5x \": use e.g. 90, 30s, 5m, 1h30m or 500ms"
        );
    }
}
