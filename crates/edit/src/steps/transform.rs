//! `transform`: reshapes a JSON body in place — keep some fields (`pick`), remove some
//! (`drop`), move some (`rename`), write some (`set`) and flatten nested objects (`flatten`).
//!
//! ```toml
//! [[step]]
//! kind = "transform"
//! pick = ["id", "reading"]                        # keep only these (nesting kept)
//! drop = ["reading.raw"]                          # then remove these
//! rename = { "reading.temperature" = "temp" }     # then move from → to
//! set = { "source" = "eu-west", "meta.version" = 2 }  # then write these
//! flatten = "_"                                   # then {"a":{"b":1}} → {"a_b":1}
//! non_json = "reject"                             # or "pass", "drop"
//! ```
//!
//! # Guarantees
//!
//! - **One fixed order**: pick, drop, rename, set, flatten, whatever order the keys are written
//!   in. Renames happen at once (every source is taken out, then each is put at its target),
//!   so `a → b` with `b → a` swaps; sets are applied in path order (they cannot overlap).
//! - **One parse**: the body is edited through the shared parse ([`Item::json_mut`]); paths
//!   and set values are compiled once.
//! - **All or nothing**: an event the step refuses is refused before anything is changed, and
//!   carries its body as it came. Every refusal is decided up front: a `set` or rename
//!   target through a field that is not an object (checked on the body as it came; targets
//!   may not overlap one another, so no edit can change the answer), a `pick`/`set`/`rename`
//!   on a body that is not a JSON object, and a `flatten` that would write one key twice
//!   (`{"a.b":1,"a":{"b":2}}`; only bodies with a key holding the separator can do this, and
//!   only those are copied first so the original can be given back).
//! - A rename whose source is missing moves nothing; a drop of a missing field does nothing.
//! - `flatten` joins nested object keys with the separator (default `.`); arrays and empty
//!   objects are kept as values. Only the body's own objects are flattened, not objects
//!   inside arrays.
//!
//! In TOML, quote dotted paths used as keys (`set = { "meta.version" = 2 }`): a bare
//! `meta.version = 2` is a TOML dotted key and sets `meta` to the object `{"version": 2}`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::field::{FieldPath, Segment};
use crate::item::Item;
use crate::lazy::{DocMut, Member, Shared, Tape};
use crate::spec::{CompileContext, SpecError};
use crate::step::{Context, Output, Step};

/// What the step does with a body that is not JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NonJson {
    /// Refuse it (for the dead-letter target).
    #[default]
    Reject,
    /// Pass it on unchanged.
    Pass,
    /// Drop it (counted).
    Drop,
}

/// `flatten = true` (separator `.`) or `flatten = "<separator>"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum FlattenSpec {
    /// On (with `.`) or off.
    On(bool),
    /// On, joining keys with this separator.
    Separator(String),
}

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformSpec {
    /// Body paths to keep (everything else is removed); nesting is kept.
    #[serde(default)]
    pub pick: Vec<String>,
    /// Body paths to remove.
    #[serde(default)]
    pub drop: Vec<String>,
    /// From path → to path.
    #[serde(default)]
    pub rename: BTreeMap<String, String>,
    /// Path → value to write (any TOML value).
    #[serde(default)]
    pub set: BTreeMap<String, Value>,
    /// Flatten nested objects into top-level keys.
    #[serde(default)]
    pub flatten: Option<FlattenSpec>,
    /// What to do with a body that is not JSON (default: reject).
    #[serde(default)]
    pub non_json: NonJson,
}

/// The key toml's deserializer gives a datetime (a one-key table); a set value holding one is
/// written as its text.
const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

/// The separator `flatten = true` joins keys with.
const FLATTEN_SEPARATOR_DEFAULT: &str = ".";

/// A place a `set` or rename target passes through that must not hold a non-object: checked on
/// the body as it came, since no earlier operation of the step can change what is there.
#[derive(Debug)]
struct Guard {
    prefix: FieldPath,
    target: FieldPath,
}

#[derive(Debug)]
struct Flatten {
    separator: String,
    /// A target or set value has a key holding the separator: every body may collide, so
    /// every body is copied first.
    always_copy: bool,
}

