//! nubo-bootstrap
