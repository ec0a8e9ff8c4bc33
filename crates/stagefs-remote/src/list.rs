//! Shard sets in a store: brace ranges (`train-{000000..000099}.tar`) expanded locally, globs (`shards/*.tar`) matched against a paginated, bounded ListObjectsV2 listing.

use crate::client::{Ask, Client};
use crate::error::RemoteError;
use crate::url::ObjectUrl;
pub use crate::xml::Listed;

/// At most this many objects in a set, from braces or a listing.
pub const MAX_OBJECTS: usize = 1_000_000;

/// True for a key or path that names a set: braces or glob wildcards.
pub fn is_pattern(text: &str) -> bool {
    text.contains(['*', '?', '[', '{'])
}

/// Why a brace pattern names no set of objects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BraceError {
    /// `text` as [`crate::url::display_text`] shows it.
    #[error("unmatched {{ in {text}")]
    Unmatched { text: String },
    #[error("{{{a}..{b}}} is not a range of whole numbers")]
    NotNumbers { a: String, b: String },
    #[error("{{{a}..{b}}} names {count} objects, more than {cap}")]
    LongRange { a: String, b: String, count: u64, cap: usize },
    #[error("the pattern names more than {cap} objects")]
    TooMany { cap: usize },
}

/// `{a,b}` lists and `{N..M}` ranges (zero-padded as N is, counting down too) expanded,
/// in order; nested and repeated groups multiply. Fails beyond `cap` results.
pub fn expand_braces(text: &str, cap: usize) -> Result<Vec<String>, BraceError> {
    let Some(open) = text.find('{') else { return Ok(vec![text.to_string()]) };
    let mut depth = 0;
    let close = text[open..]
        .char_indices()
        .find_map(|(i, c)| {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(open + i)
        })
        .ok_or_else(|| BraceError::Unmatched { text: crate::url::display_text(text) })?;
    let (head, inner, tail) = (&text[..open], &text[open + 1..close], &text[close + 1..]);
    let choices = match inner.split_once("..") {
        Some((a, b)) if !inner.contains(',') => range(a, b, cap)?,
        _ => split_top_level(inner),
    };
    let mut out = Vec::new();
    for choice in choices {
        for rest in expand_braces(&format!("{choice}{tail}"), cap)? {
            out.push(format!("{head}{rest}"));
            if out.len() > cap {
                return Err(BraceError::TooMany { cap });
            }
        }
    }
    // A head with its own braces (`{a,b}` before this group) cannot be: `find` took the first.
    Ok(out)
}

/// `N..M` as strings, keeping N's zero padding.
fn range(a: &str, b: &str, cap: usize) -> Result<Vec<String>, BraceError> {
    let bad = || BraceError::NotNumbers { a: a.to_owned(), b: b.to_owned() };
    let (start, stop): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    let count = start.abs_diff(stop) + 1;
    if count > cap as u64 {
        return Err(BraceError::LongRange { a: a.to_owned(), b: b.to_owned(), count, cap });
    }
    let width = if a.len() > 1 && a.starts_with('0') { a.len() } else { 0 };
    let numbers: Box<dyn Iterator<Item = u64>> =
        if start <= stop { Box::new(start..=stop) } else { Box::new((stop..=start).rev()) };
    Ok(numbers.map(|n| format!("{n:0width$}")).collect())
}

/// `a,b{c,d},e` split at the commas outside nested braces.
fn split_top_level(inner: &str) -> Vec<String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(inner[start..i].to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(inner[start..].to_string());
    parts
}

impl Client {
    /// The objects under `prefix` in `bucket`, in key order, page by page (1,000 keys a
    /// page), at most `cap` of them: more is an error, not a silent cut.
    pub fn list(&self, bucket: &str, prefix: &str, cap: usize) -> Result<Vec<Listed>, RemoteError> {
        let url = ObjectUrl::S3 { bucket: bucket.to_string(), key: String::new() };
        let what = format!("s3://{}/{}", bucket, crate::url::display_text(prefix));
        let mut objects = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self.retrying(&|| false, || {
                let mut query = vec![("list-type", "2"), ("prefix", prefix)];
                if let Some(t) = &token {
                    query.push(("continuation-token", t.as_str()));
                }
                let answer =
                    self.send(&Ask { method: "GET", url: &url, query: &query, headers: vec![], body: None })?;
                if answer.status().as_u16() != 200 {
                    return Err(self.refusal(answer, &url, &what));
                }
                let text = answer.into_body().with_config().limit(64 << 20).read_to_string();
                let text = text.map_err(|e| self.failed(&url, &e))?;
                Ok(crate::xml::list_page(&text))
            })?;
            objects.extend(page.0);
            if objects.len() > cap {
                return Err(RemoteError::Unsupported(format!(
                    "{what}: more than {cap} objects under this prefix; name the shards with a narrower pattern"
                )));
            }
            match page.1 {
                Some(next) if Some(&next) != token.as_ref() => token = Some(next),
                _ => return Ok(objects),
            }
        }
    }
}