#[derive(Debug)]
struct Transform {
    name: String,
    pick: Vec<FieldPath>,
    drop: Vec<FieldPath>,
    renames: Vec<(FieldPath, FieldPath)>,
    /// Some rename's target overlaps another's source: take every source out first.
    renames_interfere: bool,
    sets: Vec<(FieldPath, Value)>,
    /// The set values again, each written out once, for bodies edited member by member.
    shared: Vec<Arc<Shared>>,
    guards: Vec<Guard>,
    flatten: Option<Flatten>,
    /// pick, rename or set need the body to be an object.
    needs_object: bool,
    /// No pick and no flatten: an object body is edited member by member ([`crate::lazy`]).
    member_wise: bool,
    non_json: NonJson,
}

pub(crate) fn compile(
    name: String,
    spec: TransformSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let pick = paths("pick", &spec.pick)?;
    check_pick(&pick)?;
    let drop = paths("drop", &spec.drop)?;
    let renames = compile_renames(&spec.rename)?;
    let sets = compile_sets(spec.set)?;
    let targets: Vec<&FieldPath> = renames
        .iter()
        .map(|(_, to)| to)
        .chain(sets.iter().map(|(path, _)| path))
        .collect();
    check_targets(&targets)?;
    let sources: Vec<&FieldPath> = renames.iter().map(|(from, _)| from).collect();
    let guards = guards(&targets, &pick, &drop, &sources);
    let renames_interfere = renames.iter().any(|(_, to)| {
        renames
            .iter()
            .any(|(from, _)| overlaps(from.segments(), to.segments()))
    });
    let flatten = compile_flatten(spec.flatten, &targets, &sets)?;
    if pick.is_empty()
        && drop.is_empty()
        && renames.is_empty()
        && sets.is_empty()
        && flatten.is_none()
    {
        return Err(SpecError::table(
            "a transform needs at least one of pick, drop, rename, set, flatten",
        ));
    }
    Ok(Arc::new(Transform {
        name,
        member_wise: pick.is_empty() && flatten.is_none(),
        needs_object: !pick.is_empty() || !targets.is_empty(),
        pick,
        drop,
        renames,
        renames_interfere,
        shared: sets
            .iter()
            .map(|(_, value)| Shared::new(value.clone()))
            .collect(),
        sets,
        guards,
        flatten,
        non_json: spec.non_json,
    }))
}

fn paths(key: &str, texts: &[String]) -> Result<Vec<FieldPath>, SpecError> {
    texts.iter().map(|text| path(key, text)).collect()
}

fn path(key: &str, text: &str) -> Result<FieldPath, SpecError> {
    FieldPath::parse(text).map_err(|e| {
        SpecError::at(
            key,
            format!("{text:?}: {e} (write a body path such as reading.temperature)"),
        )
    })
}

/// Whether `a` is `b` or one of its ancestors.
fn is_prefix(a: &[Segment], b: &[Segment]) -> bool {
    b.starts_with(a)
}

fn overlaps(a: &[Segment], b: &[Segment]) -> bool {
    is_prefix(a, b) || is_prefix(b, a)
}

fn has_index(path: &FieldPath) -> bool {
    path.segments()
        .iter()
        .any(|s| matches!(s, Segment::Index(_)))
}

fn check_pick(pick: &[FieldPath]) -> Result<(), SpecError> {
    for (i, a) in pick.iter().enumerate() {
        if has_index(a) {
            return Err(SpecError::at(
                "pick",
                format!("{a}: pick keeps object fields; name the array itself, not an element"),
            ));
        }
        if let Some(b) = pick[i + 1..]
            .iter()
            .find(|b| overlaps(a.segments(), b.segments()))
        {
            return Err(SpecError::at(
                "pick",
                format!("{a} and {b} overlap; keep only the outer one"),
            ));
        }
    }
    Ok(())
}

fn compile_renames(
    rename: &BTreeMap<String, String>,
) -> Result<Vec<(FieldPath, FieldPath)>, SpecError> {
    let mut renames = Vec::with_capacity(rename.len());
    for (from, to) in rename {
        let from = path("rename", from)?;
        let to = path("rename", to)?;
        if from == to {
            return Err(SpecError::at(
                "rename",
                format!("{from} is renamed to itself"),
            ));
        }
        if let Some((other, _)) = renames.iter().find(|(other, _): &&(FieldPath, FieldPath)| {
            overlaps(other.segments(), from.segments())
        }) {
            return Err(SpecError::at(
                "rename",
                format!("sources {other} and {from} overlap; rename the outer one only"),
            ));
        }
        renames.push((from, to));
    }
    Ok(renames)
}

