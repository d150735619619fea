//! nubo-seed
