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
    /// An object, dataset or name that is not there (ENOENT).
    #[error("{0}")]
    NotFound(String),
    /// Beyond the largest object or file size (EFBIG).
    #[error("{0}")]
    TooBig(String),
    /// In use: a snapshot with clones or holds (EBUSY).
    #[error("{0}")]
    Busy(String),
    /// The pool stopped committing (a sync failed or an invariant broke):
    /// writes get EIO until it is exported and imported again.
    #[error("pool '{pool}' is suspended: {why}")]
    Suspended { pool: String, why: String },
    /// The pool was imported read-only (`zpool import -o readonly=on`):
    /// nothing may change it (EROFS).
    #[error("pool '{0}' is read-only")]
    ReadOnly(String),
    /// A broken invariant of the engine itself: a bug, never bad input.
    #[error("internal error: {0}")]
    Internal(String),
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
    pub fn suspended(pool: &str, why: &str) -> Self {
        Error::Suspended {
            pool: pool.to_string(),
            why: why.to_string(),
        }
    }
}
