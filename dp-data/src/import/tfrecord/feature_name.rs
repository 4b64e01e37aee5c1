//! The schema feature a TFRecord key becomes.

/// A schema feature name for a TFRecord key: characters a schema does not allow (TensorFlow
/// keys often hold `/`, as in `image/encoded`) become `_`.
pub(super) fn feature_name(key: &[u8]) -> String {
    String::from_utf8_lossy(key)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "_-.".contains(c) { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitized() {
        assert_eq!(feature_name(b"image/encoded"), "image_encoded");
        assert_eq!(feature_name(b"a.b-c_d9"), "a.b-c_d9");
    }
}
