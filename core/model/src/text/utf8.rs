//! Streaming lossy UTF-8 decoding: invalid bytes become U+FFFD, split sequences are kept whole.

/// Decodes a byte stream piece by piece, carrying an incomplete trailing sequence forward.
#[derive(Debug, Default)]
pub struct LossyDecoder {
    pending: Vec<u8>,
}

impl LossyDecoder {
    /// Decodes `bytes` (after any carried-over bytes) and appends the text to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut String) {
        let mut input = std::mem::take(&mut self.pending);
        input.extend_from_slice(bytes);
        let mut rest: &[u8] = &input;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    return;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // from_utf8 guarantees `valid` is UTF-8; the fallback never runs.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        None => {
                            self.pending = after.to_vec();
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Ends the stream: a dangling partial sequence becomes one U+FFFD.
    pub fn finish(self, out: &mut String) {
        if !self.pending.is_empty() {
            out.push(char::REPLACEMENT_CHARACTER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_pieces(bytes: &[u8], piece: usize) -> String {
        let mut d = LossyDecoder::default();
        let mut out = String::new();
        for chunk in bytes.chunks(piece) {
            d.push(chunk, &mut out);
        }
        d.finish(&mut out);
        out
    }

    #[test]
    fn matches_std_lossy_for_every_split() {
        let samples: [&[u8]; 4] = [
            "héllo wörld ✓ 🎉".as_bytes(),
            b"bad:\xff\xfe:end",
            b"\xf0\x9f\x8e",
            b"a\xe2\x82b\xc3",
        ];
        for s in samples {
            let expected = String::from_utf8_lossy(s).into_owned();
            for piece in 1..=s.len().max(1) {
                assert_eq!(
                    decode_in_pieces(s, piece),
                    expected,
                    "piece {piece} of {s:?}"
                );
            }
        }
    }
}
