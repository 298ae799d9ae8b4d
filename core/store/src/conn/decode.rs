//! Reading documents one at a time: every read takes the server's bytes and decodes each
//! document alone, so a document that cannot be decoded is left out of that read, logged once
//! and counted, never fatal to the read of all the others.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use bson::{Document, RawDocumentBuf};
use futures::TryStreamExt;
use mongodb::{Collection, Cursor};

use crate::error::{Error, Result};
use crate::Store;
use disbatch_model::text::raw_doc;

/// Distinct documents remembered as already logged; beyond it a skip is still counted, and
/// logged again, so memory stays bounded whatever a collection holds.
const MAX_REMEMBERED: usize = 10_000;

/// Documents one at a time, as a streamed read yields them.
pub type DocumentStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<Document>> + Send + 'static>>;

/// Why a document was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// Its bytes could not be decoded (invalid UTF-8, a malformed element).
    Undecodable,
    /// The server refused to update it (to claim or recover it): it holds a value the
    /// server cannot handle, and will refuse it again.
    UpdateRefused,
    /// Its queue's flow limit keys it by a field that holds a list: it stands for no one key.
    BadLimitKey,
}

impl SkipReason {
    pub fn label(self) -> &'static str {
        match self {
            SkipReason::Undecodable => "undecodable",
            SkipReason::UpdateRefused => "update_refused",
            SkipReason::BadLimitKey => "bad_limit_key",
        }
    }
}

/// Called once per skipped document read (a metric's counter, say).
pub type SkipHook = Arc<dyn Fn(&'static str, SkipReason) + Send + Sync>;

/// The documents this process's reads left out: counted per collection and reason, each
/// logged the first time it is met.
#[derive(Clone, Default)]
pub struct SkipLedger {
    inner: Arc<Mutex<Ledger>>,
    hook: Option<SkipHook>,
}

#[derive(Default)]
struct Ledger {
    counts: BTreeMap<(&'static str, SkipReason), u64>,
    logged: HashSet<(&'static str, String)>,
}

impl std::fmt::Debug for SkipLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SkipLedger").finish_non_exhaustive()
    }
}

impl SkipLedger {
    /// Counts a skip and logs it unless this document was already logged.
    pub fn skipped(&self, collection: &'static str, id: &str, reason: SkipReason, why: &str) {
        let first = match self.inner.lock() {
            Ok(mut l) => {
                *l.counts.entry((collection, reason)).or_default() += 1;
                if l.logged.len() >= MAX_REMEMBERED {
                    l.logged.clear();
                }
                l.logged.insert((collection, id.to_string()))
            }
            Err(_) => true,
        };
        if first {
            tracing::warn!(
                collection,
                id,
                reason = reason.label(),
                "document skipped: {why}"
            );
        }
        if let Some(hook) = &self.hook {
            hook(collection, reason);
        }
    }

    /// How many documents were skipped, per collection and reason.
    pub fn counts(&self) -> Vec<(&'static str, SkipReason, u64)> {
        self.inner
            .lock()
            .map(|l| l.counts.iter().map(|((c, r), n)| (*c, *r, *n)).collect())
            .unwrap_or_default()
    }
}

impl Store {
    /// Calls `hook` for every document a read of this store (and its clones made after)
    /// leaves out.
    pub fn on_skipped(mut self, hook: SkipHook) -> Store {
        self.state.skips.hook = Some(hook);
        self
    }

    /// What this store's reads left out so far.
    pub fn skipped_documents(&self) -> Vec<(&'static str, SkipReason, u64)> {
        self.state.skips.counts()
    }

    /// A collection read as raw bytes, for decoding one document at a time.
    pub(crate) fn raw(&self, name: &str) -> Collection<RawDocumentBuf> {
        self.db.collection(name)
    }

    /// Every result of an aggregation on `collection` that decodes; the others are reported
    /// and left out.
    pub(crate) async fn aggregate_all(
        &self,
        collection: &'static str,
        pipeline: Vec<Document>,
        context: &str,
    ) -> Result<Vec<Document>> {
        let cursor = self
            .collection(collection)
            .aggregate(pipeline)
            .with_type::<RawDocumentBuf>()
            .await
            .map_err(|e| Error::mongo(context.to_string(), e))?;
        self.read_all(collection, cursor, context).await
    }

    /// Every document of a cursor that decodes; the others are reported and left out.
    pub(crate) async fn read_all(
        &self,
        collection: &'static str,
        cursor: Cursor<RawDocumentBuf>,
        context: &str,
    ) -> Result<Vec<Document>> {
        let mut stream = cursor;
        let mut out = Vec::new();
        while let Some(raw) = stream
            .try_next()
            .await
            .map_err(|e| Error::mongo(context.to_string(), e))?
        {
            if let Some(d) = self.decode_or_skip(collection, &raw) {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// A cursor's documents one at a time as the caller takes them (memory bounded by the
    /// driver's batch); undecodable ones are reported and left out, as in `read_all`.
    pub(crate) fn decoded_stream(
        &self,
        collection: &'static str,
        cursor: Cursor<RawDocumentBuf>,
        context: String,
    ) -> DocumentStream {
        let store = self.clone();
        let docs = futures::StreamExt::filter_map(cursor, move |raw| {
            let decoded = match raw {
                Ok(raw) => store.decode_or_skip(collection, &raw).map(Ok),
                Err(e) => Some(Err(Error::mongo(context.clone(), e))),
            };
            std::future::ready(decoded)
        });
        Box::pin(docs)
    }

    /// The document, or None after reporting it as undecodable.
    pub(crate) fn decode_or_skip(
        &self,
        collection: &'static str,
        raw: &RawDocumentBuf,
    ) -> Option<Document> {
        match raw_doc::from_raw(raw) {
            Ok(d) => Some(d),
            Err(why) => {
                let id = raw_doc::id_text(raw);
                self.state
                    .skips
                    .skipped(collection, &id, SkipReason::Undecodable, &why);
                None
            }
        }
    }

    /// One document looked up on its own: an undecodable one is an error naming it, so the
    /// caller can answer for it alone.
    pub(crate) fn decode_one(
        &self,
        collection: &'static str,
        raw: Option<RawDocumentBuf>,
    ) -> Result<Option<Document>> {
        let Some(raw) = raw else { return Ok(None) };
        raw_doc::from_raw(&raw).map(Some).map_err(|message| {
            let id = raw_doc::id_text(&raw);
            self.state
                .skips
                .skipped(collection, &id, SkipReason::Undecodable, &message);
            Error::BadDocument {
                collection,
                id,
                message: format!("it cannot be decoded: {message}"),
            }
        })
    }
}
