//! nubo-engine
