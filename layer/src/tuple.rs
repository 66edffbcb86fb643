//! FoundationDB tuple encoding (via the pure-Rust `foundationdb-tuple` crate): keys built here
//! are byte-identical on the memory, embedded and FoundationDB backends, and order like the
//! tuples they encode.

pub use foundationdb_tuple::{
    Element, PackError, PackResult, Subspace, TupleDepth, TuplePack, TupleUnpack, Versionstamp,
    VersionstampOffset, pack, pack_into, unpack,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_fdb_tuple_spec_bytes() {
        // Examples from FoundationDB's tuple layer specification.
        assert_eq!(pack(&("hello",)), b"\x02hello\x00");
        assert_eq!(pack(&(b"foo\x00bar".to_vec(),)), b"\x01foo\x00\xffbar\x00");
        assert_eq!(pack(&(-5678i64,)), b"\x12\xe9\xd1");
        assert_eq!(pack(&(1i64, 256i64)), b"\x15\x01\x16\x01\x00");
        assert_eq!(pack(&(0i64,)), b"\x14");
    }

    #[test]
    fn order_is_preserved_and_decoding_is_exact() {
        let tuples: Vec<(String, i64)> = vec![
            ("a".into(), -1_000_000),
            ("a".into(), -1),
            ("a".into(), 0),
            ("a".into(), 7),
            ("a".into(), 1 << 40),
            ("ab".into(), i64::MIN),
            ("b".into(), 0),
        ];
        let packed: Vec<Vec<u8>> = tuples.iter().map(pack).collect();
        assert!(packed.windows(2).all(|w| w[0] < w[1]), "byte order = tuple order");
        for (t, p) in tuples.iter().zip(&packed) {
            let back: (String, i64) = unpack(p).expect("unpacks");
            assert_eq!(&back, t);
        }
    }
}
