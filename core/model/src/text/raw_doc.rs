//! BSON bytes to documents without serde: byte for byte, so a sub-document shaped like
//! Extended JSON (`{"$numberLong": "x"}`, stored by ops or another tool) stays the document it
//! is, where serde's `Document` reader takes it for a typed value and fails the whole read.

use bson::{Bson, Document, RawDocument};

/// Decodes one document from its bytes; Err says what is wrong with them.
pub fn from_bytes(bytes: &[u8]) -> Result<Document, String> {
    let raw = RawDocument::from_bytes(bytes).map_err(|e| format!("not a BSON document: {e}"))?;
    from_raw(raw)
}

/// Decodes one document; Err names the first field that cannot be read (invalid UTF-8, a
/// malformed element).
pub fn from_raw(raw: &RawDocument) -> Result<Document, String> {
    Document::try_from(raw).map_err(|e| e.to_string())
}

/// The document's `_id` for messages, read without decoding the rest: "unknown" when even
/// that cannot be read.
pub fn id_text(raw: &RawDocument) -> String {
    match raw.get("_id") {
        Ok(Some(v)) => match Bson::try_from(v.to_raw_bson()) {
            Ok(Bson::ObjectId(id)) => id.to_hex(),
            Ok(other) => other.to_string(),
            Err(_) => "unknown".into(),
        },
        _ => "unknown".into(),
    }
}

/// The document's `_id` as an ObjectId, read without decoding the rest.
pub fn object_id(raw: &RawDocument) -> Option<bson::oid::ObjectId> {
    raw.get_object_id("_id").ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use bson::oid::ObjectId;

    fn bytes(d: &Document) -> Vec<u8> {
        let mut out = Vec::new();
        d.to_writer(&mut out).expect("encode");
        out
    }

    #[test]
    fn extended_json_shapes_stay_documents() {
        let d = doc! {
            "_id": ObjectId::new(),
            "a": {"$numberLong": "x"},
            "b": {"$oid": "x"},
            "c": {"$date": "x"},
            "d": [{"$undefined": true}, {"$regularExpression": 5}],
            "e": {"$binary": {"base64": "!!", "subType": "zz"}},
        };
        let b = bytes(&d);
        // What the driver's serde path does with the same bytes: it fails the read.
        assert!(Document::from_reader(b.as_slice()).is_err());
        assert_eq!(from_bytes(&b).expect("decoded"), d);
    }

    #[test]
    fn bad_bytes_are_an_error_not_a_panic() {
        assert!(from_bytes(&[]).is_err());
        assert!(from_bytes(&[5, 0, 0, 0]).is_err());
        let mut b = bytes(&doc! {"s": "MARK"});
        let at = b.windows(4).position(|w| w == b"MARK").expect("marker");
        b[at] = 0xff;
        let e = from_bytes(&b).expect_err("invalid UTF-8");
        assert!(!e.is_empty());
        let raw = RawDocument::from_bytes(&b).expect("framing is fine");
        assert_eq!(id_text(raw), "unknown");
    }

    #[test]
    fn the_id_is_read_alone() {
        let id = ObjectId::new();
        let b = bytes(&doc! {"_id": id, "x": {"$numberLong": "x"}});
        let raw = RawDocument::from_bytes(&b).expect("raw");
        assert_eq!(id_text(raw), id.to_hex());
        assert_eq!(object_id(raw), Some(id));
        let b = bytes(&doc! {"_id": "text"});
        assert_eq!(
            id_text(RawDocument::from_bytes(&b).expect("raw")),
            "\"text\""
        );
    }
}
