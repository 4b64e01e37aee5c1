//! JPEG decoding on libjpeg-turbo's decoder (mozjpeg-sys builds it from source with the C
//! compiler, and with its SIMD kernels where `nasm` is installed, as `scripts/setup-nasm.sh`
//! does). It decodes whole images, or only what a crop needs: the rows up to the crop's last
//! (rows above it entropy-decoded but not transformed), the iMCU columns it covers, and at
//! 1/2, 1/4 or 1/8 scale in the DCT domain when asked (see [`Window`]). Past the crop the
//! scan is still entropy-decoded to its end, so that a damaged file fails whatever part of
//! it a crop takes. Every warning libjpeg gives (corrupt data, a premature end) is an error.

use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use mozjpeg_sys::{
    J_COLOR_SPACE, jpeg_common_struct, jpeg_create_decompress, jpeg_crop_scanline,
    jpeg_decompress_struct, jpeg_destroy_decompress, jpeg_error_mgr, jpeg_finish_decompress,
    jpeg_mem_src, jpeg_read_header, jpeg_read_scanlines, jpeg_save_markers, jpeg_skip_scanlines,
    jpeg_start_decompress, jpeg_std_error,
};

use super::color::cmyk_to;
use super::exif::exif_orientation;
use super::info::check_pixels;

/// The marker codes of APP0 to APP15 start here.
const APP0: u8 = 0xE0;

/// What a JPEG's headers say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// The stored size (before the EXIF orientation).
    pub(crate) width: u32,
    pub(crate) height: u32,
    /// Channels as encoded: 1 (gray), 3 (YCbCr or RGB), 4 (CMYK or YCCK).
    pub(crate) components: u8,
    /// The EXIF orientation, 1 to 8 (1: as stored).
    pub(crate) orientation: u16,
}

impl Header {
    /// The displayed size: an EXIF orientation of 5 to 8 swaps the sides.
    pub(crate) fn displayed_size(&self) -> (u32, u32) {
        match self.orientation {
            5..=8 => (self.height, self.width),
            _ => (self.width, self.height),
        }
    }
}

/// The part of a stored JPEG to decode: columns `x0..x1` and rows `y0..y1` of the stored
/// (unoriented) image at full scale, decoded at `1 / denom` scale (1, 2, 4 or 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) x0: u32,
    pub(crate) y0: u32,
    pub(crate) x1: u32,
    pub(crate) y1: u32,
    pub(crate) denom: u32,
}

/// What [`decode`] wrote: `width x height` pixels whose first is pixel `(x, y)` of the stored
/// image at `1 / denom` scale (the window widened to whole iMCU columns, and its edges
/// rounded out to whole scaled pixels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decoded {
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) x: u32,
    pub(crate) y: u32,
    pub(crate) denom: u32,
}

/// Reads a JPEG's headers.
pub(crate) fn header(bytes: &[u8]) -> Result<Header, String> {
    guarded(|| {
        let mut session = Session::open(bytes);
        session.read_header();
        Ok(session.header())
    })
}

/// Decodes the window `plan` chooses from the JPEG's header (the whole image at full scale
/// for `None`) into `out`, `channels` (1 or 3) a pixel, rows packed; returns the header
/// beside what it wrote. An error says what libjpeg found wrong.
pub(crate) fn decode(
    bytes: &[u8],
    plan: impl FnOnce(&Header) -> Option<Window>,
    channels: usize,
    out: &mut Vec<u8>,
) -> Result<(Header, Decoded), String> {
    guarded(|| {
        let mut session = Session::open(bytes);
        session.read_header();
        let header = session.header();
        check_pixels(u64::from(header.width) * u64::from(header.height))?;
        let decoded = session.decode(plan(&header), channels, out);
        Ok((header, decoded))
    })
}

/// Runs `body`, turning libjpeg's errors (raised as unwinding payloads by [`error_exit`] and
/// [`emit_message`]) into `Err`.
fn guarded<R>(body: impl FnOnce() -> Result<R, String>) -> Result<R, String> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(payload) => Err(match payload.downcast::<Failure>() {
            Ok(failure) => format!("does not decode as JPEG: {}", failure.0),
            Err(_) => "does not decode as JPEG (the decoder failed)".into(),
        }),
    }
}