fn compile_sets(set: BTreeMap<String, Value>) -> Result<Vec<(FieldPath, Value)>, SpecError> {
    set.into_iter()
        .map(|(text, value)| Ok((path("set", &text)?, toml_datetimes_as_text(value))))
        .collect()
}

/// TOML datetimes reach a JSON value as `{"$__toml_private_datetime": "<text>"}`; JSON has no
/// datetime, so they are written as their RFC 3339 text.
fn toml_datetimes_as_text(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            if map.len() == 1
                && let Some(Value::String(text)) = map.get(TOML_DATETIME_KEY)
            {
                return Value::String(text.clone());
            }
            Value::Object(
                map.into_iter()
                    .map(|(k, v)| (k, toml_datetimes_as_text(v)))
                    .collect(),
            )
        }
        Value::Array(items) => {
            Value::Array(items.into_iter().map(toml_datetimes_as_text).collect())
        }
        other => other,
    }
}

/// Targets (rename targets and set paths) name object keys and do not overlap, so writing one
/// never changes what another passes through.
fn check_targets(targets: &[&FieldPath]) -> Result<(), SpecError> {
    for (i, a) in targets.iter().enumerate() {
        if has_index(a) {
            return Err(SpecError::table(format!(
                "{a}: rename targets and set paths name object keys, not array elements"
            )));
        }
        if let Some(b) = targets[i + 1..]
            .iter()
            .find(|b| overlaps(a.segments(), b.segments()))
        {
            return Err(SpecError::table(format!(
                "rename targets and set paths {a} and {b} overlap; write the outer one as an \
                 object instead"
            )));
        }
    }
    Ok(())
}

/// The places each target passes through that still hold what the body came with when the
/// target is written (not removed by a drop or rename, not left out by pick).
fn guards(
    targets: &[&FieldPath],
    pick: &[FieldPath],
    drop: &[FieldPath],
    sources: &[&FieldPath],
) -> Vec<Guard> {
    let mut seen = HashSet::new();
    let mut guards = Vec::new();
    for target in targets {
        let segments = target.segments();
        for end in 1..segments.len() {
            let prefix = &segments[..end];
            let cleared = drop.iter().any(|d| is_prefix(d.segments(), prefix))
                || sources.iter().any(|s| is_prefix(s.segments(), prefix))
                || (!pick.is_empty() && !pick.iter().any(|p| is_prefix(p.segments(), prefix)));
            if cleared || !seen.insert(prefix.to_vec()) {
                continue;
            }
            if let Ok(prefix) = FieldPath::new(prefix.to_vec()) {
                guards.push(Guard {
                    prefix,
                    target: (*target).clone(),
                });
            }
        }
    }
    guards
}

fn compile_flatten(
    flatten: Option<FlattenSpec>,
    targets: &[&FieldPath],
    sets: &[(FieldPath, Value)],
) -> Result<Option<Flatten>, SpecError> {
    let separator = match flatten {
        None | Some(FlattenSpec::On(false)) => return Ok(None),
        Some(FlattenSpec::On(true)) => FLATTEN_SEPARATOR_DEFAULT.to_owned(),
        Some(FlattenSpec::Separator(separator)) if separator.is_empty() => {
            return Err(SpecError::at(
                "flatten",
                "the separator is empty; write true (for \".\") or a separator such as \"_\"",
            ));
        }
        Some(FlattenSpec::Separator(separator)) => separator,
    };
    let always_copy = targets.iter().any(|t| {
        t.segments()
            .iter()
            .any(|s| matches!(s, Segment::Key(k) if k.contains(separator.as_str())))
    }) || sets.iter().any(|(_, v)| has_key_with(v, &separator));
    Ok(Some(Flatten {
        separator,
        always_copy,
    }))
}

