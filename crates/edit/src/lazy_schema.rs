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
use crate::lazy::{Doc, Key, Member, MembersOf, Tape, key_text_in};

/// The representation: nodes of a tape, of values steps made, or an edited object body.
#[derive(Debug)]
pub(crate) struct LazyJson;

/// One value of a lazily read body. The body comes as text, checked as UTF-8 once per walk,
/// so the keys and strings the walk reads are slices of it without a check each.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LazyNode<'a> {
    /// A node of the body's tape.
    Tape(&'a Tape, &'a str, usize),
    /// A value a step made.
    Value(&'a Value),
    /// An object of the body with edited members (and the body's text).
    Edited(Doc<'a>, &'a str),
}

/// An object of a lazily read body.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LazyObject<'a> {
    Tape(&'a Tape, &'a str, usize),
    Map(&'a Map<String, Value>),
    Edited(Doc<'a>, &'a str),
}

/// An array of a lazily read body.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LazyArray<'a> {
    Tape(&'a Tape, &'a str, usize),
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
        return Some(LazyNode::Edited(doc, std::str::from_utf8(doc.body).ok()?));
    }
    if item.parsed().is_some() {
        return None;
    }
    let tape = item.tape()?;
    let text = std::str::from_utf8(item.raw_body()).ok()?;
    Some(LazyNode::Tape(tape, text, 0))
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
            LazyNode::Edited(doc, text) => Some(LazyObject::Edited(doc, text)),
        }
    }

    fn as_array(&self) -> Option<LazyArray<'a>> {
        match *self {
            LazyNode::Tape(tape, body, index) => tape
                .is_array_at(index)
                .then_some(LazyArray::Tape(tape, body, index)),
            LazyNode::Value(value) => value.as_array().map(|a| LazyArray::Slice(a)),
            LazyNode::Edited(..) => None,
        }
    }

    fn as_string(&self) -> Option<Cow<'a, str>> {
        match *self {
            LazyNode::Tape(tape, body, index) => tape.text_in(body, index),
            LazyNode::Value(value) => value.as_str().map(Cow::Borrowed),
            LazyNode::Edited(..) => None,
        }
    }

    fn as_number(&self) -> Option<serde_json::Number> {
        match *self {
            LazyNode::Tape(tape, body, index) => tape.number(body.as_bytes(), index),
            LazyNode::Value(Value::Number(number)) => Some(number.clone()),
            LazyNode::Value(_) | LazyNode::Edited(..) => None,
        }
    }

    fn as_boolean(&self) -> Option<bool> {
        match *self {
            LazyNode::Tape(tape, _, index) => tape.boolean(index),
            LazyNode::Value(value) => value.as_bool(),
            LazyNode::Edited(..) => None,
        }
    }

    fn is_null(&self) -> bool {
        match *self {
            LazyNode::Tape(tape, _, index) => tape.is_null(index),
            LazyNode::Value(value) => value.is_null(),
            LazyNode::Edited(..) => false,
        }
    }

    fn json_type(&self) -> JsonType {
        let name = match *self {
            LazyNode::Tape(tape, _, index) => tape.kind_name(index),
            LazyNode::Value(value) => crate::lazy::value_kind(value),
            LazyNode::Edited(..) => "object",
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
            LazyNode::Edited(..) => false,
        }
    }

    fn to_value(&self) -> Cow<'a, Value> {
        match *self {
            LazyNode::Tape(tape, body, index) => Cow::Owned(tape.to_value(body.as_bytes(), index)),
            LazyNode::Value(value) => Cow::Borrowed(value),
            LazyNode::Edited(doc, _) => Cow::Owned(doc.to_value()),
        }
    }

    fn identity(&self) -> Option<NodeIdentity> {
        Some(match *self {
            LazyNode::Tape(tape, _, index) => NodeIdentity::tagged(
                std::ptr::from_ref(tape) as usize,
                u32::try_from(index).ok()?,
            ),
            LazyNode::Value(value) => NodeIdentity::new(std::ptr::from_ref(value) as usize),
            LazyNode::Edited(doc, _) => {
                NodeIdentity::tagged(std::ptr::from_ref(doc.overlay) as usize, u32::MAX)
            }
        })
    }
}

