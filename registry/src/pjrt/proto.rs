//! A minimal protobuf wire-format writer and reader: enough to build a `CompileOptionsProto`
//! and to read the entry signature out of an `HloModuleProto`, without protoc.

/// Appends fields in protobuf wire format.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

const VARINT: u64 = 0;
const LEN: u64 = 2;

impl Writer {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u64) {
        self.varint((u64::from(field) << 3) | wire);
    }

    /// An `int64`/`int32`/`enum` field (negative values take ten bytes, as protobuf does).
    pub(crate) fn int64(&mut self, field: u32, v: i64) {
        self.key(field, VARINT);
        self.varint(v as u64);
    }

    /// A `bool` field.
    pub(crate) fn bool(&mut self, field: u32, v: bool) {
        self.key(field, VARINT);
        self.varint(u64::from(v));
    }

    /// A `bytes`/`string` field.
    pub(crate) fn bytes(&mut self, field: u32, v: &[u8]) {
        self.key(field, LEN);
        self.varint(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    /// An embedded message.
    pub(crate) fn message(&mut self, field: u32, m: &Writer) {
        self.bytes(field, &m.buf);
    }

    /// A packed `repeated int64` field.
    pub(crate) fn packed_int64(&mut self, field: u32, values: &[i64]) {
        let mut inner = Writer::new();
        for &v in values {
            inner.varint(v as u64);
        }
        self.bytes(field, &inner.buf);
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// One field read from a message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// Iterates the fields of one message; stops (returning `None`) at malformed input.
pub(crate) struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.data.split_first()?;
            self.data = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.data.len() {
            return None;
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Some(head)
    }
}

impl<'a> Iterator for Reader<'a> {
    type Item = (u32, Value<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.data.is_empty() {
            return None;
        }
        let key = self.varint()?;
        let field = u32::try_from(key >> 3).ok()?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => Value::Fixed64(u64::from_le_bytes(self.take(8)?.try_into().ok()?)),
            2 => {
                let n = usize::try_from(self.varint()?).ok()?;
                Value::Bytes(self.take(n)?)
            }
            5 => Value::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().ok()?)),
            _ => {
                self.data = &[];
                return None;
            }
        };
        Some((field, value))
    }
}

/// Reads a `repeated int64` field value (packed or not) into `out`.
pub(crate) fn push_int64s(value: Value<'_>, out: &mut Vec<i64>) {
    match value {
        Value::Varint(v) => out.push(v as i64),
        Value::Bytes(mut packed) => {
            while !packed.is_empty() {
                let mut r = Reader { data: packed };
                match r.varint() {
                    Some(v) => out.push(v as i64),
                    None => break,
                }
                packed = r.data;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut inner = Writer::new();
        inner.packed_int64(1, &[0, 1, 300]);
        let mut w = Writer::new();
        w.int64(1, -1);
        w.bool(6, true);
        w.message(9, &inner);
        let bytes = w.finish();
        // -1 as int64 is ten bytes of varint.
        assert_eq!(
            &bytes[..11],
            &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
        let fields: Vec<_> = Reader::new(&bytes).collect();
        assert_eq!(fields[0], (1, Value::Varint(u64::MAX)));
        assert_eq!(fields[1], (6, Value::Varint(1)));
        let (9, Value::Bytes(m)) = fields[2] else { panic!("expected a message") };
        let (1, v) = Reader::new(m).next().unwrap() else { panic!("expected field 1") };
        let mut out = Vec::new();
        push_int64s(v, &mut out);
        assert_eq!(out, vec![0, 1, 300]);
    }

    #[test]
    fn malformed_input_stops() {
        assert_eq!(Reader::new(&[0x0a, 0x05, 0x01]).count(), 0);
        assert_eq!(Reader::new(&[0xff]).count(), 0);
    }
}
