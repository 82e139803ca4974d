//! Secrets: the one rule for which names carry them, the wrapper that keeps a secret
//! value out of `Debug` output, and the one way a secret mounted as a file (`…_FILE`) is
//! read. A leaf: configuration (what `watchbridge config` shows), logging (what a URL or a
//! property list may print), the Kafka clients (the properties they log) and the HTTP
//! poller's credentials all use it, so a name is secret everywhere or nowhere.

/// The one rule for names whose values are secrets, never logged or shown: `KAFKA_*`
/// librdkafka properties and the query parameters of URLs ([`crate::logging::redact_url`]).
/// Compared in lower case with only letters and digits kept (`API-Key`, `api_key` and
/// `api.key` are `apikey`): a name containing `password`, `passwd`, `passphrase`, `secret`,
/// `token`, `jaas`, `credential`, `apikey`, `accesskey`, `privatekey`, `signature` or
/// `oauthbearerconfig` (`sasl.oauthbearer.config` carries client secrets inline), ending in
/// `keypem` (`ssl.key.pem`), or exactly `key`, `sig`, `pwd`, `pass`, `auth` or
/// `authorization`. Header values (`WATCHBRIDGE_HTTP_HEADERS`) are secrets whatever the name.
pub fn is_secret(name: &str) -> bool {
    let n: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    [
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "jaas",
        "credential",
        "apikey",
        "accesskey",
        "privatekey",
        "signature",
        "oauthbearerconfig",
    ]
    .iter()
    .any(|s| n.contains(s))
        || n.ends_with("keypem")
        || matches!(
            n.as_str(),
            "key" | "sig" | "pwd" | "pass" | "auth" | "authorization"
        )
}

/// A setting whose value must not appear in logs or `Debug` output.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redacted(pub String);

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::str::FromStr for Redacted {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_string()))
    }
}

/// The secret in the file at `path` (what a `…_FILE` variable names): its contents, one
/// trailing line end dropped (what `echo` and most secret stores leave). The error is a
/// message for the caller to put under its variable's name.
pub fn read_secret_file(path: &str) -> Result<String, String> {
    let contents =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
    let trimmed = contents
        .strip_suffix('\n')
        .map(|c| c.strip_suffix('\r').unwrap_or(c))
        .unwrap_or(&contents);
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::is_secret;

    #[test]
    fn secret_names_are_known() {
        assert!(is_secret("sasl.password"));
        assert!(is_secret("sasl.oauthbearer.config"));
        assert!(is_secret(
            "sasl.oauthbearer.assertion.private.key.passphrase"
        ));
        assert!(!is_secret("security.protocol"));
        assert!(is_secret("ssl.key.pem"));
        assert!(!is_secret("ssl.key.location"));
        assert!(!is_secret("ssl.certificate.pem"));
        assert!(is_secret("X-Api-Key") && is_secret("access_token") && is_secret("sig"));
        assert!(!is_secret("keyword") && !is_secret("tenant") && !is_secret("page"));
    }
}
