//! Addressing documents as Disbatch does: a 24-hex string is an `_id`, anything else a name.

use bson::oid::ObjectId;
use bson::{doc, Document};

use crate::error::{Error, Result};
use crate::Store;

impl Store {
    /// Finds a document of `collection` by `_id` when `ident` is 24 hex digits, else (or if no
    /// such id exists) by `name_field`. Disbatch stopped at the id; falling back to the name
    /// lets a queue whose name happens to be 24 hex digits be addressed too.
    pub(crate) async fn find_by_id_or_name(
        &self,
        collection: &'static str,
        name_field: &str,
        ident: &str,
    ) -> Result<Option<Document>> {
        let coll = self.raw(collection);
        if let Ok(id) = ObjectId::parse_str(ident) {
            let found = coll
                .find_one(doc! {"_id": id})
                .await
                .map_err(|e| Error::mongo(format!("reading {collection} {ident}"), e))?;
            if found.is_some() {
                return self.decode_one(collection, found);
            }
        }
        // `$eq`: a name is compared as it is, never run as an operator or a pattern.
        let found = coll
            .find_one(doc! {name_field: {"$eq": ident}})
            .await
            .map_err(|e| Error::mongo(format!("reading {collection} {ident}"), e))?;
        self.decode_one(collection, found)
    }
}
