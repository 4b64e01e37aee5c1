//! A token stream held in memory, at the width its dataset stores it.

use std::fmt;

use dp_mem::{Pool, PoolBuf, Tag};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How a token is stored: `u16` for vocabularies of at most 65,536 entries, else `u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenWidth {
    /// Two bytes, little-endian.
    U16,
    /// Four bytes, little-endian.
    U32,
}

impl TokenWidth {
    /// The narrowest width that holds every id below `vocab_size`.
    pub fn for_vocab(vocab_size: usize) -> Self {
        if vocab_size <= 1 << 16 { TokenWidth::U16 } else { TokenWidth::U32 }
    }

    /// Bytes per token.
    pub fn bytes(self) -> usize {
        match self {
            TokenWidth::U16 => 2,
            TokenWidth::U32 => 4,
        }
    }

    /// Appends `tokens` (each below the width's limit) to `out`, little-endian.
    pub(crate) fn encode(self, tokens: &[u32], out: &mut Vec<u8>) {
        match self {
            TokenWidth::U16 => {
                out.extend(tokens.iter().flat_map(|&t| (t as u16).to_le_bytes()));
            }
            TokenWidth::U32 => out.extend(tokens.iter().flat_map(|&t| t.to_le_bytes())),
        }
    }
}

impl fmt::Display for TokenWidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TokenWidth::U16 => "u16",
            TokenWidth::U32 => "u32",
        })
    }
}

/// A token stream in memory, at its dataset's width: 2 or 4 bytes per token in one buffer
/// from a dp-mem pool under the `Data` tag (so a trainer's memory report counts it). Shared
/// between the samplers of one process's ranks through an `Arc`.
pub struct Tokens {
    storage: Storage,
}

enum Storage {
    U16(PoolBuf<u16>),
    U32(PoolBuf<u32>),
}

impl Tokens {
    /// `u16` tokens copied into a buffer from `pool`.
    pub fn from_u16(pool: &Pool, tokens: &[u16]) -> Result<Self> {
        Ok(Tokens { storage: Storage::U16(pool.alloc_copy(tokens, Tag::Data)?) })
    }

    /// `u32` tokens copied into a buffer from `pool`.
    pub fn from_u32(pool: &Pool, tokens: &[u32]) -> Result<Self> {
        Ok(Tokens { storage: Storage::U32(pool.alloc_copy(tokens, Tag::Data)?) })
    }

    /// A zeroed buffer of `len` tokens of `width` from `pool`, to be filled through
    /// [`Tokens::bytes_mut`].
    pub(crate) fn with_len(pool: &Pool, width: TokenWidth, len: usize) -> Result<Self> {
        let storage = match width {
            TokenWidth::U16 => Storage::U16(pool.alloc_zeroed(len, Tag::Data)?),
            TokenWidth::U32 => Storage::U32(pool.alloc_zeroed(len, Tag::Data)?),
        };
        Ok(Tokens { storage })
    }

    /// The buffer as little-endian bytes, to be filled (the hosts are little-endian).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::U16(buf) => bytemuck::cast_slice_mut(&mut buf[..]),
            Storage::U32(buf) => bytemuck::cast_slice_mut(&mut buf[..]),
        }
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::U16(buf) => buf.len(),
            Storage::U32(buf) => buf.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How each token is held.
    pub fn width(&self) -> TokenWidth {
        match &self.storage {
            Storage::U16(_) => TokenWidth::U16,
            Storage::U32(_) => TokenWidth::U32,
        }
    }

    /// Bytes of memory the tokens take (`len * width`).
    pub fn memory_bytes(&self) -> usize {
        self.len() * self.width().bytes()
    }

    /// Token `index` (`None` past the end).
    pub fn get(&self, index: usize) -> Option<u32> {
        match &self.storage {
            Storage::U16(buf) => buf.get(index).map(|&t| u32::from(t)),
            Storage::U32(buf) => buf.get(index).copied(),
        }
    }

    /// The `u16` tokens, if they are held as `u16`.
    pub fn as_u16(&self) -> Option<&[u16]> {
        match &self.storage {
            Storage::U16(buf) => Some(buf),
            Storage::U32(_) => None,
        }
    }

    /// The `u32` tokens, if they are held as `u32`.
    pub fn as_u32(&self) -> Option<&[u32]> {
        match &self.storage {
            Storage::U16(_) => None,
            Storage::U32(buf) => Some(buf),
        }
    }

    /// Copies `out.len()` tokens from `start` into `out`, widened to `u32`; an error if they
    /// run past the end.
    pub fn copy_to(&self, start: usize, out: &mut [u32]) -> Result<()> {
        let end = start.checked_add(out.len()).filter(|&end| end <= self.len());
        let Some(end) = end else {
            return Err(Error::OutOfRange {
                index: start as u64 + out.len() as u64,
                len: self.len() as u64,
            });
        };
        match &self.storage {
            Storage::U16(buf) => {
                for (o, &t) in out.iter_mut().zip(&buf[start..end]) {
                    *o = u32::from(t);
                }
            }
            Storage::U32(buf) => out.copy_from_slice(&buf[start..end]),
        }
        Ok(())
    }

    /// All tokens as `u32`.
    pub fn to_vec(&self) -> Vec<u32> {
        let mut out = vec![0; self.len()];
        // In range by construction.
        let _ = self.copy_to(0, &mut out);
        out
    }
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokens").field("len", &self.len()).field("width", &self.width()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dp_mem::Tracker;

    #[test]
    fn widths_follow_the_vocabulary_and_copies_widen() {
        assert_eq!(TokenWidth::for_vocab(256), TokenWidth::U16);
        assert_eq!(TokenWidth::for_vocab(65_536), TokenWidth::U16);
        assert_eq!(TokenWidth::for_vocab(65_537), TokenWidth::U32);
        let pool = Pool::new(&Tracker::new());
        let narrow = Tokens::from_u16(&pool, &[1, 2, 65_535]).unwrap();
        let wide = Tokens::from_u32(&pool, &[1, 2, 70_000]).unwrap();
        let mut out = [0u32; 2];
        narrow.copy_to(1, &mut out).unwrap();
        assert_eq!(out, [2, 65_535]);
        wide.copy_to(1, &mut out).unwrap();
        assert_eq!(out, [2, 70_000]);
        assert!(matches!(wide.copy_to(2, &mut out), Err(Error::OutOfRange { index: 4, len: 3 })));
        assert_eq!((narrow.memory_bytes(), wide.memory_bytes()), (6, 12));
        let mut bytes = Vec::new();
        TokenWidth::U16.encode(&[1, 258], &mut bytes);
        assert_eq!(bytes, [1, 0, 2, 1]);
    }
}
