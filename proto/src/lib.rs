//! kairos-proto: the `kairos.v1` gRPC API (.proto files and generated code). The services arrive with the API issue.
