//! The lazy document ([`crate::lazy`]) as a JSON representation `jsonschema` validates in
//! place: the validator reads only the values its schema names, so a valid body is checked
//! without making a `serde_json::Value` of all of it.
//!
//! # Guarantees
//!
//! - **Same answers as the parsed body.** Every accessor answers what the same accessor on
//!   the body's `serde_json::Value` answers: numbers and escaped strings are read by
//!   serde_json, objects with duplicate keys show the last copy of each (as a parse keeps
//!   it), and values are built for the validator's cold paths (errors, `enum`, `const`) with
//!   the same code a parse runs. A property test compares `is_valid` on both.

use std::borrow::Cow;

use jsonschema::JsonType;
use jsonschema::json::{Array, Json, Node, NodeIdentity, Object};
use serde_json::{Map, Value};

use crate::item::Item;
use crate::lazy::{Doc, Member, Tape, key_text};

/// The representation: nodes of a tape, of values steps made, or an edited object body.
#[derive(Debug)]
pub(crate) struct LazyJson;

/// One value of a lazily read body.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LazyNode<'a> {
    /// A node of the body's tape.
    Tape(&'a Tape, &'a [u8], usize),
    /// A value a step made.
    Value(&'a Value),
    /// An object body with edited members.
    Top(Doc<'a>),
}

/// An object of a lazily read body.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LazyObject<'a> {
    Tape(&'a Tape, &'a [u8], usize),
    Map(&'a Map<String, Value>),
    Top(Doc<'a>),
}

/// An array of a lazily read body.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LazyArray<'a> {
    Tape(&'a Tape, &'a [u8], usize),
    Slice(&'a [Value]),
}

impl Json for LazyJson {
    type Node<'a> = LazyNode<'a>;
    type PreparedKey = String;
    type StringBuffer = ();

    fn prepare_key(key: &str) -> String {
        key.to_owned()
    }

    fn with_string_node<T>((): &mut (), string: &str, f: impl FnOnce(LazyNode<'_>) -> T) -> T {
        let node = Value::String(string.to_owned());
        f(LazyNode::Value(&node))
    }
}

/// The body of `item` as a node to validate lazily: `None` when it is not read lazily (not
/// JSON, outside what the scanner indexes, or already parsed: then validate the `Value`).
pub(crate) fn root(item: &Item) -> Option<LazyNode<'_>> {
    if let Some(doc) = item.doc() {
        return Some(LazyNode::Top(doc));
    }
    if item.parsed().is_some() {
        return None;
    }
    let tape = item.tape()?;
    Some(LazyNode::Tape(tape, item.raw_body(), 0))
}

impl<'a> Node<'a, LazyJson> for LazyNode<'a> {
    type Object = LazyObject<'a>;
    type Array = LazyArray<'a>;
    type Number = serde_json::Number;

    fn as_object(&self) -> Option<LazyObject<'a>> {
        match *self {
            LazyNode::Tape(tape, body, index) => tape
                .is_object_at(index)
                .then_some(LazyObject::Tape(tape, body, index)),
            LazyNode::Value(value) => value.as_object().map(LazyObject::Map),
            LazyNode::Top(doc) => Some(LazyObject::Top(doc)),
        }
    }

    fn as_array(&self) -> Option<LazyArray<'a>> {
        match *self {
            LazyNode::Tape(tape, body, index) => tape
                .is_array_at(index)
                .then_some(LazyArray::Tape(tape, body, index)),
            LazyNode::Value(value) => value.as_array().map(|a| LazyArray::Slice(a)),
            LazyNode::Top(_) => None,
        }
    }

    fn as_string(&self) -> Option<Cow<'a, str>> {
        match *self {
            LazyNode::Tape(tape, body, index) => tape.text(body, index),
            LazyNode::Value(value) => value.as_str().map(Cow::Borrowed),
            LazyNode::Top(_) => None,
        }
    }

    fn as_number(&self) -> Option<serde_json::Number> {
        match *self {
            LazyNode::Tape(tape, body, index) => tape.number(body, index),
            LazyNode::Value(Value::Number(number)) => Some(number.clone()),
            LazyNode::Value(_) | LazyNode::Top(_) => None,
        }
    }

    fn as_boolean(&self) -> Option<bool> {
        match *self {
            LazyNode::Tape(tape, _, index) => tape.boolean(index),
            LazyNode::Value(value) => value.as_bool(),
            LazyNode::Top(_) => None,
        }
    }

    fn is_null(&self) -> bool {
        match *self {
            LazyNode::Tape(tape, _, index) => tape.is_null(index),
            LazyNode::Value(value) => value.is_null(),
            LazyNode::Top(_) => false,
        }
    }

    fn json_type(&self) -> JsonType {
        let name = match *self {
            LazyNode::Tape(tape, _, index) => tape.kind_name(index),
            LazyNode::Value(value) => crate::lazy::value_kind(value),
            LazyNode::Top(_) => "object",
        };
        match name {
            "null" => JsonType::Null,
            "boolean" => JsonType::Boolean,
            "number" => JsonType::Number,
            "string" => JsonType::String,
            "array" => JsonType::Array,
            _ => JsonType::Object,
        }
    }

    fn is_string(&self) -> bool {
        match *self {
            LazyNode::Tape(tape, _, index) => tape.is_string(index),
            LazyNode::Value(value) => value.is_string(),
            LazyNode::Top(_) => false,
        }
    }

    fn to_value(&self) -> Cow<'a, Value> {
        match *self {
            LazyNode::Tape(tape, body, index) => Cow::Owned(tape.to_value(body, index)),
            LazyNode::Value(value) => Cow::Borrowed(value),
            LazyNode::Top(doc) => Cow::Owned(doc.to_value()),
        }
    }

    fn identity(&self) -> Option<NodeIdentity> {
        Some(match *self {
            LazyNode::Tape(tape, _, index) => NodeIdentity::tagged(
                std::ptr::from_ref(tape) as usize,
                u32::try_from(index).ok()?,
            ),
            LazyNode::Value(value) => NodeIdentity::new(std::ptr::from_ref(value) as usize),
            LazyNode::Top(doc) => {
                NodeIdentity::tagged(std::ptr::from_ref(doc.overlay) as usize, u32::MAX)
            }
        })
    }
}

