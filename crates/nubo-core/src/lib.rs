//! nubo's shared vocabulary. Pure except for [`atomic`], the one helper every crate uses to
//! write records.

pub mod alloc;
pub mod atomic;
pub mod cancel;
pub mod child;
pub mod duration;
pub mod error;
pub mod file;
pub mod fsmode;
pub mod hex;
pub mod input;
pub mod limits;
pub mod name;
pub mod port;
pub mod roots;
pub mod size;
pub mod state;

pub use atomic::{write_atomic, write_atomic_unsynced, write_json_atomic, write_json_atomic_unsynced};
pub use cancel::{Cancel, Deadline};
pub use error::ErrorKind;
pub use file::FileError;
pub use hex::hex;
pub use name::{NameError, VmName};
pub use port::{PortForward, Protocol};
pub use roots::{RootEnv, Roots, RootsError};
pub use size::{ByteSize, SizeError};
pub use state::VmState;
