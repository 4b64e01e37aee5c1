//! Decoding a serialized `tf.train.Example` by hand (see the module's parent for the
//! messages), with protobuf's merge rules.

use std::collections::BTreeMap;

use crate::import::quote;

/// A parse error: the position in the record's data, and what was wrong.
type Parse<T> = std::result::Result<T, (usize, String)>;

/// Protobuf wire types.
const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

/// A reader of protobuf fields in `data[pos..end]`.
struct Wire<'a> {
    data: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Wire<'a> {
    fn new(data: &'a [u8], (pos, end): (usize, usize)) -> Self {
        Wire { data, pos, end }
    }

    fn done(&self) -> bool {
        self.pos >= self.end
    }

    fn varint(&mut self) -> Parse<u64> {
        let start = self.pos;
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            if self.pos >= self.end {
                return Err((start, "a varint runs past the end of its message".into()));
            }
            let byte = self.data[self.pos];
            self.pos += 1;
            if shift < 64 {
                value |= u64::from(byte & 0x7f) << shift;
            }
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err((start, "a varint is longer than 10 bytes".into()))
    }

    /// The next field's number and wire type.
    fn tag(&mut self) -> Parse<(u64, u8)> {
        let at = self.pos;
        let tag = self.varint()?;
        let (field, wire) = (tag >> 3, (tag & 7) as u8);
        if field == 0 {
            return Err((at, "field number 0 is invalid".into()));
        }
        Ok((field, wire))
    }

    /// The bounds of a length-delimited field's payload.
    fn bytes(&mut self) -> Parse<(usize, usize)> {
        let at = self.pos;
        let len = self.varint()?;
        let left = (self.end - self.pos) as u64;
        if len > left {
            return Err((
                at,
                format!("a field declares {len} bytes, only {left} remain in its message"),
            ));
        }
        let start = self.pos;
        self.pos += len as usize;
        Ok((start, self.pos))
    }

    fn fixed<const N: usize>(&mut self) -> Parse<[u8; N]> {
        if self.end - self.pos < N {
            return Err((self.pos, format!("a {N}-byte field runs past the end of its message")));
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.data[self.pos..self.pos + N]);
        self.pos += N;
        Ok(out)
    }

    fn skip(&mut self, wire: u8) -> Parse<()> {
        match wire {
            VARINT => self.varint().map(drop),
            I64 => self.fixed::<8>().map(drop),
            LEN => self.bytes().map(drop),
            I32 => self.fixed::<4>().map(drop),
            _ => Err((self.pos, format!("wire type {wire} is not supported (groups or invalid)"))),
        }
    }

    fn wrong(&self, at: usize, field: &str, wire: u8) -> (usize, String) {
        (at, format!("{field} has wire type {wire}, which does not fit its type"))
    }
}

/// Which list a feature holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum List {
    Bytes,
    Float,
    Int64,
}

impl List {
    pub(super) fn name(self) -> &'static str {
        match self {
            List::Bytes => "bytes_list",
            List::Float => "float_list",
            List::Int64 => "int64_list",
        }
    }
}

/// One decoded feature of an Example.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub(crate) list: Option<List>,
    /// Bounds of the byte strings in the record's data.
    pub(crate) bytes: Vec<(usize, usize)>,
    pub(crate) floats: Vec<f32>,
    pub(crate) ints: Vec<i64>,
}

impl Parsed {
    pub(crate) fn count(&self) -> usize {
        match self.list {
            Some(List::Bytes) => self.bytes.len(),
            Some(List::Float) => self.floats.len(),
            Some(List::Int64) => self.ints.len(),
            None => 0,
        }
    }

    /// Switches the oneof to `list`, clearing the other member as protobuf does.
    fn switch(&mut self, list: List) {
        if self.list != Some(list) {
            self.bytes.clear();
            self.floats.clear();
            self.ints.clear();
            self.list = Some(list);
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self.list {
            Some(list) => format!("{} of {} values", list.name(), self.count()),
            None => "no value list".into(),
        }
    }
}

/// Decodes an Example into its features, keyed by name.
pub(super) fn parse_example<'a>(data: &'a [u8], out: &mut BTreeMap<&'a [u8], Parsed>) -> Parse<()> {
    out.clear();
    let mut wire = Wire::new(data, (0, data.len()));
    while !wire.done() {
        let at = wire.pos;
        match wire.tag()? {
            (1, LEN) => {
                let features = wire.bytes()?;
                parse_features(data, features, out)?;
            }
            (1, w) => return Err(wire.wrong(at, "Example.features", w)),
            (_, w) => wire.skip(w)?,
        }
    }
    Ok(())
}