/// Keeps the last member of each name, as a parse does.
fn last_of_each<'a>(
    members: Vec<(Cow<'a, str>, LazyNode<'a>)>,
) -> Vec<(Cow<'a, str>, LazyNode<'a>)> {
    let mut kept: Vec<(Cow<'a, str>, LazyNode<'a>)> = Vec::with_capacity(members.len());
    for (name, node) in members {
        match kept.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = node,
            None => kept.push((name, node)),
        }
    }
    kept
}

impl<'a> LazyObject<'a> {
    fn all_members(&self) -> Vec<(Cow<'a, str>, LazyNode<'a>)> {
        match *self {
            LazyObject::Tape(tape, body, index) => last_of_each(
                tape.members(index)
                    .map(|(k, v)| {
                        let name = tape.text(body, k).unwrap_or_default();
                        (name, LazyNode::Tape(tape, body, v))
                    })
                    .collect(),
            ),
            LazyObject::Map(map) => map
                .iter()
                .map(|(k, v)| (Cow::Borrowed(k.as_str()), LazyNode::Value(v)))
                .collect(),
            LazyObject::Top(doc) => last_of_each(
                doc.overlay
                    .members
                    .iter()
                    .map(|(key, member)| {
                        let node = match member {
                            Member::Raw(index) => LazyNode::Tape(doc.tape, doc.body, *index),
                            Member::Value(value) => LazyNode::Value(value),
                        };
                        (key_text(doc.tape, doc.body, key), node)
                    })
                    .collect(),
            ),
        }
    }
}

impl<'a> Object<'a, LazyJson> for LazyObject<'a> {
    type Node = LazyNode<'a>;
    type MemberName = Cow<'a, str>;
    type MembersIter = std::vec::IntoIter<(Cow<'a, str>, LazyNode<'a>)>;

    fn len(&self) -> usize {
        match *self {
            LazyObject::Map(map) => map.len(),
            _ => self.all_members().len(),
        }
    }

    fn get(&self, key: &String) -> Option<LazyNode<'a>> {
        match *self {
            LazyObject::Tape(tape, body, index) => tape
                .member(body, index, key)
                .map(|v| LazyNode::Tape(tape, body, v)),
            LazyObject::Map(map) => map.get(key).map(LazyNode::Value),
            LazyObject::Top(doc) => doc
                .position(key)
                .map(|at| match &doc.overlay.members[at].1 {
                    Member::Raw(index) => LazyNode::Tape(doc.tape, doc.body, *index),
                    Member::Value(value) => LazyNode::Value(value),
                }),
        }
    }

    fn members(&self) -> Self::MembersIter {
        self.all_members().into_iter()
    }
}

impl<'a> Array<'a, LazyJson> for LazyArray<'a> {
    type Node = LazyNode<'a>;
    type ElementsIter = std::vec::IntoIter<LazyNode<'a>>;

    fn len(&self) -> usize {
        match *self {
            LazyArray::Tape(tape, _, index) => tape.len(index),
            LazyArray::Slice(slice) => slice.len(),
        }
    }

    fn elements(&self) -> Self::ElementsIter {
        match *self {
            LazyArray::Tape(tape, body, index) => tape
                .elements(index)
                .map(|e| LazyNode::Tape(tape, body, e))
                .collect::<Vec<_>>()
                .into_iter(),
            LazyArray::Slice(slice) => slice
                .iter()
                .map(LazyNode::Value)
                .collect::<Vec<_>>()
                .into_iter(),
        }
    }
}
