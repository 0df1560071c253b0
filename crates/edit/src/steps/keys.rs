//! Key material for the cryptographic steps. (Being written.)