fn parse_features<'a>(
    data: &'a [u8],
    bounds: (usize, usize),
    out: &mut BTreeMap<&'a [u8], Parsed>,
) -> Parse<()> {
    let mut wire = Wire::new(data, bounds);
    while !wire.done() {
        let at = wire.pos;
        match wire.tag()? {
            (1, LEN) => {
                let entry = wire.bytes()?;
                let (key, feature) = parse_entry(data, entry)?;
                out.insert(key, feature);
            }
            (1, w) => return Err(wire.wrong(at, "Features.feature", w)),
            (_, w) => wire.skip(w)?,
        }
    }
    Ok(())
}

fn parse_entry(data: &[u8], bounds: (usize, usize)) -> Parse<(&[u8], Parsed)> {
    let mut wire = Wire::new(data, bounds);
    let mut key: &[u8] = &[];
    let mut feature = Parsed::default();
    while !wire.done() {
        let at = wire.pos;
        match wire.tag()? {
            (1, LEN) => {
                let (a, b) = wire.bytes()?;
                key = &data[a..b];
                if std::str::from_utf8(key).is_err() {
                    return Err((a, format!("feature key {} is not UTF-8", quote(key))));
                }
            }
            (2, LEN) => {
                let value = wire.bytes()?;
                parse_feature(data, value, &mut feature)?;
            }
            (1, w) => return Err(wire.wrong(at, "the feature map's key", w)),
            (2, w) => return Err(wire.wrong(at, "the feature map's value", w)),
            (_, w) => wire.skip(w)?,
        }
    }
    Ok((key, feature))
}

fn parse_feature(data: &[u8], bounds: (usize, usize), out: &mut Parsed) -> Parse<()> {
    let mut wire = Wire::new(data, bounds);
    while !wire.done() {
        let at = wire.pos;
        let (field, w) = wire.tag()?;
        let list = match field {
            1 => List::Bytes,
            2 => List::Float,
            3 => List::Int64,
            _ => {
                wire.skip(w)?;
                continue;
            }
        };
        if w != LEN {
            return Err(wire.wrong(at, list.name(), w));
        }
        let bounds = wire.bytes()?;
        out.switch(list);
        parse_list(data, bounds, list, out)?;
    }
    Ok(())
}