/// Keeps the last member of each name, as a parse does.
fn last_of_each<'a>(
    members: impl Iterator<Item = (Cow<'a, str>, LazyNode<'a>)>,
) -> Vec<(Cow<'a, str>, LazyNode<'a>)> {
    let mut kept: Vec<(Cow<'a, str>, LazyNode<'a>)> = Vec::new();
    for (name, node) in members {
        match kept.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = node,
            None => kept.push((name, node)),
        }
    }
    kept
}

/// The node of a member of an edited object (of the body with text `text`).
fn member_node<'a>(doc: Doc<'a>, text: &'a str, member: &'a Member) -> LazyNode<'a> {
    match member {
        Member::Raw(index) => LazyNode::Tape(doc.tape, text, *index),
        Member::Value(value) => LazyNode::Value(value),
        Member::Shared(shared) => LazyNode::Value(shared.value()),
        Member::Object(overlay) => LazyNode::Edited(doc.nested(overlay), text),
    }
}

/// The members of a lazily read object, as a parse keeps them: straight from the tape or the
/// edited object when no key can repeat, else collected with the last copy of each name.
#[derive(Debug)]
pub(crate) enum LazyMembers<'a> {
    Tape(&'a Tape, &'a str, MembersOf<'a>),
    Edited(Doc<'a>, &'a str, std::slice::Iter<'a, (Key, Member)>),
    Map(serde_json::map::Iter<'a>),
    Kept(std::vec::IntoIter<(Cow<'a, str>, LazyNode<'a>)>),
}

impl<'a> Iterator for LazyMembers<'a> {
    type Item = (Cow<'a, str>, LazyNode<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            LazyMembers::Tape(tape, body, members) => {
                let (key, value) = members.next()?;
                let name = tape.text_in(body, key).unwrap_or_default();
                Some((name, LazyNode::Tape(tape, body, value)))
            }
            LazyMembers::Edited(doc, text, members) => {
                let (key, member) = members.next()?;
                let name = key_text_in(doc.tape, text, key);
                Some((name, member_node(*doc, text, member)))
            }
            LazyMembers::Map(members) => {
                let (key, value) = members.next()?;
                Some((Cow::Borrowed(key.as_str()), LazyNode::Value(value)))
            }
            LazyMembers::Kept(members) => members.next(),
        }
    }
}

impl<'a> LazyObject<'a> {
    /// Whether a key may appear twice, so members must be collected to keep the last copy.
    fn repeats(&self) -> bool {
        match *self {
            LazyObject::Tape(tape, _, index) => tape.repeats(index),
            LazyObject::Map(_) => false,
            LazyObject::Edited(doc, _) => doc.overlay.repeats,
        }
    }

    /// Every member in order, repeats and all.
    fn all_members(&self) -> LazyMembers<'a> {
        match *self {
            LazyObject::Tape(tape, body, index) => {
                LazyMembers::Tape(tape, body, tape.members(index))
            }
            LazyObject::Map(map) => LazyMembers::Map(map.iter()),
            LazyObject::Edited(doc, text) => {
                LazyMembers::Edited(doc, text, doc.overlay.members.iter())
            }
        }
    }
}

impl<'a> Object<'a, LazyJson> for LazyObject<'a> {
    type Node = LazyNode<'a>;
    type MemberName = Cow<'a, str>;
    type MembersIter = LazyMembers<'a>;

    fn len(&self) -> usize {
        match *self {
            LazyObject::Map(map) => map.len(),
            LazyObject::Tape(tape, _, index) if !tape.repeats(index) => tape.len(index),
            LazyObject::Edited(doc, _) if !doc.overlay.repeats => doc.overlay.members.len(),
            _ => last_of_each(self.all_members()).len(),
        }
    }

    fn get(&self, key: &String) -> Option<LazyNode<'a>> {
        match *self {
            LazyObject::Tape(tape, body, index) => tape
                .member(body.as_bytes(), index, key)
                .map(|v| LazyNode::Tape(tape, body, v)),
            LazyObject::Map(map) => map.get(key).map(LazyNode::Value),
            LazyObject::Edited(doc, text) => doc
                .position(key)
                .map(|at| member_node(doc, text, &doc.overlay.members[at].1)),
        }
    }

    fn members(&self) -> LazyMembers<'a> {
        if self.repeats() {
            LazyMembers::Kept(last_of_each(self.all_members()).into_iter())
        } else {
            self.all_members()
        }
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
