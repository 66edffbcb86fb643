//! kairos-sdk: client and worker SDK over gRPC, and the `kairosctl` console. Arrives with the API issue.
