//! Typed errors. Anything that comes from disk, a socket or a user becomes an
//! `Error`, never a panic.

use std::io;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O error on {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("device lost power (simulated crash)")]
    PowerLost,
    #[error("corrupt {what}: {why}")]
    Corrupt { what: String, why: String },
    #[error("checksum mismatch: {0}")]
    Checksum(String),
    #[error("{0}")]
    Invalid(String),
    #[error("pool is out of space")]
    NoSpace,
    #[error("{0}")]
    Unsupported(String),
}

impl Error {
    pub fn corrupt(what: impl Into<String>, why: impl Into<String>) -> Self {
        Error::Corrupt {
            what: what.into(),
            why: why.into(),
        }
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::Invalid(msg.into())
    }
}
