//! The built-in steps, one module each (some hold a pair: compress and decompress, batch and
//! unbatch, encrypt and decrypt, sign and verify), and the key material the cryptographic ones
//! share.

pub mod attest;
pub mod batch;
pub mod chain;
pub mod dedupe;
pub mod encrypt;
pub mod enrich;
pub mod filter;
pub mod keys;
pub mod sign;
pub mod transcode;
pub mod transform;
pub mod validate;
