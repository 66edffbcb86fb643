//! The order-preserving parse tree a definition file is read into before interpretation: one
//! [`Tree`] type for YAML and JSON, and [`Fields`] for taking a mapping's keys one by one.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::{Result, err, quote};

/// The parsed file before interpretation. Unlike `serde_json::Value` (a sorted map without the
/// `preserve_order` feature) it keeps mappings in file order, which the input list depends on,
/// and one type serves both YAML and JSON.
#[derive(Debug)]
pub(super) enum Tree {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    List(Vec<Tree>),
    Map(Vec<(String, Tree)>),
}

impl Tree {
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Tree::Null => "null",
            Tree::Bool(_) => "a boolean",
            Tree::Int(_) => "an integer",
            Tree::Float(_) => "a number",
            Tree::Str(_) => "a string",
            Tree::List(_) => "a list",
            Tree::Map(_) => "a mapping",
        }
    }

    pub(super) fn into_json(self, path: &str) -> Result<Value> {
        Ok(match self {
            Tree::Null => Value::Null,
            Tree::Bool(b) => b.into(),
            Tree::Int(n) => match (i64::try_from(n), u64::try_from(n)) {
                (Ok(n), _) => n.into(),
                (_, Ok(n)) => n.into(),
                // As serde_json reads such integers from a JSON file: a (rounded) float.
                _ => serde_json::Number::from_f64(n as f64).map_or(Value::Null, Value::Number),
            },
            // YAML's .nan and .inf have no JSON form.
            Tree::Float(f) => serde_json::Number::from_f64(f)
                .map(Value::Number)
                .ok_or_else(|| err(path, "must be a finite number"))?,
            Tree::Str(s) => s.into(),
            Tree::List(items) => Value::Array(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, n)| n.into_json(&format!("{path}[{i}]")))
                    .collect::<Result<_>>()?,
            ),
            Tree::Map(entries) => Value::Object(
                entries
                    .into_iter()
                    .map(|(k, n)| n.into_json(&format!("{path}.{k}")).map(|v| (k, v)))
                    .collect::<Result<_>>()?,
            ),
        })
    }
}

/// A mapping being interpreted: keys are taken one by one; `path` prefixes error fields.
pub(super) struct Fields {
    path: String,
    pub(super) entries: Vec<(String, Tree)>,
}

impl Fields {
    pub(super) fn new(node: Tree, path: &str, what: &str) -> Result<Self> {
        match node {
            Tree::Map(entries) => Ok(Fields { path: path.to_owned(), entries }),
            other => Err(err(
                if path.is_empty() { what } else { path },
                format!("must be a mapping, got {}", other.kind()),
            )),
        }
    }

    pub(super) fn path(&self, key: &str) -> String {
        if self.path.is_empty() { key.to_owned() } else { format!("{}.{key}", self.path) }
    }

    /// Rejects the first key not in `allowed`, naming it (and any further unknown ones).
    pub(super) fn reject_unknown(&self, allowed: &[&str]) -> Result<()> {
        let unknown: Vec<&str> =
            self.entries.iter().map(|(k, _)| k.as_str()).filter(|k| !allowed.contains(k)).collect();
        let Some(first) = unknown.first() else { return Ok(()) };
        let also = if unknown.len() > 1 {
            format!("; also unknown: {}", unknown[1..].join(", "))
        } else {
            String::new()
        };
        Err(err(
            self.path(first),
            format!("unknown key (expected one of {}{also})", allowed.join(", ")),
        ))
    }

    /// Removes and returns `key`'s value; `null` reads as absent.
    pub(super) fn take(&mut self, key: &str) -> Option<Tree> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        match self.entries.remove(i).1 {
            Tree::Null => None,
            node => Some(node),
        }
    }
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML or JSON value")
    }
    fn visit_unit<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_none<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Tree, D::Error> {
        Tree::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Tree, E> {
        Ok(Tree::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Tree, E> {
        Ok(Tree::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Tree, E> {
        Ok(Tree::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Tree, E> {
        Ok(Tree::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Tree, E> {
        i128::try_from(v).map(Tree::Int).map_err(|_| E::custom("integer out of range"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Tree, E> {
        Ok(Tree::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Tree, E> {
        Ok(Tree::Str(v))
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<Tree, A::Error> {
        // Only YAML tags (`!name value`) reach this: their meaning is application-defined.
        Err(de::Error::custom("YAML tags such as `!name` are not supported"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Tree::List(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        // serde_json keeps the last of duplicate keys silently; a definition saying two
        // different things about one key is a mistake worth reporting (with its position).
        let mut entries = Vec::new();
        let mut seen = HashSet::new();
        while let Some(Key(key)) = map.next_key()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("duplicate key {}", quote(&key))));
            }
            entries.push((key, map.next_value()?));
        }
        Ok(Tree::Map(entries))
    }
}

/// A mapping key: strings only, so every key has a JSON form and a field path.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_str<E>(self, v: &str) -> Result<Key, E> {
                Ok(Key(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Key, E> {
                Ok(Key(v))
            }
        }
        d.deserialize_any(KeyVisitor)
    }
}