/// Whether an object of `value` that flatten would take apart has a key holding `separator`.
fn has_key_with(value: &Value, separator: &str) -> bool {
    match value {
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k.contains(separator) || has_key_with(v, separator)),
        _ => false,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

impl Transform {
    /// Why the body cannot be transformed, decided before anything is changed.
    fn refusal(&self, value: &Value) -> Option<String> {
        if self.needs_object && !value.is_object() {
            return Some(format!(
                "the body is a JSON {}, not an object: pick, rename and set edit object fields",
                kind(value)
            ));
        }
        self.guards.iter().find_map(|guard| {
            let found = guard.prefix.get(value)?;
            (!found.is_object()).then(|| {
                format!(
                    "cannot write {}: {} is a {}, not an object",
                    guard.target,
                    guard.prefix,
                    kind(found)
                )
            })
        })
    }

    /// Applies every operation; `Err` only for a flatten collision (the body is then partly
    /// edited: the caller restores its copy).
    fn edit(&self, value: &mut Value) -> Result<(), String> {
        if !self.pick.is_empty() {
            let mut old = std::mem::take(value);
            let mut new = Value::Object(Map::new());
            for path in &self.pick {
                if let Some(found) = path.remove(&mut old) {
                    // Pick paths name keys only and do not overlap, and `new` is an object.
                    set(path, &mut new, found)?;
                }
            }
            *value = new;
        }
        for path in &self.drop {
            path.remove(value);
        }
        self.rename(value)?;
        for (path, new) in &self.sets {
            set(path, value, new.clone())?;
        }
        match &self.flatten {
            Some(flatten) => flatten_object(value, &flatten.separator),
            None => Ok(()),
        }
    }

    fn rename(&self, value: &mut Value) -> Result<(), String> {
        if !self.renames_interfere {
            for (from, to) in &self.renames {
                if let Some(found) = from.remove(value) {
                    set(to, value, found)?;
                }
            }
            return Ok(());
        }
        let taken: Vec<Option<Value>> = self
            .renames
            .iter()
            .map(|(from, _)| from.remove(value))
            .collect();
        for ((_, to), found) in self.renames.iter().zip(taken) {
            if let Some(found) = found {
                set(to, value, found)?;
            }
        }
        Ok(())
    }

    /// Whether the body must be copied before editing, so a flatten collision can give it back.
    fn needs_copy(&self, value: &Value) -> bool {
        self.flatten
            .as_ref()
            .is_some_and(|f| f.always_copy || has_key_with(value, &f.separator))
    }
}

/// Writes `new` at `path`; the guards make a failure impossible, but a failure is still a
/// refusal rather than a panic.
fn set(path: &FieldPath, value: &mut Value, new: Value) -> Result<(), String> {
    path.set(value, new).map_err(|_| {
        format!("cannot write {path}: it passes through a value that is not an object")
    })
}

/// Moves every leaf of nested objects to a top-level key joined by `separator`.
fn flatten_object(value: &mut Value, separator: &str) -> Result<(), String> {
    let Value::Object(map) = value else {
        return Ok(());
    };
    if !map
        .values()
        .any(|v| matches!(v, Value::Object(m) if !m.is_empty()))
    {
        return Ok(());
    }
    let mut flat = Map::new();
    for (key, child) in std::mem::take(map) {
        flatten_into(&mut flat, key, child, separator)?;
    }
    *map = flat;
    Ok(())
}

fn flatten_into(
    flat: &mut Map<String, Value>,
    key: String,
    value: Value,
    sep: &str,
) -> Result<(), String> {
    match value {
        Value::Object(children) if !children.is_empty() => {
            for (child_key, child) in children {
                let mut joined = String::with_capacity(key.len() + sep.len() + child_key.len());
                joined.push_str(&key);
                joined.push_str(sep);
                joined.push_str(&child_key);
                flatten_into(flat, joined, child, sep)?;
            }
            Ok(())
        }
        leaf => match flat.entry(key) {
            serde_json::map::Entry::Occupied(slot) => Err(format!(
                "flatten would write the key {:?} twice (a key holding the separator {sep:?} \
                 meets a nested field); choose another separator",
                slot.key()
            )),
            serde_json::map::Entry::Vacant(slot) => {
                slot.insert(leaf);
                Ok(())
            }
        },
    }
}

impl Transform {
    /// Edits an object body member by member without parsing all of it (drop, rename and set
    /// only: pick and flatten rebuild the whole body); `None` when the body is not one the
    /// lazy document takes, and the caller edits the parsed value.
    fn edit_members(&self, item: &mut Item) -> Option<Result<(), String>> {
        if !item.tape().is_some_and(Tape::is_object) && item.doc().is_none() {
            return None;
        }
        // Refusals first, so a refused body is left exactly as it came.
        for guard in &self.guards {
            match item.lazy_kind(guard.prefix.segments())? {
                Some(kind) if kind != "object" => {
                    return Some(Err(format!(
                        "cannot write {}: {} is a {kind}, not an object",
                        guard.target, guard.prefix
                    )));
                }
                _ => {}
            }
        }
        let mut doc = item.doc_mut()?;
        Some(self.edit_doc(&mut doc))
    }

    fn edit_doc(&self, doc: &mut DocMut<'_>) -> Result<(), String> {
        for path in &self.drop {
            doc.remove(path.segments());
        }
        if self.renames_interfere {
            let taken: Vec<Option<Member>> = self
                .renames
                .iter()
                .map(|(from, _)| doc.remove(from.segments()))
                .collect();
            for ((_, to), found) in self.renames.iter().zip(taken) {
                if let Some(found) = found {
                    doc_set(doc, to, found)?;
                }
            }
        } else {
            for (from, to) in &self.renames {
                if let Some(found) = doc.remove(from.segments()) {
                    doc_set(doc, to, found)?;
                }
            }
        }
        for ((path, _), new) in self.sets.iter().zip(&self.shared) {
            doc_set(doc, path, Member::Shared(Arc::clone(new)))?;
        }
        Ok(())
    }
}

fn doc_set(doc: &mut DocMut<'_>, path: &FieldPath, new: Member) -> Result<(), String> {
    doc.set(path.segments(), new).map_err(|()| {
        format!("cannot write {path}: it passes through a value that is not an object")
    })
}

impl Step for Transform {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, _context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for mut item in items {
            if self.member_wise {
                match self.edit_members(&mut item) {
                    Some(Ok(())) => {
                        out.pass(item);
                        continue;
                    }
                    Some(Err(reason)) => {
                        out.reject(item, reason);
                        continue;
                    }
                    None => {}
                }
            }
            let Some(value) = item.json() else {
                match self.non_json {
                    NonJson::Reject => out.reject(item, "the body is not JSON"),
                    NonJson::Pass => out.pass(item),
                    NonJson::Drop => out.drop_item(item),
                }
                continue;
            };
            if let Some(reason) = self.refusal(value) {
                out.reject(item, reason);
                continue;
            }
            let copy = self.needs_copy(value).then(|| value.clone());
            let Some(value) = item.json_mut() else {
                out.reject(item, "the body is not JSON");
                continue;
            };
            match (self.edit(value), copy) {
                (Ok(()), _) => out.pass(item),
                (Err(reason), Some(copy)) => {
                    item.set_json(copy);
                    out.reject(item, reason);
                }
                (Err(reason), None) => out.reject(item, reason),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;
    use tributary_event::EventData;

    use super::*;
    use crate::item::Position;
    use crate::step::Edited;

    fn compile_json(keys: Value) -> Result<Arc<dyn Step>, SpecError> {
        crate::spec::compile("transform", None, keys, &CompileContext::new("."))
    }

    fn run(keys: Value, bodies: &[&str]) -> Edited {
        let step = compile_json(keys).expect("compiles");
        let items = bodies
            .iter()
            .map(|body| {
                let position = Position {
                    sequence_number: 1,
                    offset: 1,
                    enqueued_time_ms: 1,
                };
                Item::new(EventData::new(body.to_string()), position)
            })
            .collect();
        let context = Context {
            partition: "0",
            now_ms: 0,
        };
        crate::step::Editor::new(vec![step]).apply(&context, items)
    }

    fn one(keys: Value, body: &str) -> Value {
        let mut edited = run(keys, &[body]);
        assert!(edited.rejected.is_empty(), "{:?}", edited.rejected);
        let item = edited.passed.pop().expect("passed");
        serde_json::from_slice(&item.into_event().body).expect("JSON out")
    }

    const READING: &str = r#"{"id":"d-17","debug":true,
        "reading":{"temperature":21.5,"humidity":40,"raw":{"trace":"ab12"}},
        "tags":["a","b"]}"#;

    #[test]
    fn pick_keeps_only_the_named_fields_with_their_nesting() {
        let body = one(json!({"pick": ["id", "reading.temperature"]}), READING);
        assert_eq!(
            body,
            json!({"id": "d-17", "reading": {"temperature": 21.5}})
        );
        let body = one(json!({"pick": ["missing", "tags"]}), READING);
        assert_eq!(body, json!({"tags": ["a", "b"]}));
    }

    #[test]
    fn drop_removes_fields_and_ignores_missing_ones() {
        let body = one(
            json!({"drop": ["debug", "reading.raw.trace", "nope.x"]}),
            READING,
        );
        assert_eq!(body["reading"]["raw"], json!({}));
        assert!(body.get("debug").is_none());
        assert_eq!(body["tags"], json!(["a", "b"]));
        let body = one(json!({"drop": ["tags[0]"]}), READING);
        assert_eq!(body["tags"], json!(["b"]));
    }

    #[test]
    fn rename_moves_across_levels_swaps_and_skips_missing_sources() {
        let keys =
            json!({"rename": {"reading.temperature": "temp", "id": "device.id", "nope": "x"}});
        let body = one(keys, READING);
        assert_eq!(body["temp"], 21.5);
        assert_eq!(body["device"], json!({"id": "d-17"}));
        assert!(body["reading"].get("temperature").is_none());
        assert!(body.get("x").is_none());
        let body = one(json!({"rename": {"a": "b", "b": "a"}}), r#"{"a":1,"b":2}"#);
        assert_eq!(body, json!({"a": 2, "b": 1}));
        let body = one(json!({"rename": {"a": "a.inner"}}), r#"{"a":1}"#);
        assert_eq!(body, json!({"a": {"inner": 1}}));
    }

    #[test]
    fn set_writes_any_value_making_objects_on_the_way() {
        let keys = json!({"set": {"source": "eu-west", "meta.version": 2, "meta.flags": [true]}});
        let body = one(keys, READING);
        assert_eq!(body["source"], "eu-west");
        assert_eq!(body["meta"], json!({"version": 2, "flags": [true]}));
        let keys = json!({"set": {"at": {"$__toml_private_datetime": "2024-05-01T12:00:00Z"}}});
        assert_eq!(one(keys, "{}")["at"], "2024-05-01T12:00:00Z");
    }

    #[test]
    fn flatten_joins_nested_keys_and_keeps_arrays() {
        let body = one(json!({"flatten": true}), READING);
        assert_eq!(body["reading.temperature"], 21.5);
        assert_eq!(body["reading.raw.trace"], "ab12");
        assert_eq!(body["tags"], json!(["a", "b"]));
        assert!(body.get("reading").is_none());
        let body = one(
            json!({"flatten": "_"}),
            r#"{"a":{"b":{"c":1},"e":{}},"l":[{"x":{"y":1}}]}"#,
        );
        assert_eq!(body, json!({"a_b_c": 1, "a_e": {}, "l": [{"x": {"y": 1}}]}));
    }

    #[test]
    fn operations_run_pick_drop_rename_set_flatten_whatever_the_key_order() {
        let keys = json!({
            "flatten": "_",
            "set": {"reading.unit": "C", "debug": "set after pick"},
            "rename": {"reading.temperature": "temp", "reading.raw": "raw"},
            "drop": ["reading.raw"],
            "pick": ["id", "reading"],
        });
        let body = one(keys, READING);
        // pick removed debug and tags; set wrote debug back after it; drop removed raw before
        // the rename could move it; flatten saw the set field.
        assert_eq!(
            body,
            json!({"id": "d-17", "temp": 21.5, "reading_humidity": 40, "reading_unit": "C",
                   "debug": "set after pick"})
        );
    }

    #[test]
    fn a_write_through_a_non_object_is_refused_with_the_body_as_it_came() {
        let keys = json!({"drop": ["debug"], "set": {"meta.version": 2}});
        let edited = run(keys, &[r#"{"debug":1,"meta":"v1"}"#]);
        assert_eq!(edited.rejected.len(), 1);
        let rejected = &edited.rejected[0];
        assert!(
            rejected.reason.contains("meta.version"),
            "{}",
            rejected.reason
        );
        assert!(
            rejected.reason.contains("meta is a string"),
            "{}",
            rejected.reason
        );
        let mut item = rejected.item.clone();
        let body: Value = serde_json::from_slice(item.body()).expect("JSON");
        assert_eq!(body, json!({"debug": 1, "meta": "v1"}));
        // Dropped before the write: nothing in the way.
        let body = one(
            json!({"drop": ["meta"], "set": {"meta.version": 2}}),
            r#"{"meta":"v1"}"#,
        );
        assert_eq!(body, json!({"meta": {"version": 2}}));
    }

    #[test]
    fn bodies_that_are_not_objects_or_not_json_follow_the_rules() {
        let edited = run(json!({"pick": ["a"]}), &["[1,2]"]);
        assert!(
            edited.rejected[0]
                .reason
                .contains("JSON array, not an object")
        );
        assert_eq!(one(json!({"drop": ["a"]}), "[1,2]"), json!([1, 2]));
        let edited = run(json!({"drop": ["a"]}), &["not json"]);
        assert_eq!(edited.rejected[0].reason, "the body is not JSON");
        let edited = run(json!({"drop": ["a"], "non_json": "pass"}), &["not json"]);
        assert_eq!(edited.passed.len(), 1);
        let edited = run(json!({"drop": ["a"], "non_json": "drop"}), &["not json"]);
        assert_eq!(edited.dropped, vec![("transform".to_owned(), 1)]);
    }

    #[test]
    fn a_flatten_collision_is_refused_with_the_body_as_it_came() {
        let edited = run(
            json!({"flatten": true, "drop": ["x"]}),
            &[r#"{"a.b":1,"a":{"b":2},"x":0}"#],
        );
        assert_eq!(edited.rejected.len(), 1);
        assert!(
            edited.rejected[0].reason.contains("\"a.b\" twice"),
            "{}",
            edited.rejected[0].reason
        );
        let mut item = edited.rejected[0].item.clone();
        let body: Value = serde_json::from_slice(item.body()).expect("JSON");
        assert_eq!(body, json!({"a.b": 1, "a": {"b": 2}, "x": 0}));
        // Already flat: a dotted key alone is no collision.
        assert_eq!(
            one(json!({"flatten": true}), r#"{"a.b":1,"c":{"d":2}}"#),
            json!({"a.b": 1, "c.d": 2})
        );
    }

    #[test]
    fn bad_tables_are_refused_with_the_key_and_a_fix() {
        let error = |keys: Value| compile_json(keys).expect_err("refused").to_string();
        assert!(error(json!({})).contains("at least one of"));
        assert!(error(json!({"pick": ["a..b"]})).starts_with("pick: "));
        assert!(error(json!({"pick": ["a", "a.b"]})).contains("overlap"));
        assert!(error(json!({"pick": ["a[0]"]})).contains("not an element"));
        assert!(error(json!({"set": {"a": 1, "a.b": 2}})).contains("overlap"));
        assert!(error(json!({"set": {"a": 1}, "rename": {"b": "a"}})).contains("overlap"));
        assert!(error(json!({"rename": {"a": "a"}})).contains("itself"));
        assert!(error(json!({"rename": {"a": "x", "a.b": "y"}})).contains("overlap"));
        assert!(error(json!({"set": {"l[0]": 1}})).contains("not array elements"));
        assert!(error(json!({"flatten": ""})).starts_with("flatten: "));
        assert!(error(json!({"pick": ["a"], "keep": ["b"]})).contains("unknown field"));
        assert!(error(json!({"drop": ["a"], "non_json": "skip"})).contains("unknown variant"));
    }

    proptest! {
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256),
                                        nested in "[a-c.]{0,6}") {
            let keys = json!({"pick": ["a", "b"], "rename": {"a": "c.d"}, "set": {"b.e": 1},
                              "flatten": true, "non_json": "pass"});
            let step = compile_json(keys).expect("compiles");
            let context = Context { partition: "0", now_ms: 0 };
            let position = Position { sequence_number: 0, offset: 0, enqueued_time_ms: 0 };
            let json_body = format!(r#"{{"a":{{"{nested}":1}},"b":{{"{nested}":[1]}}}}"#);
            let editor = crate::step::Editor::new(vec![step]);
            for body in [body, json_body.into_bytes()] {
                let edited = editor.apply(&context, vec![Item::new(EventData::new(body), position)]);
                let dropped: u64 = edited.dropped.iter().map(|(_, n)| n).sum();
                prop_assert_eq!(edited.passed.len() + edited.rejected.len() + dropped as usize, 1);
            }
        }
    }
}
