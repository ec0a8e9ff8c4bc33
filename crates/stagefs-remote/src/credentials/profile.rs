//! `~/.aws/credentials` and `~/.aws/config` as aws-cli reads them: INI sections per profile, `AWS_PROFILE`, `AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`.

use std::collections::HashMap;
use std::path::PathBuf;

/// One profile's settings, from both files (the credentials file wins).
#[derive(Default, Clone)]
pub struct Profile {
    pub name: String,
    settings: HashMap<String, String>,
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
        self.settings.get(key).map(String::as_str).filter(|v| !v.is_empty())
    }
}

/// The profile in use: `explicit` (`--profile`), else `AWS_PROFILE`, else `default`.
pub fn load(explicit: Option<&str>) -> Profile {
    let name = explicit
        .map(str::to_string)
        .or_else(|| env("AWS_PROFILE"))
        .or_else(|| env("AWS_DEFAULT_PROFILE"))
        .unwrap_or_else(|| "default".into());
    let home = env("HOME").map(PathBuf::from);
    let config = env("AWS_CONFIG_FILE").map(PathBuf::from).or_else(|| home.as_ref().map(|h| h.join(".aws/config")));
    let credentials = env("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".aws/credentials")));
    let mut settings = HashMap::new();
    if let Some(text) = config.and_then(|p| std::fs::read_to_string(p).ok()) {
        // In the config file, profiles other than `default` are `[profile NAME]`.
        let section = if name == "default" { "default".to_string() } else { format!("profile {name}") };
        settings.extend(section_of(&text, &section).or_else(|| section_of(&text, &name)).unwrap_or_default());
    }
    if let Some(text) = credentials.and_then(|p| std::fs::read_to_string(p).ok()) {
        settings.extend(section_of(&text, &name).unwrap_or_default());
    }
    Profile { name, settings }
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
    }
}
