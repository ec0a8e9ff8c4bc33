//! `~/.aws/credentials` and `~/.aws/config` as aws-cli reads them: INI sections per profile, `AWS_PROFILE`, `AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`.

use std::collections::HashMap;
use std::path::PathBuf;

/// One profile's settings, from both files (the credentials file wins), and where its
/// name and each setting came from.
#[derive(Default, Clone)]
pub struct Profile {
    pub name: String,
    /// `--profile`, `AWS_PROFILE` or `AWS_DEFAULT_PROFILE`; `None` for the implicit `default`.
    pub named_by: Option<&'static str>,
    /// Whether either file has a section of that name.
    pub found: bool,
    /// Setting -> (value, the file it came from as messages name it).
    settings: HashMap<String, (String, String)>,
    /// The two files as messages name them, and every profile they hold (for the message
    /// about a profile that is not there).
    files: [String; 2],
    known: Vec<String>,
}

impl std::fmt::Debug for Profile {
    /// The names of the settings, never their values (secret keys are among them).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut keys: Vec<&String> = self.settings.keys().collect();
        keys.sort();
        f.debug_struct("Profile").field("name", &self.name).field("settings", &keys).finish()
    }
}

impl Profile {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.settings.get(key).map(|(v, _)| v.as_str()).filter(|v| !v.is_empty())
    }

    /// The file a setting came from (`~/.aws/credentials`, `$AWS_CONFIG_FILE=PATH`).
    pub fn origin(&self, key: &str) -> Option<&str> {
        self.settings.get(key).map(|(_, file)| file.as_str())
    }

    /// Why a profile the user named cannot be used: no file has it. A mistyped `--profile`
    /// or `AWS_PROFILE` must fail, not send unsigned requests (aws-cli refuses it too).
    pub fn missing(&self) -> Option<String> {
        let by = self.named_by.filter(|_| !self.found)?;
        let known = match self.known.is_empty() {
            true => "they hold no profile".to_string(),
            false => format!("the profiles there: {}", self.known.join(", ")),
        };
        Some(format!(
            "profile {} (from {by}) not found in {} or {} ({known})",
            crate::url::display_text(&self.name),
            self.files[0],
            self.files[1]
        ))
    }
}

/// The profile in use: `explicit` (`--profile`), else `AWS_PROFILE`, else `default`.
pub fn load(explicit: Option<&str>, files: &crate::files::Files) -> Profile {
    let (name, named_by) = match (explicit, env("AWS_PROFILE"), env("AWS_DEFAULT_PROFILE")) {
        (Some(name), _, _) => (name.to_string(), Some("--profile")),
        (None, Some(name), _) => (name, Some("AWS_PROFILE")),
        (None, None, Some(name)) => (name, Some("AWS_DEFAULT_PROFILE")),
        (None, None, None) => ("default".to_string(), None),
    };
    let config = file("AWS_CONFIG_FILE", ".aws/config", files);
    let credentials = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials", files);
    let mut profile =
        Profile { name, named_by, files: [config.0.clone(), credentials.0.clone()], ..Profile::default() };
    let found = |section: Option<HashMap<String, String>>, shown: &str, profile: &mut Profile| {
        if let Some(section) = section {
            profile.found = true;
            profile.settings.extend(section.into_iter().map(|(k, v)| (k, (v, shown.to_string()))));
        }
    };
    if let (shown, Some(text)) = &config {
        // In the config file, profiles other than `default` are `[profile NAME]`.
        let name = &profile.name;
        let section = if name == "default" { "default".to_string() } else { format!("profile {name}") };
        found(section_of(text, &section).or_else(|| section_of(text, name)), shown, &mut profile);
        profile.known.extend(sections(text).map(|s| s.strip_prefix("profile ").unwrap_or(s).trim().to_string()));
    }
    if let (shown, Some(text)) = &credentials {
        found(section_of(text, &profile.name), shown, &mut profile);
        profile.known.extend(sections(text).map(|s| s.trim().to_string()));
    }
    profile.known.sort();
    profile.known.dedup();
    profile.known = profile.known.iter().map(|k| crate::url::display_text(k)).collect();
    profile
}

/// One of the two files: its name for messages (`~/.aws/config`, or `$AWS_CONFIG_FILE=PATH`
/// when the variable moves it) and its text, if there is one that may be trusted (read
/// through `files`; one refused is named in a warning and left out).
fn file(variable: &str, under_home: &str, files: &crate::files::Files) -> (String, Option<String>) {
    let (shown, path) = match env(variable) {
        Some(path) => (format!("${variable}={}", crate::url::display_text(&path)), Some(PathBuf::from(path))),
        None => (format!("~/{under_home}"), env("HOME").map(|h| PathBuf::from(h).join(under_home))),
    };
    let text = path.and_then(|p| match files.text(&p, 1 << 20) {
        Ok(text) => text,
        Err(why) => {
            tracing::warn!("ignoring {shown}: {why}");
            None
        }
    });
    (shown, text)
}

/// The names of the `[sections]` of an INI text.
fn sections(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|l| l.trim().strip_prefix('[').and_then(|h| h.strip_suffix(']')))
}

/// The `key = value` lines of section `[name]`; indented lines (sub-sections such as
/// `s3 =` followed by nested settings) and comments are skipped.
pub fn section_of(text: &str, name: &str) -> Option<HashMap<String, String>> {
    let mut found = None;
    let mut current: Option<HashMap<String, String>> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if let Some(header) = trimmed.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            if let Some(done) = current.take() {
                found = Some(done);
            }
            if header.trim() == name {
                current = Some(HashMap::new());
            }
            continue;
        }
        if line.starts_with([' ', '\t']) {
            continue;
        }
        if let (Some(section), Some((k, v))) = (current.as_mut(), trimmed.split_once('=')) {
            section.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    current.or(found)
}

pub fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_as_aws_cli_reads_them() {
        let text = "[default]\naws_access_key_id = A\n# comment\n[profile lab]\nregion=eu-west-3\ns3 =\n  endpoint_url = x\n[other]\nk=v\n";
        let default = section_of(text, "default").unwrap();
        assert_eq!(default.get("aws_access_key_id").map(String::as_str), Some("A"));
        let lab = section_of(text, "profile lab").unwrap();
        assert_eq!(lab.get("region").map(String::as_str), Some("eu-west-3"));
        assert!(!lab.contains_key("endpoint_url"), "nested settings are not the profile's");
        assert!(section_of(text, "missing").is_none());
        assert_eq!(sections(text).collect::<Vec<_>>(), ["default", "profile lab", "other"]);
    }
}
