//! What a replay needs besides the log: the config, the domain, and the
//! descriptors built from each line's fields ([`EntrySpec`]).

use slidegate_sim::ReorderOptions;
use std::borrow::Cow;
use std::path::PathBuf;

/// Where a descriptor entry's value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A field of the log line.
    Field(String),
    /// This text, on every request.
    Literal(String),
}

/// One descriptor entry of `--descriptor`: `KEY=FIELD` or
/// `KEY=literal:TEXT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntrySpec {
    /// The entry's key.
    pub key: String,
    /// Its value's source.
    pub source: Source,
}

impl std::str::FromStr for EntrySpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((key, value)) = s.split_once('=') else {
            return Err(format!(
                "`{s}` is not KEY=FIELD (a log field as the entry's value) or KEY=literal:TEXT (a fixed value)"
            ));
        };
        if key.is_empty() {
            return Err(format!("`{s}` has no key before `=`"));
        }
        let source = match value.strip_prefix("literal:") {
            Some("") => return Err(format!("`{s}`: the literal value is empty")),
            Some(text) => Source::Literal(text.to_owned()),
            None if value.is_empty() => return Err(format!("`{s}` names no field after `=`")),
            None => Source::Field(value.to_owned()),
        };
        Ok(EntrySpec {
            key: key.to_owned(),
            source,
        })
    }
}

/// A log line's fields, by name.
pub trait Fields {
    /// The field called `name`, if the line has it.
    fn field(&self, name: &str) -> Option<Cow<'_, str>>;
}

impl Fields for [(&str, &str)] {
    fn field(&self, name: &str) -> Option<Cow<'_, str>> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| Cow::Borrowed(*v))
    }
}

impl Setup {
    /// The log fields the descriptors read, each once, in order.
    pub fn fields(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for entry in self.descriptors.iter().flatten() {
            if let Source::Field(name) = &entry.source
                && !names.contains(&name.as_str())
            {
                names.push(name);
            }
        }
        names
    }

    /// The descriptors as given, `[key=field key=literal:text]` each.
    pub fn describe(&self) -> String {
        let list: Vec<String> = self
            .descriptors
            .iter()
            .map(|d| {
                let entries: Vec<String> = d
                    .iter()
                    .map(|e| match &e.source {
                        Source::Field(f) => format!("{}={f}", e.key),
                        Source::Literal(t) => format!("{}=literal:{t}", e.key),
                    })
                    .collect();
                format!("[{}]", entries.join(" "))
            })
            .collect();
        list.join(" ")
    }
}

/// What a what-if replay needs besides the log.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The config files (or directories), as `serve --config` takes them.
    pub config: Vec<PathBuf>,
    /// The domain of every request.
    pub domain: String,
    /// The descriptors of every request, each a list of entries.
    pub descriptors: Vec<Vec<EntrySpec>>,
    /// Memory of each engine's store (and of its other algorithms' store).
    pub memory_bytes: usize,
    /// How lines are put in time order.
    pub order: ReorderOptions,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_fields_and_literals() {
        let e: EntrySpec = "remote_address=client".parse().unwrap();
        assert_eq!(e.key, "remote_address");
        assert_eq!(e.source, Source::Field("client".into()));
        let e: EntrySpec = "generic_key=literal:api=v1".parse().unwrap();
        assert_eq!(e.source, Source::Literal("api=v1".into()));
        assert_eq!(
            "client".parse::<EntrySpec>().unwrap_err(),
            "`client` is not KEY=FIELD (a log field as the entry's value) or KEY=literal:TEXT (a fixed value)"
        );
        assert_eq!(
            "=client".parse::<EntrySpec>().unwrap_err(),
            "`=client` has no key before `=`"
        );
        assert_eq!("k=".parse::<EntrySpec>().unwrap_err(), "`k=` names no field after `=`");
        assert_eq!(
            "k=literal:".parse::<EntrySpec>().unwrap_err(),
            "`k=literal:`: the literal value is empty"
        );
    }
}
