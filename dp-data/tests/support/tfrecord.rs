//! A minimal TFRecord and tf.train.Example writer for the importer tests, written from the
//! format's description and independent of the importer.

pub(crate) fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

pub(crate) fn frame(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut out = length.to_vec();
    out.extend_from_slice(&masked_crc(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

pub(crate) fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn message(field: u64, payload: &[u8], out: &mut Vec<u8>) {
    varint(field << 3 | 2, out);
    varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

pub(crate) enum List<'a> {
    Bytes(&'a [u8]),
    Floats(&'a [f32], bool),
    Ints(&'a [i64], bool),
}

pub(crate) fn example(features: &[(&str, List<'_>)]) -> Vec<u8> {
    let mut map = Vec::new();
    for (key, list) in features {
        let mut values = Vec::new();
        let field = match list {
            List::Bytes(b) => {
                message(1, b, &mut values);
                1
            }
            List::Floats(v, true) => {
                message(
                    1,
                    &v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<_>>(),
                    &mut values,
                );
                2
            }
            List::Floats(v, false) => {
                for f in *v {
                    values.push(1 << 3 | 5);
                    values.extend_from_slice(&f.to_le_bytes());
                }
                2
            }
            List::Ints(v, true) => {
                let mut packed = Vec::new();
                for &i in *v {
                    varint(i as u64, &mut packed);
                }
                message(1, &packed, &mut values);
                3
            }
            List::Ints(v, false) => {
                for &i in *v {
                    values.push(1 << 3);
                    varint(i as u64, &mut values);
                }
                3
            }
        };
        let mut feature = Vec::new();
        message(field, &values, &mut feature);
        let mut entry = Vec::new();
        message(1, key.as_bytes(), &mut entry);
        message(2, &feature, &mut entry);
        message(1, &entry, &mut map);
    }
    let mut out = Vec::new();
    message(1, &map, &mut out);
    out
}
