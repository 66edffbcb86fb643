//! kairos-proto: Kairos's protobuf messages and gRPC services, generated from the `.proto`
//! files beside this crate. No logic lives here.
//!
//! - [`storage::v1`]: the records stored in the keyspace (`kairos/storage/v1/records.proto`).
//! - [`v1`]: the gRPC API (`kairos/v1/api.proto`).

pub mod codec;

/// Records stored in the keyspace.
pub mod storage {
    /// Version 1 of the stored records.
    pub mod v1 {
        #![allow(missing_docs, clippy::all)]
        include!(concat!(env!("OUT_DIR"), "/kairos.storage.v1.rs"));
    }
}

/// The gRPC API, version 1.
pub mod v1 {
    #![allow(missing_docs, clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/kairos.v1.rs"));
}