/// What libjpeg reported, carried out of it by unwinding.
struct Failure(String);

/// One decompression of the JPEG bytes it borrows: libjpeg's state and its error manager,
/// boxed so that the pointers libjpeg keeps between them stay put; destroyed on drop, also
/// when an error unwinds.
struct Session<'a> {
    info: jpeg_decompress_struct,
    errors: jpeg_error_mgr,
    /// libjpeg reads the bytes through a pointer the session keeps.
    source: PhantomData<&'a [u8]>,
}

impl<'a> Session<'a> {
    fn open(bytes: &'a [u8]) -> Box<Session<'a>> {
        // SAFETY: both structs are plain C data that libjpeg initializes (all-zero is how C
        // callers start them); `jpeg_create_decompress` runs after the error manager is set,
        // as libjpeg requires; the session borrows `bytes` for as long as it lives.
        unsafe {
            let mut session = Box::new(Session {
                info: std::mem::zeroed(),
                errors: std::mem::zeroed(),
                source: PhantomData,
            });
            let errors = jpeg_std_error(&mut session.errors);
            errors.error_exit = Some(error_exit);
            errors.emit_message = Some(emit_message);
            session.info.common.err = &mut session.errors;
            jpeg_create_decompress(&mut session.info);
            jpeg_mem_src(&mut session.info, bytes.as_ptr(), bytes.len() as _);
            // EXIF (APP1) for the orientation, Adobe (APP14) for how CMYK is stored.
            jpeg_save_markers(&mut session.info, i32::from(APP0) + 1, 0xFFFF);
            jpeg_save_markers(&mut session.info, i32::from(APP0) + 14, 0xFFFF);
            session
        }
    }

    fn read_header(&mut self) {
        // SAFETY: the session was opened on a source; errors unwind out of here.
        unsafe { jpeg_read_header(&mut self.info, 1) };
    }

    /// The saved markers `(code, data)`.
    fn markers(&self) -> impl Iterator<Item = (u8, &[u8])> {
        let mut at = self.info.marker_list;
        std::iter::from_fn(move || {
            // SAFETY: libjpeg's list of saved markers, each `data_length` bytes, lives until
            // the decompression finishes; only `header` and `decode` read it, before then.
            let marker = unsafe { at.as_ref()? };
            at = marker.next;
            let data = match marker.data.is_null() {
                true => &[][..],
                // SAFETY: as above, `data_length` bytes at `data`.
                false => unsafe {
                    std::slice::from_raw_parts(marker.data, marker.data_length as usize)
                },
            };
            Some((marker.marker, data))
        })
    }

    fn header(&self) -> Header {
        let orientation = self
            .markers()
            .find(|(code, data)| *code == APP0 + 1 && data.starts_with(b"Exif\0\0"))
            .map_or(1, |(_, data)| exif_orientation(data));
        Header {
            width: self.info.image_width,
            height: self.info.image_height,
            components: self.info.num_components as u8,
            orientation,
        }
    }

    /// Whether an Adobe marker says that CMYK values are stored inverted (as Photoshop
    /// writes them, and as PIL reads them).
    fn adobe(&self) -> bool {
        self.markers().any(|(code, data)| code == APP0 + 14 && data.starts_with(b"Adobe"))
    }

    fn decode(&mut self, window: Option<Window>, channels: usize, out: &mut Vec<u8>) -> Decoded {
        let four = self.info.num_components == 4;
        // Saved markers live in libjpeg's per-image pool, which finishing frees.
        let inverted = four && self.adobe();
        self.info.out_color_space = match (four, channels) {
            (true, _) => J_COLOR_SPACE::JCS_CMYK,
            (false, 1) => J_COLOR_SPACE::JCS_GRAYSCALE,
            (false, _) => J_COLOR_SPACE::JCS_RGB,
        };
        self.info.scale_num = 1;
        self.info.scale_denom = window.map_or(1, |w| w.denom);
        // SAFETY: the header was read; errors unwind out of here.
        unsafe { jpeg_start_decompress(&mut self.info) };
        let (full_width, full_height) = (self.info.output_width, self.info.output_height);
        let w = window.unwrap_or(Window {
            x0: 0,
            y0: 0,
            x1: self.info.image_width,
            y1: self.info.image_height,
            denom: 1,
        });
        let mut x = (w.x0 / w.denom).min(full_width - 1);
        let mut width = w.x1.div_ceil(w.denom).min(full_width).max(x + 1) - x;
        let top = (w.y0 / w.denom).min(full_height - 1);
        let bottom = w.y1.div_ceil(w.denom).min(full_height);
        if width < full_width {
            // SAFETY: after `jpeg_start_decompress`, before any row is read; libjpeg widens
            // the columns to whole iMCUs, moving `x` left and `width` out.
            unsafe { jpeg_crop_scanline(&mut self.info, &mut x, &mut width) };
        }
        let components = self.info.output_components as usize;
        let stride = width as usize * components;
        let rows = (bottom.max(top + 1) - top) as usize;
        // One row more than the window's: where the scan's last row is read, below.
        if out.len() < stride * (rows + 1) {
            out.resize(stride * (rows + 1), 0);
        }
        // SAFETY: rows are read into `out`, `stride * (rows + 1)` bytes long, one row of
        // `width * components` bytes at a time; the skips stay inside the image.
        unsafe {
            if top > 0 {
                jpeg_skip_scanlines(&mut self.info, top);
            }
            for row in 0..rows {
                let mut line = out.as_mut_ptr().add(row * stride);
                jpeg_read_scanlines(&mut self.info, &mut line, 1);
            }
            // The rest of the scan is entropy-decoded (skipped up to its last row, which is
            // read: skipping to the end would skip the decoding too), so that damage there
            // fails this crop as it fails every other.
            let left = full_height - self.info.output_scanline;
            if left > 0 {
                if left > 1 {
                    jpeg_skip_scanlines(&mut self.info, left - 1);
                }
                let mut line = out.as_mut_ptr().add(rows * stride);
                jpeg_read_scanlines(&mut self.info, &mut line, 1);
            }
            jpeg_finish_decompress(&mut self.info);
        }
        if four {
            cmyk_to(&mut out[..stride * rows], channels, inverted);
        }
        Decoded { width, height: rows as u32, x, y: top, denom: w.denom }
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // SAFETY: created in `open`; destroying frees what libjpeg allocated, whatever state
        // an error left it in.
        unsafe { jpeg_destroy_decompress(&mut self.info) };
    }
}

/// libjpeg's message for its last error or warning.
fn message(info: &mut jpeg_common_struct) -> String {
    let mut buffer = [0u8; 200];
    // SAFETY: the error manager is the session's; `format_message` writes at most
    // JMSG_LENGTH_MAX (200) bytes, NUL-terminated. It is declared to take `&[u8; 80]`, but
    // writes through it: it is called through a pointer to the same function taking a raw
    // pointer.
    unsafe {
        if let Some(format) = (*info.err).format_message {
            type Format = unsafe extern "C-unwind" fn(&mut jpeg_common_struct, *mut u8);
            let format: Format = std::mem::transmute(format);
            format(info, buffer.as_mut_ptr());
        }
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}

/// libjpeg's fatal errors, carried out by unwinding (mozjpeg-sys builds libjpeg with unwind
/// tables for this) without running the panic hook.
unsafe extern "C-unwind" fn error_exit(info: &mut jpeg_common_struct) {
    resume_unwind(Box::new(Failure(message(info))));
}

/// libjpeg's warnings (level -1: corrupt data, a premature end) as errors; trace messages
/// (levels 0 and up) are dropped.
unsafe extern "C-unwind" fn emit_message(info: &mut jpeg_common_struct, level: i32) {
    if level < 0 {
        resume_unwind(Box::new(Failure(message(info))));
    }
}
