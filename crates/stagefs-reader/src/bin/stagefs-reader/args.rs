//! Hand-rolled option parsing: a handful of flags does not justify a parser dependency.

use std::collections::HashMap;
use std::path::PathBuf;

/// A positional directory plus `--name value` options and `--flag` switches.
pub struct Args {
    pub dir: PathBuf,
    opts: HashMap<String, String>,
    flags: Vec<String>,
}

const SWITCHES: &[&str] = &["--baseline"];

impl Args {
    pub fn parse(argv: &[String]) -> Result<Args, String> {
        let mut dir = None;
        let mut opts = HashMap::new();
        let mut flags = Vec::new();
        let mut it = argv.iter();
        while let Some(a) = it.next() {
            if SWITCHES.contains(&a.as_str()) {
                flags.push(a.clone());
            } else if let Some(name) = a.strip_prefix("--") {
                let v = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
                opts.insert(name.to_string(), v.clone());
            } else if dir.is_none() {
                dir = Some(PathBuf::from(a));
            } else {
                return Err(format!("unexpected argument {a:?}"));
            }
        }
        Ok(Args { dir: dir.ok_or("missing DIR")?, opts, flags })
    }

    pub fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        self.opts.get(name).map(String::as_str)
    }

    /// A number with an optional K/M/G suffix (powers of 1024).
    pub fn size(&self, name: &str, default: u64) -> Result<u64, String> {
        match self.opts.get(name) {
            None => Ok(default),
            Some(v) => parse_size(v).ok_or_else(|| format!("--{name}: cannot parse {v:?}")),
        }
    }

    /// Ensures only known options were given, so typos do not go unnoticed.
    pub fn check_known(&self, known: &[&str]) -> Result<(), String> {
        match self.opts.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(format!("unknown option --{k}")),
            None => Ok(()),
        }
    }
}

pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("20k"), Some(20 << 10));
        assert_eq!(parse_size("123"), Some(123));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn parses_dir_options_and_switches() {
        let v: Vec<String> = ["/d", "--threads", "8", "--baseline"].iter().map(|s| s.to_string()).collect();
        let a = Args::parse(&v).unwrap();
        assert_eq!(a.dir, PathBuf::from("/d"));
        assert_eq!(a.size("threads", 1).unwrap(), 8);
        assert!(a.flag("--baseline"));
        assert!(a.check_known(&["threads"]).is_ok());
        assert!(a.check_known(&["depth"]).is_err());
    }
}
