//! From YAML text to marked-yaml nodes, with anchors, aliases and merge
//! keys, as envoyproxy/ratelimit's YAML library reads them.
//!
//! marked-yaml's own loader refuses anchors, so this is a loader of its
//! own on the same event parser (yaml-rust2): every node keeps the line and
//! column where it is written — an alias's copy those of its anchor — a
//! duplicate key is an error, and only plain scalars may be read as numbers
//! or bools.
//!
//! An alias is a copy of its anchor's node. The copies of one file may
//! hold at most [`MIN_EXPANSION`] nodes, or as many as the file has bytes
//! when that is more, so that a small file cannot expand into billions of
//! nodes ("billion laughs"); a file without aliases holds fewer nodes than
//! bytes anyway.
//!
//! A plain `<<` key merges the map it is given (`<<: *defaults`), or each
//! map of a list (`<<: [*a, *b]`), into the map it is in: keys written in
//! the map win, then the earlier maps of the list.

use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode, MarkedSequenceNode};
use marked_yaml::{Marker, Node, Span};
use std::collections::HashMap;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker as YamlMarker, TScalarStyle};

/// The fewest nodes the aliases of a file may copy in all; a file of more
/// bytes may copy as many nodes as it has bytes.
pub(super) const MIN_EXPANSION: usize = 10_000;

/// Where and why the text is not YAML that slidegate reads.
#[derive(Debug)]
pub(super) struct YamlError {
    pub(super) line: usize,
    pub(super) column: usize,
    pub(super) key: Option<String>,
    pub(super) message: String,
}

/// The text's first document; an empty text is an empty map whose span
/// starts where it ends.
pub(super) fn load(text: &str) -> Result<Node, YamlError> {
    let mut builder = Builder {
        stack: Vec::new(),
        anchors: HashMap::new(),
        root: None,
        copied: 0,
        budget: MIN_EXPANSION.max(text.len()),
        error: None,
    };
    let mut parser = Parser::new_from_str(text);
    if let Err(e) = parser.load(&mut builder, false) {
        let at = marker(*e.marker());
        let message = if e.info().contains("unknown anchor") {
            let name = alias_name(text, e.marker().index());
            format!("unknown alias `*{name}`: no anchor `&{name}` before it")
        } else {
            format!("invalid YAML: {}", e.info())
        };
        return Err(error_at(at, None, message));
    }
    if let Some(e) = builder.error {
        return Err(e);
    }
    let end = Marker::new(0, text.chars().count(), 1, 1);
    Ok(builder
        .root
        .unwrap_or_else(|| Node::from(MarkedMappingNode::new_empty(Span::new_with_marks(end, end)))))
}

/// A map being read.
struct MappingFrame {
    start: Marker,
    anchor: usize,
    map: MarkedMappingNode,
    /// The key read, waiting for its value.
    key: Option<MarkedScalarNode>,
    /// The `<<` key and its value.
    merge: Option<(MarkedScalarNode, Node)>,
    /// Nodes in all, this one included.
    nodes: usize,
}

/// A collection being read.
enum Frame {
    /// Boxed, as it is much larger than a list.
    Mapping(Box<MappingFrame>),
    Sequence {
        start: Marker,
        anchor: usize,
        items: Vec<Node>,
        nodes: usize,
    },
}

impl Frame {
    fn anchor(&self) -> usize {
        match self {
            Frame::Mapping(frame) => frame.anchor,
            Frame::Sequence { anchor, .. } => *anchor,
        }
    }
}

struct Builder {
    stack: Vec<Frame>,
    /// Every anchor read to its end, by the parser's id: its node and how
    /// many nodes it holds.
    anchors: HashMap<usize, (Node, usize)>,
    root: Option<Node>,
    /// Nodes copied by aliases so far.
    copied: usize,
    /// The most nodes aliases may copy.
    budget: usize,
    error: Option<YamlError>,
}

fn marker(mark: YamlMarker) -> Marker {
    Marker::new(0, mark.index(), mark.line(), mark.col() + 1)
}

fn error_at(at: Marker, key: Option<String>, message: String) -> YamlError {
    YamlError {
        line: at.line(),
        column: at.column(),
        key,
        message,
    }
}

fn start_of(node: &Node) -> Option<Marker> {
    node.span().start().copied()
}

/// The name of the alias whose `*` is the `index`-th character of `text`.
fn alias_name(text: &str, index: usize) -> String {
    let rest: String = text.chars().skip(index).collect();
    let rest = rest.strip_prefix('*').unwrap_or(&rest);
    rest.chars()
        .take_while(|c| !c.is_whitespace() && !matches!(c, ',' | '[' | ']' | '{' | '}'))
        .take(64)
        .collect()
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, mark: YamlMarker) {
        if self.error.is_some() {
            return;
        }
        let mark = marker(mark);
        if let Err(e) = self.event(event, mark) {
            self.error = Some(e);
        }
    }
}

