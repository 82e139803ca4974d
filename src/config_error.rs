//! A setting that cannot be used: the one error type every part that reads settings
//! returns (configuration, pollers, formats), so that each names its variable the same way.
//! A leaf: it knows no setting itself.

/// A setting that cannot be used. The message names the environment variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {message}")]
pub struct ConfigError {
    /// The variable, e.g. `WATCHBRIDGE_HTTP_URL` (or a `KAFKA_*` one the user chose).
    pub var: std::borrow::Cow<'static, str>,
    /// What is wrong with it.
    pub message: String,
}

impl ConfigError {
    /// `var` cannot be used, because of `message`.
    pub fn new(var: impl Into<std::borrow::Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self {
            var: var.into(),
            message: message.into(),
        }
    }
}
