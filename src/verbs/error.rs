//! The error of every verbs call: which call failed and the errno it left. Below the
//! objects' modules, which all return it.
use std::fmt;

/// A failed verbs call: which call, and the errno it left.
#[derive(Debug)]
pub struct Error {
    pub call: &'static str,
    pub errno: i32,
    pub detail: String,
}

impl Error {
    pub(crate) fn last(call: &'static str) -> Error {
        Error {
            call,
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            detail: String::new(),
        }
    }
    /// For calls that return an errno value instead of setting errno.
    pub(crate) fn code(call: &'static str, rc: i32) -> Error {
        Error {
            call,
            errno: rc.abs(),
            detail: String::new(),
        }
    }
    /// `call` was not made: a stop was asked for (Ctrl-C).
    pub fn interrupted(call: &'static str) -> Error {
        Error::other(call, "not called: interrupted")
    }
    pub(crate) fn other(call: &'static str, detail: impl Into<String>) -> Error {
        Error {
            call,
            errno: 0,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.call)?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        if self.errno != 0 {
            write!(f, ": {}", std::io::Error::from_raw_os_error(self.errno))?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
