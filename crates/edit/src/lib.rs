//! The event editor (Azure's "editor" replication pattern): a declarative chain of steps that
//! edits events between a source and a target — filter, transform, transcode, compress, batch
//! and unbatch, validate, enrich, de-duplicate, encrypt and decrypt, sign and verify, attest,
//! and chain — and the [`condition`] language that filters and routes share.
//!
//! A replication task compiles its `[[step]]` tables with [`spec::compile`] into an [`Editor`]
//! and runs each source batch through it before routing. A library user adds a step of their
//! own by implementing [`Step`].
//!
//! # Guarantees
//!
//! - **Order**: one partition's events leave a step in the order they came.
//! - **Accounted for**: every event is passed on, refused with a reason (for the dead-letter
//!   target) or dropped and counted under the step's name.
//! - **No panic on input**: malformed bodies, properties and signatures are refusals.
//! - **Checked before start**: a step's table, and every file it names, are read and checked
//!   when the step is compiled.
//! - **One JSON parse**: steps that read or edit JSON share one parse of the body per event
//!   ([`Item`]); filter, transform and validate read it lazily ([`lazy`]): one scan of the
//!   body, a `Value` made only of the fields they name, untouched members copied on write.

pub mod condition;
pub mod field;
pub mod item;
pub mod lazy;
mod lazy_schema;
pub mod limits;
pub mod spec;
pub mod step;
pub mod steps;

pub use condition::{Condition, ConditionError};
pub use field::{Field, FieldPath, FieldValue, SystemProperty};
pub use item::{Item, Position};
pub use spec::{CompileContext, KINDS, SpecError, compile};
pub use step::{Context, Edited, Editor, Output, Rejected, Step};
