//! kairos-actors: the node runtime (ractor actors), the API server and the `kairos` binary.
