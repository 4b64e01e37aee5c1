//! Where a crop lies in decoded pixels: a rectangle in fractional pixels (a crop decoded at
//! 1/2 scale starts half way into a pixel as often as not), and how an EXIF orientation
//! moves it between the stored image and the displayed one.

use super::crop::Region;

/// A rectangle of pixels, its corners anywhere between pixel edges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Area {
    pub(crate) x: f64,
    pub(crate) y: f64,
    pub(crate) width: f64,
    pub(crate) height: f64,
}

impl From<Region> for Area {
    fn from(r: Region) -> Area {
        let f = f64::from;
        Area { x: f(r.x), y: f(r.y), width: f(r.width), height: f(r.height) }
    }
}

impl Area {
    /// The area scaled by `1 / denom` and moved to an origin at `(x, y)` of the scaled image.
    pub(crate) fn scaled(self, denom: u32, (x, y): (u32, u32)) -> Area {
        let d = f64::from(denom);
        Area {
            x: self.x / d - f64::from(x),
            y: self.y / d - f64::from(y),
            width: self.width / d,
            height: self.height / d,
        }
    }

    /// Where this area of the displayed image lies in the stored one (`stored` wide and
    /// tall) under EXIF `orientation` (1 to 8; others count as 1).
    pub(crate) fn to_stored(self, orientation: u16, (w, h): (f64, f64)) -> Area {
        let Area { x, y, width: aw, height: ah } = self;
        // Per orientation: the stored x range from the displayed one, and the stored y range.
        let (x, y, width, height) = match orientation {
            2 => (w - x - aw, y, aw, ah),
            3 => (w - x - aw, h - y - ah, aw, ah),
            4 => (x, h - y - ah, aw, ah),
            5 => (y, x, ah, aw),
            6 => (y, h - x - aw, ah, aw),
            7 => (w - y - ah, h - x - aw, ah, aw),
            8 => (w - y - ah, x, ah, aw),
            _ => (x, y, aw, ah),
        };
        Area { x, y, width, height }
    }

    /// Where this area of the stored image (`stored` wide and tall) lies in the displayed
    /// one: the inverse of [`Area::to_stored`]. The stored image is the displayed one under
    /// the inverse orientation (6 and 8 undo each other; every other undoes itself).
    pub(crate) fn to_displayed(self, orientation: u16, (w, h): (f64, f64)) -> Area {
        let (inverse, displayed) = match orientation {
            6 => (8, (h, w)),
            8 => (6, (h, w)),
            5 | 7 => (orientation, (h, w)),
            _ => (orientation, (w, h)),
        };
        self.to_stored(inverse, displayed)
    }
}

/// Where displayed pixel `(x, y)` of an image stored `w x h` under EXIF `orientation` is
/// stored (1 and anything out of 1 to 8: where it is).
pub(crate) fn stored_pixel(
    orientation: u16,
    (w, h): (usize, usize),
    (x, y): (usize, usize),
) -> (usize, usize) {
    match orientation {
        2 => (w - 1 - x, y),
        3 => (w - 1 - x, h - 1 - y),
        4 => (x, h - 1 - y),
        5 => (y, x),
        6 => (y, h - 1 - x),
        7 => (w - 1 - y, h - 1 - x),
        8 => (w - 1 - y, x),
        _ => (x, y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_area_moves_with_the_pixels_it_covers_and_back() {
        let (w, h) = (7usize, 4usize);
        for orientation in 1..=8 {
            let displayed = if orientation >= 5 { (h, w) } else { (w, h) };
            for (x, y) in (0..displayed.0).flat_map(|x| (0..displayed.1).map(move |y| (x, y))) {
                // A one-pixel area lands on the stored pixel it shows.
                let one = Area { x: x as f64, y: y as f64, width: 1.0, height: 1.0 };
                let stored = one.to_stored(orientation, (w as f64, h as f64));
                let (sx, sy) = stored_pixel(orientation, (w, h), (x, y));
                let want = Area { x: sx as f64, y: sy as f64, width: 1.0, height: 1.0 };
                assert_eq!(stored, want, "orientation {orientation}, pixel ({x}, {y})");
            }
            let area = Area { x: 0.5, y: 1.25, width: 2.0, height: 1.5 };
            let there = area.to_stored(orientation, (w as f64, h as f64));
            let back = there.to_displayed(orientation, (w as f64, h as f64));
            assert_eq!(back, area, "orientation {orientation}");
        }
    }
}
