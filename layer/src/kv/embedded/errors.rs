//! How the embedded store's I/O errors are classified: a full disk, a damaged file, an I/O
//! error after which redb must be re-opened.

use std::io;

use crate::kv::error::Error;

/// Whether an I/O error says the disk is full.
pub(crate) fn is_disk_full(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull || e.raw_os_error() == Some(28)
}

/// Whether an I/O error of the engine opening an existing file says the file ends before what
/// its own header points to: a damaged length or page number, never a fault of the disk.
pub(crate) fn is_read_past_end(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::UnexpectedEof
}

/// How an engine I/O error's message starts (after it, redb must be re-opened).
const IO_ERROR: &str = "I/O error";

/// A redb error as the KV layer's: ENOSPC is `StorageFull`; other I/O errors are `Storage`
/// starting with [`IO_ERROR`]; anything else `Storage`.
pub(crate) fn classify(what: &str, e: impl Into<redb::Error>) -> Error {
    let e: redb::Error = e.into();
    match &e {
        redb::Error::Io(io) if is_disk_full(io) => {
            Error::StorageFull(format!("{what}: the disk is full ({io})"))
        }
        redb::Error::Io(_) | redb::Error::PreviousIo => {
            Error::Storage(format!("{IO_ERROR} in {what}: {e}"))
        }
        _ => Error::Storage(format!("{what}: {e}")),
    }
}

/// Whether an error came from the engine's I/O (after which redb must be re-opened).
pub(crate) fn needs_reopen(e: &Error) -> bool {
    match e {
        Error::StorageFull(_) => true,
        Error::Storage(m) => m.starts_with(IO_ERROR),
        _ => false,
    }
}
