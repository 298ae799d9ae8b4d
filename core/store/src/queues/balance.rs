//! The single QueueBalance document: read and upsert (validation lives with its callers).

use crate::QueueStore;
use bson::{doc, Document};

use crate::error::{Error, Result};
use disbatch_model::schema::BALANCE;

impl QueueStore<'_> {
    pub async fn balance_document(self) -> Result<Option<Document>> {
        let found = self
            .raw(BALANCE)
            .find_one(doc! {})
            .await
            .map_err(|e| Error::mongo("reading the balance document", e))?;
        self.decode_one(BALANCE, found)
    }

    /// `$set` into the one balance document, creating it if needed, as Disbatch does.
    pub async fn set_balance(self, set: Document) -> Result<()> {
        self.collection(BALANCE)
            .update_one(doc! {}, doc! {"$set": set})
            .upsert(true)
            .await
            .map(|_| ())
            .map_err(|e| Error::mongo("writing the balance document", e))
    }
}
