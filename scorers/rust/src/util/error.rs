//! One error type: a short stable reason code (the Python runtime's, where it has one)
//! and a message. The CLI prints `error: <reason>: <message>` and exits 2.

#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    pub reason: &'static str,
    pub message: String,
}

impl Error {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Error { reason, message: message.into() }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

impl std::error::Error for Error {}
