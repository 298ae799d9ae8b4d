//! Task output in GridFS bucket `tasks`, in Disbatch's format: string chunks, `metadata.task_id`.

use crate::ResultStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use md5::{Digest, Md5};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::{Error, Result};
use crate::Store;
use disbatch_model::fleet_time;
use disbatch_model::schema::{chunk, file, CHUNKS, FILES};
use disbatch_model::text::utf8::LossyDecoder;

/// Disbatch's (and GridFS's default) chunk size: 255 KiB.
pub const CHUNK_SIZE: usize = 255 * 1024;
/// Chunks sent per insert: a few MiB per round trip, well under the 48 MB message limit.
const CHUNKS_PER_INSERT: usize = 16;

/// A stored output file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFileInfo {
    pub id: ObjectId,
    /// UTF-8 byte length of the stored text.
    pub length: u64,
}

/// The `filename` of a file holding a result's `output` too large for its attempt record,
/// beside `stdout` and `stderr`.
const RESULT_FILENAME: &str = "result";

impl ResultStore<'_> {
    /// Writes a result's `output` (JSON text) too large for its attempt record to a GridFS
    /// file of `task_id`, so it goes with its task like its stdout.
    pub async fn write_result_output(
        self,
        task_id: ObjectId,
        json: &[u8],
    ) -> Result<crate::StoredOutput> {
        let info = self
            .write_output_file(task_id, RESULT_FILENAME, json)
            .await?;
        Ok(crate::StoredOutput {
            file: info.id,
            bytes: info.length,
        })
    }

    /// Streams `reader` into a GridFS file named `filename` (`stdout`/`stderr`) for `task_id`.
    /// Bytes that are not UTF-8 are replaced (BSON strings must be UTF-8). Chunks are written
    /// before the files document, so readers never see a partial file.
    pub async fn write_output_file<R: AsyncRead + Unpin>(
        self,
        task_id: ObjectId,
        filename: &str,
        mut reader: R,
    ) -> Result<OutputFileInfo> {
        let id = ObjectId::new();
        let result = self.write_chunks(id, &mut reader).await;
        let (length, md5) = match result {
            Ok(done) => done,
            Err(e) => {
                self.delete_chunks(id).await;
                return Err(e);
            }
        };
        let files_doc = doc! {
            file::ID: id,
            file::FILENAME: filename,
            file::CHUNK_SIZE: CHUNK_SIZE as i32,
            file::LENGTH: length as i64,
            file::UPLOAD_DATE: fleet_time::now(),
            file::MD5: md5,
            file::METADATA: {file::TASK_ID: task_id},
        };
        if let Err(e) = self.collection(FILES).insert_one(files_doc).await {
            self.delete_chunks(id).await;
            return Err(Error::mongo(
                format!("writing GridFS file {filename} of task {task_id}"),
                e,
            ));
        }
        Ok(OutputFileInfo { id, length })
    }

    /// Reads a whole output file. Accepts string chunks (Disbatch) and binary chunks (any
    /// standard GridFS writer).
    pub async fn read_output_file(self, id: ObjectId) -> Result<Vec<u8>> {
        Ok(self.read_output_prefix(id, usize::MAX).await?.0)
    }

    /// The first `max_bytes` of an output file (the first chunks only are read), and whether
    /// it holds more. Chunks as `read_output_file` takes them.
    pub async fn read_output_prefix(
        self,
        id: ObjectId,
        max_bytes: usize,
    ) -> Result<(Vec<u8>, bool)> {
        let context = || format!("reading GridFS file {id}");
        let chunks = self.raw(CHUNKS);
        let mut find = chunks
            .find(doc! {chunk::FILES_ID: id})
            .sort(doc! {chunk::N: 1});
        // Small batches: a reader that stops early must not have fetched 16 MiB of chunks.
        if let Ok(batch) = u32::try_from(max_bytes / CHUNK_SIZE + 2) {
            find = find.batch_size(batch);
        }
        let mut cursor = find.await.map_err(|e| Error::mongo(context(), e))?;
        let mut out = Vec::new();
        while let Some(raw) = cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo(context(), e))?
        {
            if out.len() >= max_bytes {
                return Ok((out, true));
            }
            let Some(c) = self.decode_one(CHUNKS, Some(raw))? else {
                continue;
            };
            let data = chunk_data(&c)?;
            let room = max_bytes - out.len();
            out.extend_from_slice(&data[..data.len().min(room)]);
            if data.len() > room {
                return Ok((out, true));
            }
        }
        Ok((out, false))
    }

    /// Describes the first chunk of an output file that holds neither text nor binary data
    /// (edited by hand or corrupt), so a reader can refuse it before streaming anything.
    pub async fn unreadable_chunk(self, id: ObjectId) -> Result<Option<String>> {
        let found = self
            .raw(CHUNKS)
            .find_one(doc! {
                chunk::FILES_ID: id,
                chunk::DATA: {"$not": {"$type": ["string", "binData"]}},
            })
            .projection(doc! {chunk::N: 1, chunk::DATA: 1})
            .await
            .map_err(|e| Error::mongo(format!("checking GridFS file {id}"), e))?;
        let found = match self.decode_one(CHUNKS, found) {
            Ok(found) => found,
            Err(e) => return Ok(Some(e.to_string())),
        };
        Ok(found.map(|c| {
            let n = c.get(chunk::N).map_or("?".to_string(), |n| n.to_string());
            let data = c
                .get(chunk::DATA)
                .map_or("nothing".to_string(), |d| format!("{:?}", d.element_type()));
            format!("chunk {n} holds {data}, not text or binary data")
        }))
    }

    /// The files document of a stored output, if it exists.
    pub async fn output_file(self, id: ObjectId) -> Result<Option<Document>> {
        let found = self
            .raw(FILES)
            .find_one(doc! {file::ID: id})
            .await
            .map_err(|e| Error::mongo(format!("reading GridFS file {id}"), e))?;
        self.decode_one(FILES, found)
    }
}

