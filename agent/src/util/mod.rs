//! Small helpers every layer may use (they depend on nothing else in the crate).

pub mod backoff;
pub mod fs;
pub mod log_limit;
pub mod serde_pairs;
#[cfg(test)]
pub(crate) mod testbed;
pub mod time;

/// Install ring as rustls' process-wide crypto provider (reqwest and tonic are built without
/// one); harmless when one is installed already.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