/// The objects `url` names (its key or path may hold braces and, for S3, glob wildcards),
/// with their sizes where a listing gave them; sorted per pattern, each once. Saved
/// indexes (`*.stagefs-index*`) are never shards.
pub fn resolve(client: &Client, url: &ObjectUrl) -> Result<Vec<(ObjectUrl, Option<u64>)>, RemoteError> {
    let spec = match url {
        ObjectUrl::S3 { key, .. } => key.clone(),
        ObjectUrl::Http(u) => u.path.clone(),
    };
    let bad = |why: String| RemoteError::BadUrl(format!("{}: {why}", url.shown()));
    let mut out: Vec<(ObjectUrl, Option<u64>)> = Vec::new();
    let push = |u: ObjectUrl, size: Option<u64>, out: &mut Vec<(ObjectUrl, Option<u64>)>| {
        if !out.iter().any(|(o, _)| o == &u) {
            out.push((u, size));
        }
    };
    for one in expand_braces(&spec, MAX_OBJECTS).map_err(|e| bad(e.to_string()))? {
        if !one.contains(['*', '?', '[']) {
            push(url.with_key(&one), None, &mut out);
            continue;
        }
        let ObjectUrl::S3 { bucket, .. } = url else {
            return Err(bad(
                "an HTTP server has no listing to match * ? [ against; name the shards with a brace range such as \
                 train-{000000..000099}.tar"
                    .into(),
            ));
        };
        let pattern = glob::Pattern::new(&one).map_err(|e| bad(format!("bad pattern: {e}")))?;
        let literal = &one[..one.find(['*', '?', '[']).unwrap_or(one.len())];
        let options = glob::MatchOptions { require_literal_separator: true, ..Default::default() };
        let mut listed = client.list(bucket, literal, MAX_OBJECTS)?;
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        for object in listed {
            if pattern.matches_with(&object.key, options) && !object.key.contains(".stagefs-index") {
                push(url.with_key(&object.key), Some(object.size), &mut out);
            }
        }
    }
    if out.is_empty() {
        return Err(RemoteError::NotFound(format!("{}: no object matches the pattern", url.shown())));
    }
    if out.len() > MAX_OBJECTS {
        return Err(bad(format!("names more than {MAX_OBJECTS} objects")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_expand_like_bash() {
        assert_eq!(expand_braces("t-{000..002}.tar", 10).unwrap(), ["t-000.tar", "t-001.tar", "t-002.tar"]);
        assert_eq!(expand_braces("{a,b{1,2}}-{3..2}", 10).unwrap(), ["a-3", "a-2", "b1-3", "b1-2", "b2-3", "b2-2"]);
        assert_eq!(expand_braces("plain.tar", 10).unwrap(), ["plain.tar"]);
        assert_eq!(
            expand_braces("t-{0..100}.tar", 10).unwrap_err().to_string(),
            "{0..100} names 101 objects, more than 10"
        );
        assert_eq!(
            expand_braces("t-{a..b}.tar", 10).unwrap_err().to_string(),
            "{a..b} is not a range of whole numbers"
        );
        assert_eq!(expand_braces("{a,b,c}{d,e}", 5).unwrap_err().to_string(), "the pattern names more than 5 objects");
        assert!(expand_braces("t-{0..99999999999999}.tar", 10).is_err(), "refused before any allocation");
        assert!(expand_braces("t-{a..b}.tar", 10).is_err());
        assert!(expand_braces("t-{0..1", 10).is_err());
        assert!(is_pattern("s/{1..2}.tar") && is_pattern("s/*.tar") && !is_pattern("s/1.tar"));
    }
}
