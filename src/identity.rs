//! The identity of an output across polls: a 128-bit hash of its key (and, for an updated
//! item, its version). A leaf: the poll contract (`poll::Output::identity`) and the seen
//! sets (`seen.rs`, which says why XXH3-128) both use it.

use xxhash_rust::xxh3::xxh3_128;

/// The identity of an output across polls: a 128-bit hash of its key.
pub type OutputHash = u128;

/// XXH3-128 of an output key. Pinned by a test: changing it would make every persisted
/// watch re-emit everything it had seen.
pub fn hash_key(key: &[u8]) -> OutputHash {
    xxh3_128(key)
}

/// The identity of version `version` of the item `key` (`Output::version`): the key's
/// hash alone without a version, so that turning versions on changes nothing else; with
/// one, XXH3-128 seeded apart of the key's length, the key and the version, so that no
/// (key, version) pair hashes as a plain key, nor two pairs as each other by where the key
/// ends. Pinned by a test, as [`hash_key`] is.
pub fn hash_identity(key: &[u8], version: Option<&[u8]>) -> OutputHash {
    let Some(version) = version else {
        return hash_key(key);
    };
    /// "version1" in ASCII: the seed of versioned identities.
    const VERSIONED: u64 = 0x7665_7273_696f_6e31;
    // Streamed, not copied into one buffer first: the same hash (XXH3's streaming form
    // equals its one-shot form), without an allocation per output of every poll.
    let mut hasher = xxhash_rust::xxh3::Xxh3::with_seed(VERSIONED);
    hasher.update(&(key.len() as u64).to_le_bytes());
    hasher.update(key);
    hasher.update(version);
    hasher.digest128()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_identity_is_pinned_and_apart_from_plain_keys() {
        assert_eq!(hash_identity(b"watchbridge", None), PINNED_WATCHBRIDGE);
        let versioned = hash_identity(b"c1", Some(b"2026-12-01T00:00:00Z"));
        assert_eq!(versioned, PINNED_VERSIONED, "{versioned:#x}");
        assert_ne!(hash_identity(b"c1", Some(b"")), hash_key(b"c1"));
        assert_ne!(
            hash_identity(b"ab", Some(b"c")),
            hash_identity(b"a", Some(b"bc"))
        );
    }

    #[test]
    fn hash_key_is_pinned() {
        // XXH3-128 with the default secret and seed 0. If this fails the hash changed, and
        // every persisted watch would re-emit all the outputs it had already seen.
        assert_eq!(hash_key(b""), PINNED_EMPTY);
        assert_eq!(hash_key(b"watchbridge"), PINNED_WATCHBRIDGE);
    }

    const PINNED_VERSIONED: OutputHash = 0x7fbb_60da_2a16_5f4d_5a48_9280_ca3f_d12d;
    const PINNED_EMPTY: OutputHash = 0x99aa_06d3_0147_98d8_6001_c324_468d_497f;
    const PINNED_WATCHBRIDGE: OutputHash = 0x0f91_3d93_a8d8_5dd9_44df_fc57_4c94_44d6;
}
