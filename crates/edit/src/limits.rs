//! Limits every step shares, each with its reason. (A step's own limits stay in its module.)

/// The largest event a hub takes: 1 MiB, the Event Hubs (standard tier) and Tributary limit.
/// No honest length inside one event's body can exceed it, and no step may make an event
/// larger (a batch, a decompressed or transcoded body).
pub const HUB_EVENT_BYTES_MAX: usize = 1024 * 1024;
