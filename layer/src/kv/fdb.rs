//! The `fdb` backend (being written).
