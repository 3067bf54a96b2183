//! The profile of the AWS shared credentials file, for S3 when the environment names no keys:
//! `AWS_SHARED_CREDENTIALS_FILE` (default `~/.aws/credentials`), section `AWS_PROFILE` (default
//! `default`), keys `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`.

use object_store::aws::AmazonS3Builder;

/// `(access key id, secret, session token)` of `profile` in the INI text `ini`.
pub(crate) fn parse(ini: &str, profile: &str) -> Option<(String, String, Option<String>)> {
    let mut in_section = false;
    let (mut key, mut secret, mut token) = (None, None, None);
    for line in ini.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim();
            in_section = name == profile || name.strip_prefix("profile ") == Some(profile);
            continue;
        }
        if !in_section {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            let v = v.trim().to_owned();
            match k.trim() {
                "aws_access_key_id" => key = Some(v),
                "aws_secret_access_key" => secret = Some(v),
                "aws_session_token" => token = Some(v),
                _ => {}
            }
        }
    }
    Some((key?, secret?, token))
}

/// `b` with the profile's keys when the environment gave none (no `AWS_ACCESS_KEY_ID`, no web
/// identity) and the file has the profile; unchanged otherwise.
pub(crate) fn apply(b: AmazonS3Builder) -> AmazonS3Builder {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if env("AWS_ACCESS_KEY_ID").is_some() || env("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() {
        return b;
    }
    let path = env("AWS_SHARED_CREDENTIALS_FILE")
        .or_else(|| env("HOME").map(|h| format!("{h}/.aws/credentials")));
    let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return b;
    };
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    match parse(&text, &profile) {
        Some((k, s, t)) => {
            let b = b.with_access_key_id(k).with_secret_access_key(s);
            match t {
                Some(t) => b.with_token(t),
                None => b,
            }
        }
        None => b,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_named_profile() {
        let ini = "[default]\naws_access_key_id = A\naws_secret_access_key = B\n\n[profile ci]\n# c\naws_access_key_id=C\naws_secret_access_key=D\naws_session_token=T\n";
        assert_eq!(
            super::parse(ini, "default"),
            Some(("A".into(), "B".into(), None))
        );
        assert_eq!(
            super::parse(ini, "ci"),
            Some(("C".into(), "D".into(), Some("T".into())))
        );
        assert_eq!(super::parse(ini, "nope"), None);
        assert_eq!(super::parse("[x]\naws_access_key_id=1\n", "x"), None);
    }
}
