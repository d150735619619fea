//! nubo-disk
