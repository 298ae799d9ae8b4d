//! Creating tasks in bulk: from params lists, and from another collection through a template.

use crate::TaskStore;
use std::collections::HashSet;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;

use crate::error::{Error, Result};
use disbatch_model::schema::task;

/// Tasks inserted per round trip when creating from a collection: bounded memory however
/// many documents match (Disbatch loaded them all).
const BATCH: usize = 10_000;

/// A params template: values `"document.<field>"` take each source document's field.
#[derive(Debug, Clone, PartialEq)]
pub struct Template(pub Document);

impl Template {
    /// The top-level source fields the template reads (the projection).
    pub fn fields(&self) -> Vec<String> {
        self.0
            .values()
            .filter_map(|v| match v {
                Bson::String(s) => s.strip_prefix("document.").map(str::to_string),
                _ => None,
            })
            .collect()
    }

    /// The params for one source document. A missing field becomes null, as in Perl.
    pub fn fill(&self, source: &Document) -> Document {
        self.0
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    Bson::String(s) => match s.strip_prefix("document.") {
                        Some(field) => source.get(field).cloned().unwrap_or(Bson::Null),
                        None => v.clone(),
                    },
                    other => other.clone(),
                };
                (k.clone(), value)
            })
            .collect()
    }
}

/// Task fields a creator may set beside the params: when the task may first be claimed, and
/// its rank in a queue with `sort: "priority"`. They are fields of the task, not of its
/// params, so plugins never see them and nodes (ours and Perl's) read them where they
/// already read a unit's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    /// Not claimable before this time (the fleet's clock).
    pub not_before: Option<DateTime>,
    /// Higher is claimed first in a queue sorted by priority.
    pub priority: Option<i64>,
}

impl Timing {
    /// Sets the fields given on a new task document.
    pub(crate) fn stamp(&self, d: &mut Document) {
        if let Some(t) = self.not_before {
            d.insert(task::NOT_BEFORE, t);
        }
        if let Some(p) = self.priority {
            d.insert(task::PRIORITY, p);
        }
    }
}

/// What creating a list of tasks made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Created {
    /// Per input, in order: the new task, or the existing task the input duplicates.
    pub ids: Vec<ObjectId>,
    /// The inputs (indexes into `ids`) that were duplicates, ascending.
    pub duplicates: Vec<usize>,
    /// Whether the queue has `unique` (its replies say which inputs were duplicates).
    pub unique: bool,
}

impl Created {
    /// The new tasks, as (input index, id).
    pub fn new_tasks(&self) -> Vec<(usize, ObjectId)> {
        let dup: HashSet<usize> = self.duplicates.iter().copied().collect();
        self.ids
            .iter()
            .enumerate()
            .filter(|(i, _)| !dup.contains(i))
            .map(|(i, id)| (i, *id))
            .collect()
    }

    /// The duplicates, as (input index, the existing task's id).
    pub fn duplicate_tasks(&self) -> Vec<(usize, ObjectId)> {
        self.duplicates
            .iter()
            .filter_map(|&i| self.ids.get(i).map(|id| (i, *id)))
            .collect()
    }

    /// Appends a later batch of the same request, its indexes following this one's.
    pub fn extend(&mut self, later: Created) {
        let offset = self.ids.len();
        self.ids.extend(later.ids);
        self.duplicates
            .extend(later.duplicates.into_iter().map(|i| i + offset));
        self.unique |= later.unique;
    }
}

impl TaskStore<'_> {
    /// Inserts one task per document of `collection` matching `filter`: per matching document
    /// its task, new or (for a queue with `unique`) the existing one it duplicates.
    pub async fn insert_tasks_from_collection(
        self,
        queue: ObjectId,
        collection: &str,
        filter: Document,
        template: &Template,
        timing: &Timing,
    ) -> Result<Created> {
        check_source_collection(collection)?;
        let mut projection = doc! {};
        for f in template.fields() {
            projection.insert(f, 1);
        }
        let source = self.raw(collection);
        let mut find = source.find(filter);
        if !projection.is_empty() {
            find = find.projection(projection);
        }
        let mut cursor = find
            .await
            .map_err(|e| Error::mongo(format!("reading collection {collection}"), e))?;
        let mut made = Created::default();
        let mut first = 0;
        let mut batch = Vec::with_capacity(BATCH);
        while let Some(raw) = cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo(format!("reading collection {collection}"), e))?
        {
            // A source document that cannot be decoded makes no task; it is reported.
            let Some(d) = self.decode_or_skip("source collection", &raw) else {
                continue;
            };
            batch.push(template.fill(&d));
            if batch.len() == BATCH {
                let label = |i: usize| format!("source document {}", first + i);
                let batch = std::mem::take(&mut batch);
                let timings = vec![*timing; batch.len()];
                made.extend(self.create_labelled(queue, batch, &timings, &label).await?);
                first = made.ids.len();
            }
        }
        if !batch.is_empty() {
            let label = |i: usize| format!("source document {}", first + i);
            let timings = vec![*timing; batch.len()];
            made.extend(self.create_labelled(queue, batch, &timings, &label).await?);
        }
        Ok(made)
    }
}

/// A collection a client may name as the source of tasks: a plain collection of this
/// database, not a command namespace (`$cmd`), a system collection or an invalid name.
fn check_source_collection(name: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::Invalid(format!("collection {name:?} {why}")));
    if name.is_empty() || name.len() > 120 {
        return bad("must be 1 to 120 bytes long");
    }
    if name.contains('$') || name.contains('\0') {
        return bad("must not contain '$' or NUL");
    }
    if name.starts_with("system.") || name.starts_with('.') || name.ends_with('.') {
        return bad("is not a collection tasks can be made from");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_take_top_level_fields_and_copy_other_values() {
        let t = Template(
            doc! {"user": "document.email", "kind": "migration", "n": 3, "gone": "document.missing"},
        );
        assert_eq!(t.fields(), vec!["email".to_string(), "missing".to_string()]);
        let params = t.fill(&doc! {"email": "a@example.com", "other": 1});
        assert_eq!(
            params,
            doc! {"user": "a@example.com", "kind": "migration", "n": 3, "gone": Bson::Null}
        );
    }

    #[test]
    fn a_later_batch_continues_the_indexes() {
        let (a, b, c) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
        let mut first = Created {
            ids: vec![a, b],
            duplicates: vec![],
            unique: true,
        };
        first.extend(Created {
            ids: vec![a, c],
            duplicates: vec![0],
            unique: true,
        });
        assert_eq!(first.duplicates, vec![2]);
        assert_eq!(first.duplicate_tasks(), vec![(2, a)]);
        assert_eq!(first.new_tasks(), vec![(0, a), (1, b), (3, c)]);
    }
}
