//! A value per tag, indexed by [`Tag`]: what a memory report holds for each role.

use std::ops::{Index, IndexMut};

use crate::tag::{TAG_COUNT, Tag};

/// One `T` per [`Tag`], indexed by the tag and iterated in [`Tag::ALL`] order.
///
/// ```
/// use dp_mem::{ByTag, Tag};
///
/// let mut bytes = ByTag::from_fn(|tag| if tag == Tag::Param { 4096u64 } else { 0 });
/// bytes[Tag::Grad] += 4096;
/// assert_eq!(bytes.total(), 8192);
/// assert_eq!(bytes.iter().next(), Some((Tag::Param, &4096)));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ByTag<T>([T; TAG_COUNT]);

impl<T> ByTag<T> {
    /// `f(tag)` for every tag.
    pub fn from_fn(mut f: impl FnMut(Tag) -> T) -> Self {
        ByTag(std::array::from_fn(|i| f(Tag::from_index(i))))
    }

    /// Every tag with its value, in [`Tag::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Tag, &T)> {
        Tag::ALL.into_iter().zip(&self.0)
    }
}

impl ByTag<u64> {
    /// The sum over all tags.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

impl<T> Index<Tag> for ByTag<T> {
    type Output = T;

    fn index(&self, tag: Tag) -> &T {
        &self.0[tag.index()]
    }
}

impl<T> IndexMut<Tag> for ByTag<T> {
    fn index_mut(&mut self, tag: Tag) -> &mut T {
        &mut self.0[tag.index()]
    }
}
