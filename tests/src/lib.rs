//! End-to-end tests that start real `kairos` processes; see `tests/tests/`.