fn parse_list(data: &[u8], bounds: (usize, usize), list: List, out: &mut Parsed) -> Parse<()> {
    let mut wire = Wire::new(data, bounds);
    while !wire.done() {
        let at = wire.pos;
        match (wire.tag()?, list) {
            ((1, LEN), List::Bytes) => out.bytes.push(wire.bytes()?),
            ((1, LEN), List::Float) => {
                let (a, b) = wire.bytes()?;
                if (b - a) % 4 != 0 {
                    return Err((
                        a,
                        format!("packed floats: {} bytes is not a multiple of 4", b - a),
                    ));
                }
                out.floats.extend(
                    data[a..b]
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap_or_default())),
                );
            }
            ((1, I32), List::Float) => out.floats.push(f32::from_le_bytes(wire.fixed::<4>()?)),
            ((1, LEN), List::Int64) => {
                let packed = wire.bytes()?;
                let mut values = Wire::new(data, packed);
                while !values.done() {
                    out.ints.push(values.varint()? as i64);
                }
            }
            ((1, VARINT), List::Int64) => out.ints.push(wire.varint()? as i64),
            ((1, w), _) => return Err(wire.wrong(at, list.name(), w)),
            ((_, w), _) => wire.skip(w)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn field(number: u64, payload: &[u8], out: &mut Vec<u8>) {
        varint(number << 3 | 2, out);
        varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    }

    fn entry(key: &str, feature: &[u8]) -> Vec<u8> {
        let mut e = Vec::new();
        field(1, key.as_bytes(), &mut e);
        field(2, feature, &mut e);
        let mut f = Vec::new();
        field(1, &e, &mut f);
        f
    }

    fn example(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        field(1, &entries.concat(), &mut out);
        out
    }

    fn parse(data: &[u8]) -> Parse<BTreeMap<&[u8], Parsed>> {
        let mut map = BTreeMap::new();
        parse_example(data, &mut map)?;
        Ok(map)
    }

    #[test]
    fn decodes_packed_and_unpacked_lists() {
        // int64_list unpacked: 3, -1; float_list packed: 1.5, -2; bytes_list: "ab", "".
        let mut ints = Vec::new();
        varint(8, &mut ints); // field 1, varint
        varint(3, &mut ints);
        varint(8, &mut ints);
        varint(u64::MAX, &mut ints); // -1 as int64
        let mut floats = Vec::new();
        field(1, &[1.5f32.to_le_bytes(), (-2f32).to_le_bytes()].concat(), &mut floats);
        floats.push(1 << 3 | 5); // field 1, fixed32
        floats.extend_from_slice(&4f32.to_le_bytes());
        let mut bytes = Vec::new();
        field(1, b"ab", &mut bytes);
        field(1, b"", &mut bytes);
        let feature = |n: u64, list: &[u8]| {
            let mut f = Vec::new();
            field(n, list, &mut f);
            f
        };
        let data = example(&[
            entry("i", &feature(3, &ints)),
            entry("f", &feature(2, &floats)),
            entry("b", &feature(1, &bytes)),
        ]);
        let map = parse(&data).unwrap();
        assert_eq!(map[&b"i"[..]].ints, [3, -1]);
        assert_eq!(map[&b"f"[..]].floats, [1.5, -2.0, 4.0]);
        let b = &map[&b"b"[..]];
        assert_eq!(
            b.bytes.iter().map(|&(x, y)| &data[x..y]).collect::<Vec<_>>(),
            [&b"ab"[..], b""]
        );
    }

    #[test]
    fn follows_protobuf_merge_rules() {
        let mut list = Vec::new();
        field(1, &[varint_bytes(5), varint_bytes(6)].concat(), &mut list);
        let mut ints = Vec::new();
        field(3, &list, &mut ints);
        let mut floats = Vec::new();
        field(2, &[], &mut floats);
        // The same key twice: the last wins. A oneof set twice: the last member wins.
        let data = example(&[entry("k", &floats), entry("k", &[ints.clone(), floats].concat())]);
        let map = parse(&data).unwrap();
        assert_eq!(map[&b"k"[..]].list, Some(List::Float));
        // A list field twice in one Feature: merged.
        let data = example(&[entry("k", &[ints.clone(), ints].concat())]);
        assert_eq!(parse(&data).unwrap()[&b"k"[..]].ints, [5, 6, 5, 6]);
        // Unknown fields are skipped.
        let mut data = vec![0x10, 0x01, 0x1d, 1, 2, 3, 4];
        data.extend(example(&[entry("x", &[])]));
        assert_eq!(parse(&data).unwrap()[&b"x"[..]].list, None);
    }

    fn varint_bytes(v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        varint(v, &mut out);
        out
    }

    #[test]
    fn rejects_malformed_messages_with_positions() {
        let cases: [(&[u8], usize, &str); 6] = [
            (&[0x0a, 0x05, 0x0a], 1, "declares 5 bytes"),
            (&[0x08, 0x01], 0, "wire type 0"),
            (&[0x00], 0, "field number 0"),
            (&[0x0b], 0, "wire type 3"),
            (&[0x10, 0x80, 0x80], 1, "varint runs past"),
            (
                &[0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                1,
                "longer than 10",
            ),
        ];
        for (data, at, expect) in cases {
            let (pos, what) = parse(data).unwrap_err();
            assert_eq!(pos, at, "{data:?}: {what}");
            assert!(what.contains(expect), "{data:?}: {what}");
        }
        let mut floats = Vec::new();
        field(1, &[0; 5], &mut floats);
        let mut feature = Vec::new();
        field(2, &floats, &mut feature);
        let (_, what) = parse(&example(&[entry("f", &feature)])).unwrap_err();
        assert!(what.contains("multiple of 4"), "{what}");
        let (_, what) = parse(&example(&[entry("\u{80}", &feature)].map(|mut e| {
            // Corrupt the key's UTF-8.
            let at = e.iter().position(|&b| b == 0xc2).unwrap();
            e[at] = 0xff;
            e
        })))
        .unwrap_err();
        assert!(what.contains("UTF-8"), "{what}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        #[test]
        fn mutated_examples_never_panic(
            ints in proptest::collection::vec(any::<i64>(), 0..4),
            floats in proptest::collection::vec(any::<f32>(), 0..4),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
            cut in any::<Option<usize>>(),
        ) {
            let mut i = Vec::new();
            field(1, &ints.iter().flat_map(|&v| varint_bytes(v as u64)).collect::<Vec<_>>(), &mut i);
            let mut f = Vec::new();
            field(1, &floats.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(), &mut f);
            let mut b = Vec::new();
            field(1, b"bytes", &mut b);
            let (mut fi, mut ff, mut fb) = (Vec::new(), Vec::new(), Vec::new());
            field(3, &i, &mut fi);
            field(2, &f, &mut ff);
            field(1, &b, &mut fb);
            let mut data = example(&[entry("i", &fi), entry("f", &ff), entry("b", &fb)]);
            for (at, byte) in edits {
                let at = at % data.len();
                data[at] = byte;
            }
            if let Some(cut) = cut {
                data.truncate(cut % (data.len() + 1));
            }
            if let Ok(map) = parse(&data) {
                for parsed in map.values() {
                    for &(a, b) in &parsed.bytes {
                        prop_assert!(a <= b && b <= data.len());
                    }
                    prop_assert!(parsed.floats.len() + parsed.ints.len() <= data.len());
                }
            }
        }
    }
}