impl Builder {
    fn event(&mut self, event: Event, mark: Marker) -> Result<(), YamlError> {
        let tags = || error_at(mark, None, "tags (`!`, `!!`) are not supported".to_owned());
        match event {
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentStart | Event::DocumentEnd => {
                Ok(())
            }
            Event::MappingStart(anchor, tag) => {
                if tag.is_some() {
                    return Err(tags());
                }
                self.stack.push(Frame::Mapping(Box::new(MappingFrame {
                    start: mark,
                    anchor,
                    map: MarkedMappingNode::new_empty(Span::new_start(mark)),
                    key: None,
                    merge: None,
                    nodes: 1,
                })));
                Ok(())
            }
            Event::SequenceStart(anchor, tag) => {
                if tag.is_some() {
                    return Err(tags());
                }
                self.stack.push(Frame::Sequence {
                    start: mark,
                    anchor,
                    items: Vec::new(),
                    nodes: 1,
                });
                Ok(())
            }
            Event::MappingEnd => match self.stack.pop() {
                Some(Frame::Mapping(frame)) => {
                    let MappingFrame {
                        start,
                        anchor,
                        mut map,
                        merge,
                        nodes,
                        ..
                    } = *frame;
                    *map.span_mut() = Span::new_with_marks(start, mark);
                    if let Some((key, value)) = merge {
                        merge_into(&mut map, &key, value)?;
                    }
                    self.complete(Node::from(map), anchor, nodes)
                }
                _ => Err(error_at(mark, None, "invalid YAML: unbalanced map".to_owned())),
            },
            Event::SequenceEnd => match self.stack.pop() {
                Some(Frame::Sequence {
                    start,
                    anchor,
                    items,
                    nodes,
                }) => {
                    let node = Node::from(MarkedSequenceNode::new(Span::new_with_marks(start, mark), items));
                    self.complete(node, anchor, nodes)
                }
                _ => Err(error_at(mark, None, "invalid YAML: unbalanced list".to_owned())),
            },
            Event::Scalar(value, style, anchor, tag) => {
                if tag.is_some() {
                    return Err(tags());
                }
                let mut scalar = MarkedScalarNode::new(Span::new_start(mark), value);
                scalar.set_coerce(matches!(style, TScalarStyle::Plain));
                self.complete(Node::from(scalar), anchor, 1)
            }
            Event::Alias(id) => {
                if self.stack.iter().any(|frame| frame.anchor() == id) {
                    return Err(error_at(
                        mark,
                        None,
                        "an alias cannot refer to an anchor that contains it".to_owned(),
                    ));
                }
                let Some((node, nodes)) = self.anchors.get(&id) else {
                    return Err(error_at(mark, None, "unknown alias".to_owned()));
                };
                let nodes = *nodes;
                self.copied = self.copied.saturating_add(nodes);
                if self.copied > self.budget {
                    return Err(error_at(
                        mark,
                        None,
                        format!(
                            "aliases expand to more than {} nodes (at most {MIN_EXPANSION}, or one per byte of \
                             the file when that is more)",
                            self.budget
                        ),
                    ));
                }
                let node = node.clone();
                self.complete(node, 0, nodes)
            }
        }
    }

    /// A node read to its end (or copied): kept under its anchor, then put
    /// in its parent.
    fn complete(&mut self, node: Node, anchor: usize, nodes: usize) -> Result<(), YamlError> {
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), nodes));
        }
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
                Ok(())
            }
            Some(Frame::Sequence {
                items, nodes: total, ..
            }) => {
                *total = total.saturating_add(nodes);
                items.push(node);
                Ok(())
            }
            Some(Frame::Mapping(frame)) => {
                let MappingFrame {
                    map,
                    key,
                    merge,
                    nodes: total,
                    ..
                } = &mut **frame;
                *total = total.saturating_add(nodes);
                let Some(k) = key.take() else {
                    return match node {
                        Node::Scalar(scalar) => {
                            *key = Some(scalar);
                            Ok(())
                        }
                        other => Err(error_at(
                            start_of(&other).unwrap_or_else(|| Marker::new(0, 0, 1, 1)),
                            None,
                            "a key must be a string, not a list or a map".to_owned(),
                        )),
                    };
                };
                if k.may_coerce() && k.as_str() == "<<" {
                    if let Some((first, _)) = merge {
                        return Err(duplicate(first, &k));
                    }
                    *merge = Some((k, node));
                    return Ok(());
                }
                if map.contains_key(&k)
                    && let Some(first) = map.keys().find(|first| first.as_str() == k.as_str())
                {
                    return Err(duplicate(first, &k));
                }
                map.insert(k, node);
                Ok(())
            }
        }
    }
}

fn duplicate(first: &MarkedScalarNode, key: &MarkedScalarNode) -> YamlError {
    let at = key.span().start().copied().unwrap_or_else(|| Marker::new(0, 0, 1, 1));
    let (line, column) = first.span().start().map_or((0, 0), |m| (m.line(), m.column()));
    error_at(
        at,
        Some(key.as_str().to_owned()),
        format!("duplicate key, first at line {line} column {column}"),
    )
}

/// Merges the value of a `<<` key into `map`: its keys that `map` does not
/// have, from a map or from each map of a list, earlier ones first.
fn merge_into(map: &mut MarkedMappingNode, key: &MarkedScalarNode, value: Node) -> Result<(), YamlError> {
    let wrong = |node: &Node| {
        let at = start_of(node)
            .or_else(|| key.span().start().copied())
            .unwrap_or_else(|| Marker::new(0, 0, 1, 1));
        error_at(
            at,
            Some("<<".to_owned()),
            "a merge key needs a map or a list of maps".to_owned(),
        )
    };
    let sources: Vec<MarkedMappingNode> = match value {
        Node::Mapping(source) => vec![source],
        Node::Sequence(list) => {
            let mut sources = Vec::with_capacity(list.len());
            for item in list.iter() {
                match item {
                    Node::Mapping(source) => sources.push(source.clone()),
                    other => return Err(wrong(other)),
                }
            }
            sources
        }
        other => return Err(wrong(&other)),
    };
    for source in sources {
        for (k, v) in source.iter() {
            if !map.contains_key(k) {
                map.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}