impl Store {
    async fn write_chunks<R: AsyncRead + Unpin>(
        &self,
        id: ObjectId,
        reader: &mut R,
    ) -> Result<(u64, String)> {
        let mut decoder = LossyDecoder::default();
        let mut text = String::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut batch: Vec<Document> = Vec::with_capacity(CHUNKS_PER_INSERT);
        let mut n: i32 = 0;
        let mut length: u64 = 0;
        let mut md5 = Md5::new();
        loop {
            let read = reader
                .read(&mut buf)
                .await
                .map_err(|e| Error::io("reading task output", e))?;
            if read == 0 {
                break;
            }
            decoder.push(&buf[..read], &mut text);
            while text.len() >= CHUNK_SIZE {
                let piece = take_chunk(&mut text);
                length += piece.len() as u64;
                md5.update(piece.as_bytes());
                batch.push(chunk_doc(id, n, piece));
                n += 1;
                if batch.len() == CHUNKS_PER_INSERT {
                    self.insert_chunks(std::mem::take(&mut batch)).await?;
                }
            }
        }
        decoder.finish(&mut text);
        while !text.is_empty() {
            let piece = take_chunk(&mut text);
            length += piece.len() as u64;
            md5.update(piece.as_bytes());
            batch.push(chunk_doc(id, n, piece));
            n += 1;
        }
        if !batch.is_empty() {
            self.insert_chunks(batch).await?;
        }
        let digest: String = md5.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok((length, digest))
    }

    async fn insert_chunks(&self, batch: Vec<Document>) -> Result<()> {
        self.collection(CHUNKS)
            .insert_many(batch)
            .await
            .map(|_| ())
            .map_err(|e| Error::mongo("writing GridFS chunks", e))
    }

    async fn delete_chunks(&self, id: ObjectId) {
        if let Err(e) = self
            .collection(CHUNKS)
            .delete_many(doc! {chunk::FILES_ID: id})
            .await
        {
            tracing::warn!(file = %id, error = %e, "could not remove the chunks of a failed GridFS upload");
        }
    }
}

/// A chunk's bytes: string chunks (Disbatch) or binary ones (any standard GridFS writer).
fn chunk_data(c: &Document) -> Result<&[u8]> {
    match c.get(chunk::DATA) {
        Some(Bson::String(s)) => Ok(s.as_bytes()),
        Some(Bson::Binary(b)) => Ok(&b.bytes),
        other => Err(Error::BadDocument {
            collection: CHUNKS,
            id: format!("{:?}", c.get("_id")),
            message: format!("chunk data is neither a string nor binary: {other:?}"),
        }),
    }
}

/// Splits off up to CHUNK_SIZE bytes from the front, never inside a character.
fn take_chunk(text: &mut String) -> String {
    let mut end = text.len().min(CHUNK_SIZE);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let rest = text.split_off(end);
    std::mem::replace(text, rest)
}

fn chunk_doc(files_id: ObjectId, n: i32, data: String) -> Document {
    doc! {chunk::FILES_ID: files_id, chunk::N: n, chunk::DATA: data}
}

/// A stream of an output file's bytes, chunk by chunk, in order.
pub type OutputStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<Vec<u8>>> + Send + 'static>>;

impl ResultStore<'_> {
    /// Streams a GridFS output file without loading it whole (string or binary chunks).
    pub async fn stream_output_file(self, id: ObjectId) -> Result<OutputStream> {
        let cursor = self
            .raw(CHUNKS)
            .find(doc! {chunk::FILES_ID: id})
            .sort(doc! {chunk::N: 1})
            .await
            .map_err(|e| Error::mongo(format!("reading GridFS file {id}"), e))?;
        let stream = futures::StreamExt::map(cursor, move |c| {
            let raw = c.map_err(|e| Error::mongo(format!("reading GridFS file {id}"), e))?;
            let c = disbatch_model::text::raw_doc::from_raw(&raw).map_err(|message| {
                Error::BadDocument {
                    collection: CHUNKS,
                    id: disbatch_model::text::raw_doc::id_text(&raw),
                    message: format!("it cannot be decoded: {message}"),
                }
            })?;
            match c.get(chunk::DATA) {
                Some(Bson::String(s)) => Ok(s.as_bytes().to_vec()),
                Some(Bson::Binary(b)) => Ok(b.bytes.clone()),
                other => Err(Error::BadDocument {
                    collection: CHUNKS,
                    id: format!("{:?}", c.get("_id")),
                    message: format!("chunk data is neither a string nor binary: {other:?}"),
                }),
            }
        });
        Ok(Box::pin(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_never_split_a_character_and_respect_the_size() {
        let mut text = "é".repeat(CHUNK_SIZE); // 2 bytes each
        let mut total = 0;
        while !text.is_empty() {
            let piece = take_chunk(&mut text);
            assert!(piece.len() <= CHUNK_SIZE);
            total += piece.len();
        }
        assert_eq!(total, 2 * CHUNK_SIZE);
    }
}
