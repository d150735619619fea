//! live harness
