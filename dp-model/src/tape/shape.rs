//! The shape of a sample between layers, as the tape is built.

/// The shape of one sample between layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    Flat(usize),
    /// An image; `channel_major` says whether the batch is stored `[C, B, H, W]` (inside a
    /// convolution stack) or `[B, C, H, W]` (as callers hand it in).
    Image {
        c: usize,
        h: usize,
        w: usize,
        channel_major: bool,
    },
    /// A sequence of `t` rows of `d` values (a language model's tokens).
    Seq {
        t: usize,
        d: usize,
    },
}

impl Shape {
    pub(super) fn len(self) -> usize {
        match self {
            Shape::Flat(n) => n,
            Shape::Image { c, h, w, .. } => c * h * w,
            Shape::Seq { t, d } => t * d,
        }
    }

    /// Rows a row-wise op acts on, and values per row; `None` for an image.
    pub(super) fn rows(self) -> Option<(usize, usize)> {
        match self {
            Shape::Flat(n) => Some((1, n)),
            Shape::Seq { t, d } => Some((t, d)),
            Shape::Image { .. } => None,
        }
    }
}

/// Where a layer's input comes from: its shape and the node producing it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cursor {
    pub(super) shape: Shape,
    pub(super) source: Option<usize>,
}

/// A shape as a spec writes it, for errors.
pub(super) fn describe(shape: Shape) -> String {
    match shape {
        Shape::Flat(n) => format!("[{n}]"),
        Shape::Seq { t, d } => format!("[{t}, {d}]"),
        Shape::Image { c, h, w, .. } => format!("[{c}, {h}, {w}]"),
    }
}
