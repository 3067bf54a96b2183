//! Process-wide TCP transport (one listener, lazily opened outgoing connections, per-connection reader
//! threads demultiplexing frames into mailboxes) and the bootstrap through the unique id's root.

mod bootstrap;
mod transport;

pub use bootstrap::{bootstrap_init, new_unique_id, Peer};
pub use transport::{net, Frame, Key, Kind, Net, Wait, ANY};
