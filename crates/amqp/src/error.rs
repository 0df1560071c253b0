//! Errors of the AMQP front door that reach its owner (the listener, the access policies).
//!
//! Errors a peer causes never reach here: they are answered on the wire (a rejected delivery, a
//! detach or a CBS status code) and the connection goes on or is closed.

use std::path::PathBuf;

/// An error starting the server or handling the access policies.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AmqpError {
    /// The listener could not bind its address.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing the access policies file failed.
    #[error("{op} {path}: {source}")]
    PoliciesIo {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The access policies file is not valid.
    #[error("{path}: {reason}")]
    PoliciesInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The access policies file may be read by group or others: it holds keys.
    #[error(
        "{} holds secret keys but is readable by group or others (mode {mode:o}); run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    PoliciesExposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// An access policy is not valid (empty name, duplicate, empty key, no rights).
    #[error("invalid access policy: {0}")]
    InvalidPolicy(String),
    /// No policy of that name in that scope.
    #[error("there is no shared access policy {name:?} in {scope} (there are: {})", if known.is_empty() { "none".to_owned() } else { known.join(", ") })]
    PolicyNotFound {
        /// The namespace or the event hub, in words.
        scope: String,
        /// The name asked for.
        name: String,
        /// The names there are.
        known: Vec<String>,
    },
    /// A policy of that name already exists in that scope.
    #[error(
        "{scope} already has a shared access policy {name:?}; regenerate its keys with `policy rotate`, or choose another name"
    )]
    PolicyExists {
        /// The namespace or the event hub, in words.
        scope: String,
        /// The name.
        name: String,
    },
    /// The system's random source failed while making a key.
    #[error("cannot generate a random key: {0}")]
    Random(String),
}
