//! The few XML answers S3 and STS give (errors, listings, credentials), read with quick-xml into flat records.

use quick_xml::events::Event;
use quick_xml::Reader;

/// The text of every element, in document order, with the name of the element that
/// holds it and the name of that element's parent: `(parent, name, text)`.
fn elements(text: &str) -> Vec<(String, String, String)> {
    let mut reader = Reader::from_str(text);
    reader.config_mut().trim_text(true);
    let mut stack: Vec<String> = Vec::new();
    let mut out = Vec::new();
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) => stack.push(String::from_utf8_lossy(e.local_name().as_ref()).into_owned()),
            Ok(Event::End(_)) => {
                stack.pop();
            }
            Ok(Event::Text(t)) => {
                let value = t.unescape().map(|c| c.into_owned()).unwrap_or_default();
                let name = stack.last().cloned().unwrap_or_default();
                let parent = stack.len().checked_sub(2).map(|i| stack[i].clone()).unwrap_or_default();
                out.push((parent, name, value));
            }
            Ok(Event::Eof) | Err(_) => return out,
            Ok(_) => {}
        }
    }
}

/// The text of the first element named `name`, anywhere.
pub fn first(text: &str, name: &str) -> Option<String> {
    elements(text).into_iter().find(|(_, n, _)| n == name).map(|(_, _, v)| v)
}

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub size: u64,
}

/// A `ListObjectsV2` page: its objects and the token for the next page, if truncated.
pub fn list_page(text: &str) -> (Vec<Listed>, Option<String>) {
    let mut objects: Vec<Listed> = Vec::new();
    let (mut truncated, mut token) = (false, None);
    for (parent, name, value) in elements(text) {
        match (parent.as_str(), name.as_str()) {
            ("Contents", "Key") => objects.push(Listed { key: value, size: 0 }),
            ("Contents", "Size") => {
                if let Some(last) = objects.last_mut() {
                    last.size = value.parse().unwrap_or(0);
                }
            }
            ("ListBucketResult", "IsTruncated") => truncated = value == "true",
            ("ListBucketResult", "NextContinuationToken") => token = Some(value),
            _ => {}
        }
    }
    (objects, token.filter(|_| truncated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_and_errors_read() {
        let page = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix>s/</Prefix>
<Contents><Key>s/a&amp;b.tar</Key><Size>10</Size><ETag>"x"</ETag></Contents>
<Contents><Key>s/c.tar</Key><Size>20</Size></Contents>
<IsTruncated>true</IsTruncated><NextContinuationToken>tok</NextContinuationToken></ListBucketResult>"#;
        let (objects, next) = list_page(page);
        assert_eq!(objects, [Listed { key: "s/a&b.tar".into(), size: 10 }, Listed { key: "s/c.tar".into(), size: 20 }]);
        assert_eq!(next.as_deref(), Some("tok"));
        let error = "<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>";
        assert_eq!(first(error, "Code").as_deref(), Some("NoSuchKey"));
        assert_eq!(first("not xml at all", "Code"), None);
    }
}
